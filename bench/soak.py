"""`make soak`: every platform at once against its fake, faults and kills, nothing lost.

One `herald run` serves every platform but Matrix (the loopback chat server, Telegram, Slack,
Discord, Email through a real Dovecot and SMTP server, Twilio SMS, Mattermost, and Signal
through a fake signal-cli daemon), each against the fake of `tests/fakes/` that keeps or
repeats what Herald did not acknowledge the way the platform does (see
tests/e2e/crash_platforms.py); Matrix needs a real Synapse and has its own SIGKILL test. While
people write, the fakes inject faults at random (429 with retry_after, 5xx, dropped and
silent connections, a skipped websocket seq, duplicate deliveries, stalled polls), the fake
LLM answers after a random delay and sometimes fails (500, 503, 429 with Retry-After), each
platform runs another busy mode, scheduled jobs fire, and the daemon is SIGKILLed at random
moments, `kills` times, then started once more, allowed to settle and stopped with SIGTERM
(exit 0 expected).

The report, per platform: messages sent and accepted (each exactly once; on Signal, a message
the fake signal-cli wrote to the stream of a process then killed may be lost instead, as
signal-cli has no redelivery: counted apart as lost with a killed stream), outcomes (each row
exactly one), replies delivered, duplicates (a text that reached a chat more often than Herald
queued it: allowed only for a chunk marked recovered; exactly by idempotency key on the
loopback platform, and on Mattermost, whose posts carry a digest of the key, where any second
post of a chunk counts), dead letters with their reasons, p50/p99 from a message's arrival at
the platform to its reply's send, for chats with no fault and for chats with one (a per-chat
429 or duplicate delivery, or an LLM error on the message), and the daemon's RSS over time.
`python -m bench.soak [--messages 5000] [--kills 20] [--seed N] [--backend sqlite|postgres]
[--out bench/results]` writes `<out>/<date>-soak.{json,md}`; exit status 1 when an invariant
failed.

Platform-wide faults (a 5xx on sends, a dropped socket) touch every chat of the platform; the
"faulted" split counts only what was aimed at one chat.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import httpx
from sqlalchemy import RowMapping, select

from gateway.store import Store
from gateway.store.tables import inbox, job_runs, outbox, turns
from tests.e2e import crash_platforms as cp
from tests.e2e.daemon import Daemon
from tests.fakes.llm import FakeLLM, Reply, last_user_text

RESULTS = Path(__file__).resolve().parent / "results"
BUSY_MODES = {
    "test": "queue",
    "telegram": "collect",
    "slack": "steer",
    "discord": "interrupt",
    "email": "queue",
    "twilio": "collect",
    "mattermost": "interrupt",
    "signal": "steer",
}
"""Each platform's default busy mode: every mode runs somewhere."""
SHARES = {
    "test": 0.22,
    "telegram": 0.18,
    "slack": 0.15,
    "twilio": 0.1,
    "discord": 0.08,
    "mattermost": 0.1,
    "signal": 0.1,
}
"""Each platform's share of the messages; email gets the rest."""
API_KEY = "soak-key"
FAULTY = 3
"""Chats whose index is a multiple of this get the per-chat faults."""


class Timed(dict[str, Any]):
    """A dict that remembers when each key was first set (wall clock, seconds)."""

    def __init__(self) -> None:
        super().__init__()
        self.at: dict[str, float] = {}

    def __setitem__(self, key: str, value: Any) -> None:
        self.at.setdefault(key, time.time())
        super().__setitem__(key, value)


@dataclass(frozen=True, slots=True)
class Plan:
    """What one soak does."""

    messages: int = 5000
    kills: int = 20
    seed: int = 20261126
    backend: str = "sqlite"
    email: bool = True
    settle_timeout: float = 900.0
    llm_error_rate: float = 0.04
    fault_rate: float = 0.5
    """Chance per platform and round of each kind of fault."""
    jobs: bool = True


@dataclass
class PlatformReport:
    """What one platform shows at the end."""

    platform: str
    busy_mode: str
    sent: int = 0
    accepted: int = 0
    lost: list[str] = field(default_factory=list)
    no_redelivery: bool = False
    """The platform never sends again what it wrote to a killed process (Signal)."""
    lost_with_killed_stream: int = 0
    """Messages the platform wrote to a process that was then killed, never stored and never
    sent again (allowed on Signal only: signal-cli has no redelivery)."""
    accepted_twice: int = 0
    open_rows: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    turns_not_completed: int = 0
    replies_queued: int = 0
    replies_delivered: int = 0
    answered_without_reply: int = 0
    recovered_resends: int = 0
    unmarked_duplicates: list[str] = field(default_factory=list)
    answered_twice: list[str] = field(default_factory=list)
    """Reply texts queued by more than one turn in one chat: a message answered twice (each
    message's text is unique and the model echoes it, so two turns replying alike ran twice)."""
    dead_letters: dict[str, int] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)
    latency_fault_free: dict[str, float | int] = field(default_factory=dict)
    latency_faulted: dict[str, float | int] = field(default_factory=dict)

    def problems(self) -> list[str]:
        """Every broken invariant, in words (empty: all held)."""
        out = []
        if self.lost:
            out.append(f"{len(self.lost)} sent but never accepted: {self.lost[:5]}")
        if self.accepted_twice:
            out.append(f"{self.accepted_twice} accepted twice")
        if self.open_rows:
            out.append(f"{self.open_rows} without an outcome")
        if self.turns_not_completed:
            out.append(f"{self.turns_not_completed} answered by a turn that did not complete")
        if self.answered_without_reply:
            out.append(f"{self.answered_without_reply} answered without a reply chunk")
        if self.unmarked_duplicates:
            out.append(f"unmarked duplicates: {self.unmarked_duplicates[:5]}")
        if self.answered_twice:
            out.append(f"answered by two turns: {self.answered_twice[:5]}")
        return [f"{self.platform}: {p}" for p in out]


def percentiles(values: list[float]) -> dict[str, float | int]:
    """count, p50 and p99 (seconds) of `values`."""
    if not values:
        return {"count": 0}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "count": len(ordered),
        "p50": round(statistics.median(ordered), 3),
        "p99": round(p99, 3),
    }


class FaultyLLM:
    """The fake LLM's responder: `You said: <text>` after 0-0.3 s, failing now and then."""

    NUMBER = re.compile(r"message (\d+)")

    def __init__(self, rng: random.Random, error_rate: float) -> None:
        self.rng = rng
        self.error_rate = error_rate
        self.failed: set[str] = set()
        self.errors = 0

    def __call__(self, body: dict[str, Any]) -> Reply:
        text = last_user_text(body)
        delay = self.rng.uniform(0.0, 0.3)
        if self.rng.random() < self.error_rate:
            self.errors += 1
            self.failed.update(self.NUMBER.findall(text))
            status = self.rng.choice([500, 503, 429])
            return Reply(status=status, retry_after=0.5 if status == 429 else None, delay=delay)
        return Reply(text=f"You said: {text}", delay=delay)


# --- the platforms --------------------------------------------------------------------------


class Driver:
    """One platform in the soak: its crash scenario (fake, bursts, settling), faults, and
    what its chats received."""

    scenario_class: ClassVar[type[cp.CrashScenario]]
    users: ClassVar[int]
    no_redelivery: ClassVar[bool] = False
    """See `allowed_lost`."""

    def __init__(self, messages: int, kills: int, seed: int, settle_timeout: float) -> None:
        attrs = {"messages": messages, "kills": kills, "settle_timeout": settle_timeout}
        cls = type(self.scenario_class.__name__, (self.scenario_class,), attrs)
        scenario = cls()
        assert isinstance(scenario, cp.CrashScenario)
        self.scenario = scenario
        self.rng = random.Random(seed)
        self.faults: Counter[str] = Counter()
        self.faulted_chats: set[str] = set()

    @property
    def name(self) -> str:
        return self.scenario.section_name

    async def start(self, stack: contextlib.AsyncExitStack) -> None:
        await self.scenario.start(stack)
        self.timed()

    def timed(self) -> None:
        """Swap the scenario's record of injected messages for one that keeps times."""
        self.scenario.injected = Timed()  # type: ignore[attr-defined]

    def injected(self) -> Mapping[str, Any]:
        return self.scenario.injected  # type: ignore[attr-defined, no-any-return]

    def sent_at(self) -> dict[str, float]:
        injected = self.injected()
        assert isinstance(injected, Timed)
        return injected.at

    def chat_of(self, key: str) -> str:
        """The chat id of an injected message."""
        return str(self.injected()[key][-2])

    def faulty(self, index: int) -> bool:
        return index % FAULTY == 0

    def fault(self, kind: str, chat: str | None = None) -> None:
        self.faults[kind] += 1
        if chat is not None:
            self.faulted_chats.add(chat)

    def inject_faults(self, rate: float) -> None:
        """Switch on some faults at random (each kind with chance `rate`)."""

    def clear_faults(self) -> None:
        """Switch every lasting fault off, so the work can settle."""

    def allowed_lost(self) -> set[str]:
        """Messages the platform may have lost without Herald at fault (none but on Signal:
        what signal-cli wrote to the stream of a killed process, which it never sends again)."""
        return set()

    def received(self) -> Iterable[tuple[str, str, bool]]:
        """(chat id, text, marked recovered by the platform or unknown) of every send."""
        return ()

    def sends_by_key(self) -> dict[str, list[bool]] | None:
        """Per idempotency key, whether each send was marked recovered, in order; None when
        the platform does not see the key (duplicates are then counted by chat and text)."""
        return None


class LoopbackDriver(Driver):
    scenario_class = cp.LoopbackCrash
    users = cp.LoopbackCrash.CHATS

    def timed(self) -> None:
        self.scenario.texts = Timed()  # type: ignore[attr-defined]

    def injected(self) -> Mapping[str, Any]:
        return self.scenario.texts  # type: ignore[attr-defined, no-any-return]

    def chat_of(self, key: str) -> str:
        number = int(str(self.injected()[key]).rsplit(" ", 1)[-1])
        return f"u{number % self.users}"

    def inject_faults(self, rate: float) -> None:
        chat = self.scenario.chat  # type: ignore[attr-defined]
        rng = self.rng
        if rng.random() < rate:
            user = f"u{rng.randrange(0, self.users, FAULTY)}"
            chat.rate_limit(user, count=rng.randint(1, 3), retry_after=rng.uniform(0.2, 1.0))
            self.fault("429", user)
        if rng.random() < rate:
            chat.fail_sends(rng.randint(1, 3), rng.choice([500, 502, 503]))
            self.fault("5xx")
        if rng.random() < rate:
            chat.fail_updates(1, 502)
            self.fault("5xx on poll")
        if rng.random() < rate:
            chat.drop_polls(1)
            self.fault("dropped poll")
        recent = [k for k in self.injected() if self.faulty(int(self.chat_of(k)[1:]))]
        if recent and rng.random() < rate:
            key = rng.choice(recent[-20:])
            chat.duplicate(key)
            self.fault("duplicate delivery", self.chat_of(key))

    def clear_faults(self) -> None:
        self.scenario.chat.clear_faults()  # type: ignore[attr-defined]

    def received(self) -> Iterable[tuple[str, str, bool]]:
        for s in self.scenario.chat.sent:  # type: ignore[attr-defined]
            yield str(s.chat_id), str(s.text), bool(s.recovered)

    def sends_by_key(self) -> dict[str, list[bool]] | None:
        keys: dict[str, list[bool]] = defaultdict(list)
        for s in self.scenario.chat.sent:  # type: ignore[attr-defined]
            keys[str(s.idempotency_key)].append(bool(s.recovered))
        return keys


class TelegramDriver(Driver):
    scenario_class = cp.TelegramCrash
    users = cp.TelegramCrash.USERS

    def inject_faults(self, rate: float) -> None:
        tg = self.scenario.tg  # type: ignore[attr-defined]
        rng = self.rng
        first = cp.TelegramCrash.FIRST_USER
        if rng.random() < rate:
            user = first + rng.randrange(0, self.users, FAULTY)
            tg.rate_limit(user, count=rng.randint(1, 2), retry_after=1)
            self.fault("429", str(user))
        if rng.random() < rate:
            tg.fail("sendMessage", rng.randint(1, 3), rng.choice([500, 502]))
            self.fault("5xx")
        if rng.random() < rate:
            tg.drop("getUpdates", 1)
            self.fault("dropped connection")
        if rng.random() < rate / 2:
            tg.stall_polls(1)
            self.fault("silent poll")
        recent = [
            (key, value)
            for key, value in self.injected().items()
            if self.faulty(int(value[1]) - first)
        ]
        if recent and rng.random() < rate:
            _, (update_id, chat, _) = rng.choice(recent[-20:])
            with contextlib.suppress(Exception):  # an update long confirmed is gone
                tg.duplicate(update_id)
                self.fault("duplicate delivery", str(chat))

    def clear_faults(self) -> None:
        self.scenario.tg.clear_faults()  # type: ignore[attr-defined]

    def received(self) -> Iterable[tuple[str, str, bool]]:
        for s in self.scenario.tg.sent:  # type: ignore[attr-defined]
            yield str(s.chat_id), str(s.plain_text), False


class SlackDriver(Driver):
    scenario_class = cp.SlackCrash
    users = cp.SlackCrash.USERS

    def inject_faults(self, rate: float) -> None:
        slack = self.scenario.slack  # type: ignore[attr-defined]
        rng = self.rng
        if rng.random() < rate:
            dm = cp.SlackCrash.dm_of(cp.SlackCrash.user_id(rng.randrange(0, self.users, FAULTY)))
            slack.rate_limit(dm, count=1, retry_after=1)
            self.fault("429", dm)
        if rng.random() < rate:
            slack.fail("chat.postMessage", rng.randint(1, 2), 500)
            self.fault("5xx")
        if rng.random() < rate / 2:
            with contextlib.suppress(Exception):
                slack.drop_socket()
                self.fault("dropped connection")
        if rng.random() < rate:
            slack.ignore_acks(1)  # the envelope comes again: a duplicate delivery
            self.fault("duplicate delivery")

    def clear_faults(self) -> None:
        self.scenario.slack.clear_faults()  # type: ignore[attr-defined]

    def received(self) -> Iterable[tuple[str, str, bool]]:
        for p in self.scenario.slack.posted:  # type: ignore[attr-defined]
            yield str(p.channel), str(p.text), False


class DiscordDriver(Driver):
    scenario_class = cp.DiscordCrash
    users = cp.DiscordCrash.USERS

    def __init__(self, messages: int, kills: int, seed: int, settle_timeout: float) -> None:
        super().__init__(messages, kills, seed, settle_timeout)
        self.silenced = False

    def inject_faults(self, rate: float) -> None:
        discord = self.scenario.discord  # type: ignore[attr-defined]
        rng = self.rng
        if rng.random() < rate:
            dm = cp.DiscordCrash.dm_id(rng.randrange(0, self.users, FAULTY))
            discord.rate_limit(dm, retry_after=0.5, times=1)
            self.fault("429", dm)
        if rng.random() < rate / 2:
            discord.drop_connections()
            self.fault("dropped connection")
        if rng.random() < rate / 3:
            discord.silence(True)  # a silent connection until the next round
            self.silenced = True
            self.fault("silent connection")

    def clear_faults(self) -> None:
        if self.silenced:
            self.scenario.discord.silence(False)  # type: ignore[attr-defined]
            self.silenced = False

    def received(self) -> Iterable[tuple[str, str, bool]]:
        for p in self.scenario.discord.posted:  # type: ignore[attr-defined]
            yield str(p.channel_id), str(p.content), False


class EmailDriver(Driver):
    scenario_class = cp.EmailCrash
    users = cp.EmailCrash.SENDERS

    def received(self) -> Iterable[tuple[str, str, bool]]:
        for r in self.scenario.smtp.received:  # type: ignore[attr-defined]
            yield str(r.rcpt_tos[0]), str(r.text), False


class TwilioDriver(Driver):
    scenario_class = cp.TwilioCrash
    users = cp.TwilioCrash.NUMBERS

    def timed(self) -> None:
        self.scenario.deliveries.injected = Timed()  # type: ignore[attr-defined]

    def injected(self) -> Mapping[str, Any]:
        return self.scenario.deliveries.injected  # type: ignore[attr-defined, no-any-return]

    def inject_faults(self, rate: float) -> None:
        twilio = self.scenario.twilio  # type: ignore[attr-defined]
        rng = self.rng
        if rng.random() < rate:
            number = cp.TwilioCrash.number(rng.randrange(0, self.users, FAULTY))
            twilio.rate_limit(1, 1.0, to=number)
            self.fault("429", number)
        if rng.random() < rate:
            twilio.fail(rng.randint(1, 2), 503)
            self.fault("5xx")

    def received(self) -> Iterable[tuple[str, str, bool]]:
        for s in self.scenario.twilio.sent:  # type: ignore[attr-defined]
            yield str(s.to), str(s.body), False


class MattermostDriver(Driver):
    scenario_class = cp.MattermostCrash
    users = cp.MattermostCrash.USERS

    def inject_faults(self, rate: float) -> None:
        mm = self.scenario.mm  # type: ignore[attr-defined]
        rng = self.rng
        if rng.random() < rate:
            dm = cp.MattermostCrash.dm_id(rng.randrange(0, self.users, FAULTY))
            mm.rate_limit(dm, reset=1, times=rng.randint(1, 2))
            self.fault("429", dm)
        if rng.random() < rate:
            mm.fail_posts(rng.choice([500, 502, 503]), times=rng.randint(1, 2))
            self.fault("5xx")
        if rng.random() < rate / 2:
            mm.drop_connections()
            self.fault("dropped connection")
        if rng.random() < rate / 2:
            mm.lose_next_event()  # a gap in the seqs: Herald reads the channels back
            self.fault("skipped seq")
        recent = [key for key, value in self.injected().items() if self.faulty(int(value[0][4:]))]
        if recent and rng.random() < rate:
            key = rng.choice(recent[-20:])
            mm.redeliver(mm.posts[key.split(":", 1)[1]])
            self.fault("duplicate delivery", self.chat_of(key))

    def clear_faults(self) -> None:
        self.scenario.mm.clear_faults()  # type: ignore[attr-defined]

    def received(self) -> Iterable[tuple[str, str, bool]]:
        for p in self.scenario.mm.posted:  # type: ignore[attr-defined]
            yield str(p["channel_id"]), str(p["message"]), False

    def sends_by_key(self) -> dict[str, list[bool]] | None:
        """By each post's `herald_send` prop (a digest of the chunk's key). The server does
        not see the recovered mark: a chunk posted twice is a duplicate (Herald looks for a
        recovered chunk among the channel's posts before posting it again)."""
        keys: dict[str, list[bool]] = defaultdict(list)
        for p in self.scenario.mm.posted:  # type: ignore[attr-defined]
            keys[str(p["props"].get("herald_send"))].append(False)
        return keys


class SignalDriver(Driver):
    scenario_class = cp.SignalCrash
    users = cp.SignalCrash.USERS
    no_redelivery = True

    def inject_faults(self, rate: float) -> None:
        signal_cli = self.scenario.signal  # type: ignore[attr-defined]
        rng = self.rng
        if rng.random() < rate:
            number = cp.SignalCrash.number(rng.randrange(0, self.users, FAULTY))
            signal_cli.rate_limit(number, retry_after=1)
            self.fault("429", number)
        if rng.random() < rate:
            signal_cli.fail(rng.randint(1, 2), rng.choice([500, 503]))
            self.fault("5xx")
        if rng.random() < rate / 2:
            signal_cli.drop_streams()
            self.fault("dropped connection")
        if rng.random() < rate:
            signal_cli.deliver_twice()  # the next message, whoever writes it
            self.fault("duplicate delivery")

    def clear_faults(self) -> None:
        self.scenario.signal.clear_faults()  # type: ignore[attr-defined]

    def allowed_lost(self) -> set[str]:
        return self.scenario.lost()  # type: ignore[attr-defined, no-any-return]

    def received(self) -> Iterable[tuple[str, str, bool]]:
        for s in self.scenario.signal.sent:  # type: ignore[attr-defined]
            yield str(s.chat), str(s.text), False


DRIVERS: dict[str, type[Driver]] = {
    "test": LoopbackDriver,
    "telegram": TelegramDriver,
    "slack": SlackDriver,
    "discord": DiscordDriver,
    "email": EmailDriver,
    "twilio": TwilioDriver,
    "mattermost": MattermostDriver,
    "signal": SignalDriver,
}


def split(plan: Plan) -> dict[str, int]:
    """Messages per platform: each a multiple of the kill rounds."""
    names = [n for n in DRIVERS if plan.email or n != "email"]
    shares = {n: SHARES.get(n, 0.0) for n in names}
    rest = 1.0 - sum(shares.values())
    if "email" in shares:
        shares["email"] = rest
    total = sum(shares.values())
    return {
        n: max(plan.kills, round(plan.messages * share / total / plan.kills) * plan.kills)
        for n, share in shares.items()
    }


# --- the run --------------------------------------------------------------------------------


class RssSampler:
    """The daemon's resident set size, sampled every second over all its starts."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.samples: list[tuple[float, float]] = []
        """(seconds since the soak started, MiB)."""

    async def run(self, daemon: Daemon) -> None:
        while True:
            process = daemon.process
            if process is not None and process.returncode is None:
                with contextlib.suppress(OSError, ValueError):
                    for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
                        if line.startswith("VmRSS:"):
                            mib = int(line.split()[1]) / 1024
                            self.samples.append((round(time.time() - self.t0, 1), round(mib, 1)))
            await asyncio.sleep(1.0)


def settings(plan: Plan, llm: FakeLLM, drivers: list[Driver], database_url: str) -> dict[str, Any]:
    """The daemon's config: every platform, each with its busy mode."""
    platforms = {}
    for d in drivers:
        section = d.scenario.section()
        section["busy_mode"] = BUSY_MODES[d.name]
        platforms[d.name] = section
    return {
        "database_url": database_url,
        "log_level": "INFO",
        "api": {"key": API_KEY},
        "llm": {"base_url": llm.base_url, "api_key": "k", "memory_pass": False},
        "sessions": {
            "max_concurrent_turns": 8,
            "drain_timeout": 2,
            "debounce_seconds": 0.3,
            "ack_interval": 5,
            "model_retry_initial": 0.3,
            "model_retry_max": 2,
        },
        "delivery": {"backoff_initial": 0.2, "backoff_max": 2, "flush_timeout": 2},
        "cron": {"poll_interval": 1},
        "platforms": platforms,
    }


def api(daemon: Daemon) -> httpx.AsyncClient:
    """A client of the daemon's API (its key is the soak's)."""
    return httpx.AsyncClient(
        base_url=daemon.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10
    )


async def add_jobs(daemon: Daemon, rng: random.Random) -> list[str]:
    """Scheduled jobs reporting to loopback chats: one every minute and one-shots soon.
    Returns their ids."""
    ids = []
    async with api(daemon) as http:
        specs = [("* * * * *", "minutely")] + [(f"in {rng.randint(2, 20)}s", "soon")] * 3
        for n, (schedule, name) in enumerate(specs):
            answer = await http.post(
                "/api/jobs",
                json={
                    "prompt": f"job {n} report",
                    "schedule": schedule,
                    "name": f"{name}-{n}",
                    "targets": [f"test:u{rng.randrange(1, 30, FAULTY)}"],
                },
            )
            if answer.status_code == 201:
                ids.append(str(answer.json()["id"]))
            else:
                print(f"job {schedule!r} refused: {answer.status_code} {answer.text}", flush=True)
    return ids


async def run_job_now(daemon: Daemon, job_id: str) -> None:
    """Ask for a run of the job now (`POST /api/jobs/{id}/run`); a refusal is printed."""
    with contextlib.suppress(httpx.HTTPError):
        async with api(daemon) as http:
            answer = await http.post(f"/api/jobs/{job_id}/run")
            if answer.status_code != 202:
                print(f"run of {job_id} refused: {answer.status_code} {answer.text}", flush=True)


async def kill_rounds(
    daemon: Daemon, drivers: list[Driver], plan: Plan, rng: random.Random, jobs: list[str]
) -> int:
    """`plan.kills` rounds: start, bursts on every platform with faults, SIGKILL at a random
    moment while the bursts run on. Returns the kills done."""
    kills = 0
    for round_ in range(plan.kills):
        await daemon.start()
        for d in drivers:
            d.inject_faults(plan.fault_rate)
        arriving = asyncio.gather(*(d.scenario.burst(round_) for d in drivers))
        try:
            if jobs:
                await run_job_now(daemon, rng.choice(jobs))
            await asyncio.sleep(rng.uniform(0.5, 4.0))
            for d in drivers:
                d.inject_faults(plan.fault_rate / 2)
            await asyncio.sleep(rng.uniform(0.0, 2.0))
            daemon.signal(signal.SIGKILL)
            assert await daemon.wait() == -signal.SIGKILL
            kills += 1
            await arriving
        finally:
            if not arriving.done():
                arriving.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await arriving
        for d in drivers:
            d.clear_faults()
        print(f"round {round_ + 1}/{plan.kills}: killed", flush=True)
    return kills


async def read_store(
    store: Store,
) -> tuple[list[RowMapping], dict[int, str], list[RowMapping]]:
    """Every inbox row, every turn's status, every outbox chunk."""
    async with store.read() as conn:
        rows = list((await conn.execute(select(inbox))).mappings().all())
        status = {
            int(r.id): str(r.status)
            for r in (await conn.execute(select(turns.c.id, turns.c.status))).all()
        }
        chunks = list((await conn.execute(select(outbox))).mappings().all())
    return rows, status, chunks


def account(
    driver: Driver,
    rows: list[RowMapping],
    turn_status: Mapping[int, str],
    chunks: list[RowMapping],
    llm_failed: set[str],
) -> PlatformReport:
    """The platform's report from what the store and its fake say."""
    name = driver.name
    report = PlatformReport(
        name, BUSY_MODES[name], faults=dict(driver.faults), no_redelivery=driver.no_redelivery
    )
    injected = driver.injected()
    mine = [r for r in rows if r["platform"] == name]
    by_id = Counter(str(r["platform_message_id"]) for r in mine)
    report.sent = len(injected)
    report.accepted = len(by_id)
    missing = set(injected) - set(by_id)
    allowed = missing & driver.allowed_lost()
    report.lost = sorted(missing - allowed)
    report.lost_with_killed_stream = len(allowed)
    report.accepted_twice = sum(1 for n in by_id.values() if n > 1)
    report.open_rows = sum(1 for r in mine if r["status"] != "done" or not r["outcome"])
    report.outcomes = dict(Counter(str(r["outcome"]) for r in mine))
    answered = [r for r in mine if r["outcome"] == "answered"]
    report.turns_not_completed = sum(
        1 for r in answered if turn_status.get(int(r["turn_id"])) != "completed"
    )
    own = [c for c in chunks if c["platform"] == name]
    replies = [c for c in own if c["kind"] == "reply"]
    report.replies_queued = len(replies)
    report.replies_delivered = sum(1 for c in replies if c["status"] == "sent")
    turns_replied = {int(c["turn_id"]) for c in replies if c["turn_id"] is not None}
    turns_by_text: defaultdict[tuple[str, str], set[int]] = defaultdict(set)
    for c in replies:
        if c["turn_id"] is not None:
            turns_by_text[str(c["chat_id"]), str(c["text"])].add(int(c["turn_id"]))
    report.answered_twice = [
        f"{chat}: {text[:40]!r} by turns {sorted(turns)}"
        for (chat, text), turns in turns_by_text.items()
        if len(turns) > 1
    ]
    report.answered_without_reply = sum(
        1 for r in answered if int(r["turn_id"]) not in turns_replied
    )
    report.dead_letters = dict(
        Counter(str(c["last_error"] or "")[:80] for c in own if c["status"] == "dead")
    )

    by_key = driver.sends_by_key()
    if by_key is not None:  # exact: the platform saw each chunk's key and recovered mark
        for key, marks in by_key.items():
            if len(marks) > 1 and all(marks[1:]):
                report.recovered_resends += len(marks) - 1
            elif len(marks) > 1:
                report.unmarked_duplicates.append(f"{key}: sent {len(marks)} times {marks}")
    else:
        _duplicates_by_text(report, own, driver.received())

    # Latency: arrival at the platform to the first send of the reply of its turn.
    first_sent: dict[int, datetime] = {}
    for c in replies:
        if c["sent_at"] is not None and c["turn_id"] is not None:
            t = int(c["turn_id"])
            if t not in first_sent or c["sent_at"] < first_sent[t]:
                first_sent[t] = c["sent_at"]
    at = driver.sent_at()
    clean: list[float] = []
    faulted: list[float] = []
    for r in mine:
        message = str(r["platform_message_id"])
        if r["turn_id"] is None or message not in at or int(r["turn_id"]) not in first_sent:
            continue
        sent = first_sent[int(r["turn_id"])]
        sent = sent if sent.tzinfo else sent.replace(tzinfo=UTC)
        seconds = sent.timestamp() - at[message]
        number = re.findall(r"message (\d+)", str(r["text"]))
        hit = str(r["chat_id"]) in driver.faulted_chats or bool(set(number) & llm_failed)
        (faulted if hit else clean).append(seconds)
    report.latency_fault_free = percentiles(clean)
    report.latency_faulted = percentiles(faulted)
    return report


def _duplicates_by_text(
    report: PlatformReport, own: list[RowMapping], received: Iterable[tuple[str, str, bool]]
) -> None:
    """A text that reached a chat more often than chunks of it were queued is a duplicate:
    allowed when one of those chunks was resent marked recovered."""
    queued: defaultdict[tuple[str, str], list[RowMapping]] = defaultdict(list)
    for c in own:
        queued[str(c["chat_id"]), str(c["text"])].append(c)
    got: Counter[tuple[str, str]] = Counter((chat, text) for chat, text, _ in received)
    for key, count in got.items():
        group = queued.get(key, [])
        surplus = count - len(group)
        if group and surplus > 0:
            if any(c["recovered"] for c in group):
                report.recovered_resends += surplus
            else:
                report.unmarked_duplicates.append(f"{key[0]}: {key[1][:40]!r} x{count}")


@dataclass
class SoakResult:
    """The whole soak's figures."""

    plan: dict[str, Any]
    started: str
    seconds: float = 0.0
    kills: int = 0
    jobs: int = 0
    job_runs: dict[str, int] = field(default_factory=dict)
    job_reports: int = 0
    llm_errors: int = 0
    exit_code: int | None = None
    platforms: list[PlatformReport] = field(default_factory=list)
    rss: list[tuple[float, float]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


async def soak(
    plan: Plan, workdir: Path, database_url: str | None = None, log: Path | None = None
) -> SoakResult:
    """Run the soak in `workdir`; the figures (their `problems` say what failed). The
    daemon's log is copied to `log` at the end, whatever happened."""
    t0 = time.time()
    result = SoakResult(asdict(plan), datetime.now(UTC).isoformat(timespec="seconds"))
    rng = random.Random(plan.seed)
    counts = split(plan)
    state = workdir / "state"
    state.mkdir(parents=True)
    url = database_url or f"sqlite+aiosqlite:///{state / 'herald.db'}"
    drivers = [
        DRIVERS[name](n, plan.kills, plan.seed + i, plan.settle_timeout)
        for i, (name, n) in enumerate(counts.items())
    ]
    responder = FaultyLLM(random.Random(plan.seed), plan.llm_error_rate)
    sampler = RssSampler(t0)
    async with contextlib.AsyncExitStack() as stack:
        llm = await stack.enter_async_context(FakeLLM())
        llm.responder = responder
        for d in drivers:
            await d.start(stack)
        # A loaded machine starts slowly (Discord reads every channel's missed messages first).
        daemon = Daemon(state, settings(plan, llm, drivers, url), start_timeout=180)
        stack.push_async_callback(_kill_leftover, daemon)
        if log is not None:
            stack.callback(lambda: log.write_text(daemon.output(), encoding="utf-8"))
        sampling = asyncio.create_task(sampler.run(daemon))
        stack.callback(sampling.cancel)
        for d in sorted(drivers, key=lambda d: d.name != "twilio"):  # twilio's url first
            await d.scenario.before(daemon)
        jobs: list[str] = []
        if plan.jobs:
            await daemon.start()
            jobs = await add_jobs(daemon, rng)
            daemon.signal(signal.SIGKILL)
            await daemon.wait()
        result.kills = await kill_rounds(daemon, drivers, plan, rng, jobs)
        await daemon.start()
        print("settling", flush=True)
        async with Store.open(url, migrate=False) as store:
            for d in drivers:
                await d.scenario.settle(store, daemon)
            await _settle_all(store, plan.settle_timeout)
            rows, turn_status, chunks = await read_store(store)
            async with store.read() as conn:
                runs = (await conn.execute(select(job_runs.c.status))).scalars().all()
        result.exit_code = await daemon.stop()
        result.seconds = round(time.time() - t0, 1)
        result.llm_errors = responder.errors
        result.jobs = len(jobs)
        result.job_runs = dict(Counter(str(status) for status in runs))
        result.job_reports = sum(
            1 for c in chunks if c["kind"] == "report" and c["status"] == "sent"
        )
        for d in drivers:
            report = account(d, rows, turn_status, chunks, responder.failed)
            result.platforms.append(report)
            result.problems.extend(report.problems())
        result.rss = sampler.samples
    if result.kills < plan.kills:
        result.problems.append(f"only {result.kills} of {plan.kills} kills")
    if result.exit_code != 0:
        result.problems.append(f"SIGTERM exit code {result.exit_code}")
    return result


async def _settle_all(store: Store, timeout: float) -> None:
    """Wait until no stored message is open, no chunk waits to be sent and no job run is
    queued or running."""
    from tests.e2e.crash import work_left

    async def runs_left() -> bool:
        async with store.read() as conn:
            running = await conn.scalar(
                select(job_runs.c.id).where(job_runs.c.status.in_(["queued", "running"])).limit(1)
            )
        return running is not None

    async with asyncio.timeout(timeout):
        while await work_left(store) or await runs_left():
            await asyncio.sleep(0.5)


async def _kill_leftover(daemon: Daemon) -> None:
    if daemon.process is not None and daemon.process.returncode is None:
        daemon.process.kill()
        await daemon.process.wait()


# --- the report -----------------------------------------------------------------------------


def markdown(result: SoakResult) -> str:
    """The report as Markdown (the README's table comes from it)."""
    plan = result.plan
    lines = [
        f"# Soak {result.started}",
        "",
        f"{sum(p.sent for p in result.platforms)} messages on {len(result.platforms)} platforms, "
        f"{result.kills} SIGKILLs then SIGTERM (exit {result.exit_code}), "
        f"{plan['backend']}, {result.seconds} s; {result.llm_errors} LLM errors; "
        f"{result.jobs} scheduled jobs, runs {result.job_runs}, {result.job_reports} reports "
        "delivered. "
        f"Result: {'PASS' if result.ok else 'FAIL'}.",
        "",
        "| platform | busy mode | sent | accepted | lost with a killed stream | outcomes | "
        "replies delivered | recovered resends | unmarked dups | answered twice | "
        "dead letters | p50/p99 s (fault-free) | p50/p99 s (faulted) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in result.platforms:
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(p.outcomes.items()))
        dead = sum(p.dead_letters.values())
        lines.append(
            f"| {p.platform} | {p.busy_mode} | {p.sent} | {p.accepted} | "
            f"{p.lost_with_killed_stream if p.no_redelivery else '–'} | {outcomes} | "
            f"{p.replies_delivered}/{p.replies_queued} | {p.recovered_resends} | "
            f"{len(p.unmarked_duplicates)} | {len(p.answered_twice)} | {dead} | "
            f"{_lat(p.latency_fault_free)} | {_lat(p.latency_faulted)} |"
        )
    if any(p.lost_with_killed_stream for p in result.platforms):
        lines += [
            "",
            "Lost with a killed stream (allowed: signal-cli has no redelivery): "
            + ", ".join(
                f"{p.platform} {p.lost_with_killed_stream}"
                for p in result.platforms
                if p.lost_with_killed_stream
            )
            + ".",
        ]
    lines += ["", "Faults injected:", ""]
    for p in result.platforms:
        faults = ", ".join(f"{k} {v}" for k, v in sorted(p.faults.items())) or "none"
        lines.append(f"- {p.platform}: {faults}")
    letters = [(p.platform, r, n) for p in result.platforms for r, n in p.dead_letters.items()]
    if letters:
        lines += ["", "Dead letters:", ""]
        lines += [f"- {name}: {n} × {reason!r}" for name, reason, n in letters]
    if result.rss:
        values = [mib for _, mib in result.rss]
        lines += [
            "",
            f"RSS: {len(values)} samples, min {min(values)} MiB, median "
            f"{statistics.median(values)} MiB, max {max(values)} MiB; over time (every ~10%):",
            "",
            "| s | MiB |",
            "| --- | --- |",
        ]
        step = max(1, len(result.rss) // 10)
        lines += [f"| {t} | {mib} |" for t, mib in result.rss[::step]]
    if result.problems:
        lines += ["", "Problems:", ""] + [f"- {p}" for p in result.problems]
    return "\n".join(lines) + "\n"


def _lat(figures: Mapping[str, float | int]) -> str:
    if not figures.get("count"):
        return "–"
    return f"{figures['p50']}/{figures['p99']} (n={figures['count']})"


def write(result: SoakResult, out: Path) -> tuple[Path, Path]:
    """`<out>/<date>-soak.json` and `.md`."""
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{result.started[:10]}-soak"
    data = asdict(result)
    data["ok"] = result.ok
    json_path, md_path = stem.with_suffix(".json"), stem.with_suffix(".md")
    json_path.write_text(json.dumps(data, indent=1, default=str) + "\n", encoding="utf-8")
    md_path.write_text(markdown(result), encoding="utf-8")
    return json_path, md_path


async def _database(backend: str) -> contextlib.AbstractAsyncContextManager[str | None]:
    if backend == "sqlite":
        return contextlib.nullcontext(None)
    from bench.procs import database

    return database("postgres", Path(tempfile.gettempdir()))


async def main_async(plan: Plan, out: Path) -> int:
    with tempfile.TemporaryDirectory(prefix="herald-soak-") as tmp:
        async with await _database(plan.backend) as url:
            out.mkdir(parents=True, exist_ok=True)
            log = out / f"{datetime.now(UTC):%Y-%m-%d}-soak-daemon.log"
            result = await soak(plan, Path(tmp), url, log)
            print(f"the daemon's log: {log}")
    json_path, md_path = write(result, out)
    print(markdown(result))
    print(f"written: {json_path}, {md_path}")
    return 0 if result.ok else 1


DEFAULT = Plan()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=DEFAULT.messages)
    parser.add_argument("--kills", type=int, default=DEFAULT.kills)
    parser.add_argument("--seed", type=int, default=DEFAULT.seed)
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--no-email", action="store_true", help="leave Email (Dovecot) out")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    plan = Plan(
        messages=args.messages,
        kills=args.kills,
        seed=args.seed,
        backend=args.backend,
        email=not args.no_email,
    )
    sys.exit(asyncio.run(main_async(plan, args.out)))


if __name__ == "__main__":
    main()
