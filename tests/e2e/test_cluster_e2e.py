"""Three `herald run` instances on one PostgreSQL database, two of them killed with SIGKILL
while 400 messages arrive over 40 chats and a job fires every minute.

The cluster: instances `herald-a`, `-b` and `-c` with a short lease TTL, Telegram in polling
mode (one instance at a time polls, under the `adapter:telegram:default` lease) and Twilio
webhooks, which a load balancer (the test) posts to a randomly chosen instance, and to another
one when the connection fails or the instance answers 503. A fake LLM answers
`You said: <text>` after a short random delay.

The run: 20 Telegram chats and 20 SMS numbers send 10 messages each, spread over `SPAN`
seconds (an SMS number sends its next message only once the previous one was answered 200, so
each chat's message order is well defined). At a random moment the instance polling Telegram
is killed; a probe message sent right after the kill measures the takeover (another instance
holds the poller lease, and answers the probe). It is started again once the takeover is
seen. Later another instance (neither the poller nor, when it can be, the one killed first) is
killed at a random moment, and started again after one to two TTLs (its leases, lanes and
unfinished sends pass to the others meanwhile).

At the end: every message was accepted once and has exactly one outcome; every answered
message got exactly one reply on its platform (a second copy only from a chunk resent after a
crash, marked recovered, as in the single-instance crash tests); each chat's replies arrived in
the order of its messages; each slot of the job has exactly one run, and a completed run's
report reached its chat once; another instance held the poller lease within TTL + one
heartbeat, and polled Telegram within TTL + one heartbeat + one poll (plus the margins stated
at `LEASE_MARGIN` and `POLL_MARGIN`); the probe was answered (`ANSWER_BOUND`).

The TTL is short on purpose: on a loaded machine an instance's heartbeat can come late, so it
stops trusting its leases (and restarts its poller), or is counted as gone and registers
again while another takes its lease and sessions over. None of that may lose, repeat or
reorder anything, and the checks above hold whatever happened.

Every instance logs to `<tmp>/herald-?.log`; with `-s` the test prints its timeline (kills,
takeovers, restarts) and the measured times.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import re
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import RowMapping, select

from gateway.store import Store
from gateway.store.tables import inbox, job_runs, leases, outbox, sessions, turns
from tests.e2e.crash import (
    check_accepted_once,
    check_deliveries,
    check_turns_once,
    kill_leftover,
    work_left,
)
from tests.e2e.daemon import Daemon
from tests.fakes.llm import FakeLLM, Reply, last_user_text
from tests.fakes.telegram import FakeTelegramServer
from tests.fakes.telegram import Sent as TelegramSent
from tests.fakes.twilio_server import (
    DEFAULT_ACCOUNT_SID,
    DEFAULT_AUTH_TOKEN,
    HERALD_NUMBER,
    FakeTwilioServer,
)

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.timeout(900)]

INSTANCES = ("herald-a", "herald-b", "herald-c")
TTL = 4.0
"""`cluster.lease_ttl`: short, so that failovers fit in a test of a few minutes."""
HEARTBEAT = 1.0
"""`cluster.heartbeat_interval` (at most a third of the TTL, as by default)."""
SCAN = 0.5
"""`cluster.scan_interval`: how often each instance looks for orphaned sessions."""
POLL = 1.0
"""Telegram's long-poll timeout (`poll_timeout`)."""
LEASE_MARGIN = 1.0
"""Seconds allowed beyond TTL + heartbeat for another instance to hold the poller lease: its
heartbeat round (a beat and one renewal or acquisition per lease, a few short transactions)
and this test's own look at the lease table every 0.1 s."""
POLL_MARGIN = 1.5
"""Seconds allowed beyond TTL + heartbeat + one poll for the new holder to poll Telegram:
the lease margin, then starting the adapter (getMe) before its first getUpdates."""
ANSWER_BOUND = 30.0
"""Seconds after the kill within which the probe must be answered. Not a performance bound:
the probe waits behind the outage's backlog (each waiting update is stored in turn, and the
turns of those messages and of the dead instance's sessions start at once), which on the test
machine (two cores shared with other test runs, load average 7-10) took 5-17 s after the new
poller's first getUpdates. It catches a takeover that never answers."""

TOKEN = "123456:cluster-token"
TELEGRAM_LEASE = "adapter:telegram:default"
TG_CHATS = 20
SMS_CHATS = 20
PER_CHAT = 10
FIRST_TG_CHAT = 1001
PROBE_CHAT = 4001
REPORT_CHAT = 5001
"""The Telegram chat the scheduled reports go to (it sends nothing itself)."""
SPAN = 60.0
"""Seconds over which the 400 messages arrive."""
FIRST_KILL = (8.0, 20.0)
"""When (seconds into the traffic) the poller's instance is killed."""
SECOND_KILL = (30.0, 50.0)
"""When another instance is killed."""
SLOTS = 1
"""Slots of the every-minute job that must have fired before the end."""
PUBLIC_URL = "https://herald.example.test"
"""What the Twilio webhooks are signed for: the load balancer's address."""
API_KEY = "cluster-test-key"
SETTLE_TIMEOUT = 150.0
TAKEOVER_TIMEOUT = TTL + HEARTBEAT + 20.0
SLOT_RE = re.compile(r"run for (\d{4}-\d\d-\d\d \d\d:\d\d)")


def number(n: int) -> str:
    """The phone number of SMS chat `n`."""
    return f"+1555300{n:04d}"


def respond(delays: random.Random) -> Callable[[dict[str, Any]], Reply]:
    """`You said: <text>` after up to 0.15 s; a scheduled run answers `cron report <slot>`."""

    def answer(body: dict[str, Any]) -> Reply:
        text = last_user_text(body)
        slot = SLOT_RE.search(text) if text.startswith("[Scheduled job") else None
        reply = f"cron report {slot.group(1)}" if slot else f"You said: {text}"
        return Reply(text=reply, delay=delays.uniform(0.0, 0.15))

    return answer


async def until(
    check: Callable[[], Awaitable[bool]], timeout: float, what: str, interval: float = 0.1
) -> None:
    """Poll `check` until it is true; TimeoutError naming `what` after `timeout` seconds."""
    try:
        async with asyncio.timeout(timeout):
            while not await check():
                await asyncio.sleep(interval)
    except TimeoutError:
        raise TimeoutError(f"not within {timeout:.0f}s: {what}") from None


@dataclass
class Cluster:
    """The three instances and a view of the shared database."""

    store: Store
    daemons: dict[str, Daemon]
    events: list[str] = field(default_factory=list)
    """What the test did and saw, with times (printed, and shown when a check fails)."""
    began: float = field(default_factory=time.monotonic)
    traffic_began: float = 0.0
    """When the first message was due (monotonic)."""

    def note(self, what: str) -> None:
        """Record an event with its time since the start."""
        line = f"{time.monotonic() - self.began:7.2f}s {what}"
        self.events.append(line)
        print(line, flush=True)  # the run's story, shown with -s

    def up(self) -> list[str]:
        """The instances whose process runs."""
        return [
            name
            for name, d in self.daemons.items()
            if d.process is not None and d.process.returncode is None
        ]

    async def holder(self, name: str) -> str | None:
        """The owner of lease `name` while it has not expired, else None."""
        async with self.store.read() as conn:
            row = (
                await conn.execute(
                    select(leases.c.owner, leases.c.expires_at).where(leases.c.name == name)
                )
            ).first()
        if row is None or row[1] <= datetime.now(row[1].tzinfo):
            return None
        return str(row[0])

    async def holdings(self) -> dict[str, str]:
        """Lease name → owner, of the leases that have not expired."""
        async with self.store.read() as conn:
            rows = (
                await conn.execute(select(leases.c.name, leases.c.owner, leases.c.expires_at))
            ).all()
        return {str(r[0]): str(r[1]) for r in rows if r[2] > datetime.now(r[2].tzinfo)}

    async def kill(self, name: str) -> float:
        """SIGKILL instance `name`; return the monotonic time of the kill."""
        daemon = self.daemons[name]
        daemon.signal(signal.SIGKILL)
        killed = time.monotonic()
        assert await daemon.wait() == -signal.SIGKILL
        return killed

    def logs(self) -> str:
        """The tail of every instance's log, and the events."""
        parts = [f"--- {name} ---\n{d.output()[-6000:]}" for name, d in self.daemons.items()]
        return "\n".join([*parts, "--- events ---", *self.events])


class Balancer:
    """Posts each Twilio webhook to a random instance until one answers 200, as a load
    balancer with retries would (another instance after a refused or cut connection or a
    503)."""

    def __init__(self, twilio: FakeTwilioServer, cluster: Cluster, rng: random.Random) -> None:
        self.twilio = twilio
        self.cluster = cluster
        self.rng = rng
        self.retries = 0

    async def post(self, form: Sequence[tuple[str, str]]) -> str:
        """Deliver `form`; return the instance that answered 200."""
        names = list(self.cluster.daemons)
        last: str | None = None
        pause = 0.05
        async with asyncio.timeout(SETTLE_TIMEOUT):
            while True:
                name = self.rng.choice([n for n in names if n != last])
                url = f"{self.cluster.daemons[name].url}/webhooks/twilio/sms"
                with contextlib.suppress(httpx.TransportError):
                    answer = await self.twilio.post_form(
                        url, form, signed_url=f"{PUBLIC_URL}/webhooks/twilio/sms"
                    )
                    if answer.status_code == 200:
                        return name
                    assert answer.status_code == 503, (answer.status_code, answer.text)
                last = name
                self.retries += 1
                await asyncio.sleep(pause)
                pause = min(1.0, pause * 2)


@dataclass
class Traffic:
    """The messages sent, by platform message id → (chat id, text), and each chat's order."""

    injected: dict[str, dict[str, tuple[str, str]]] = field(
        default_factory=lambda: {"telegram": {}, "twilio": {}}
    )
    order: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    """Chat id → the texts of its messages in the order they were sent."""
    update_ids: list[int] = field(default_factory=list)
    sent_at: dict[str, float] = field(default_factory=dict)
    """Text of a Telegram message → when it was injected (monotonic)."""
    sms_answered: int = 0

    def telegram(self, tg: FakeTelegramServer, chat: int, text: str) -> None:
        """Inject a Telegram message from a private chat."""
        sent = tg.inject_message(chat, text, sender_id=chat)
        self.injected["telegram"][f"{sent.chat_id}:{sent.message_id}"] = (str(chat), text)
        self.order[str(chat)].append(text)
        self.update_ids.append(sent.update_id)
        self.sent_at[text] = time.monotonic()


async def test_three_instances_with_two_killed_lose_and_duplicate_nothing(
    tmp_path: Path, pg_url: str
) -> None:
    rng = random.Random(20261125)
    delays = random.Random(11)
    async with (
        Store.open(pg_url) as store,  # migrated once, before any instance starts
        FakeLLM() as llm,
        FakeTelegramServer(TOKEN) as tg,
        FakeTwilioServer() as twilio,
    ):
        llm.responder = respond(delays)
        cluster = Cluster(store, _daemons(tmp_path, pg_url, llm, tg, twilio))
        try:
            await _scenario(cluster, tg, twilio, rng)
        except BaseException:
            print(cluster.logs())  # what the instances said
            raise
        finally:
            for daemon in cluster.daemons.values():
                await kill_leftover(daemon)


def _daemons(
    tmp_path: Path, url: str, llm: FakeLLM, tg: FakeTelegramServer, twilio: FakeTwilioServer
) -> dict[str, Daemon]:
    telegram = {
        "token": TOKEN,
        "base_url": tg.base_url,
        "base_file_url": tg.base_file_url,
        "allowed_users": ["*"],
        "poll_timeout": POLL,
        "stream_edits": False,
        "min_send_interval": 0,
    }
    sms = {
        "account_sid": DEFAULT_ACCOUNT_SID,
        "auth_token": DEFAULT_AUTH_TOKEN,
        "from_number": HERALD_NUMBER,
        "base_url": twilio.base_url,
        "public_url": PUBLIC_URL,
        "allowed_numbers": ["*"],
        "min_send_interval": 0,
        "status_callbacks": False,
    }
    daemons: dict[str, Daemon] = {}
    for name in INSTANCES:
        state = tmp_path / name
        state.mkdir()
        daemons[name] = Daemon(
            state,
            {
                "instance_id": name,
                "database_url": url,
                "log_level": "INFO",
                "api": {"key": API_KEY},
                "llm": {"base_url": llm.base_url, "api_key": "k", "memory_pass": False},
                "sessions": {"max_concurrent_turns": 8, "drain_timeout": 1},
                "cluster": {
                    "lease_ttl": TTL,
                    "heartbeat_interval": HEARTBEAT,
                    "scan_interval": SCAN,
                },
                "cron": {"poll_interval": 1},
                "platforms": {"telegram": telegram, "twilio": sms},
            },
        )
    return daemons


@dataclass
class Takeover:
    """What the first kill measured."""

    lease: float = 0.0
    """Seconds from the SIGKILL until another instance held the poller lease."""
    polled: float = 0.0
    """Seconds from the SIGKILL until the next getUpdates (by the new holder)."""
    accepted: float = 0.0
    """Seconds from the SIGKILL until the probe sent just after it was stored."""
    answer: float = 0.0
    """Seconds from the SIGKILL until the probe was answered."""


async def _scenario(
    cluster: Cluster, tg: FakeTelegramServer, twilio: FakeTwilioServer, rng: random.Random
) -> None:
    for daemon in cluster.daemons.values():
        await daemon.start()
    cluster.note(f"started; leases {await cluster.holdings()}")
    job_id, anchor = await _add_job(cluster)
    cluster.note(f"job {job_id} every minute from {anchor:%H:%M:%S}")

    traffic = Traffic()
    balancer = Balancer(twilio, cluster, rng)
    plan = _plan(rng)
    cluster.traffic_began = time.monotonic()
    cluster.note("traffic begins")
    senders = [asyncio.create_task(_telegram_sender(cluster, tg, traffic, plan["telegram"]))]
    senders += [
        asyncio.create_task(
            _sms_sender(
                cluster, twilio=twilio, balancer=balancer, traffic=traffic, chat=chat, times=times
            )
        )
        for chat, times in plan["twilio"].items()
    ]
    try:
        takeover = await _kills(cluster, tg, traffic, rng)
        async with asyncio.timeout(SPAN + SETTLE_TIMEOUT):
            await asyncio.gather(*senders)
    finally:
        for task in senders:
            task.cancel()
        await asyncio.gather(*senders, return_exceptions=True)
    cluster.note(f"all sent ({balancer.retries} webhook retries); waiting for {SLOTS} slots")

    slots_due = anchor + timedelta(minutes=SLOTS)
    wait_slots = (slots_due - datetime.now(anchor.tzinfo)).total_seconds() + SETTLE_TIMEOUT
    await until(lambda: _slots_done(cluster.store, job_id), wait_slots, f"{SLOTS} job runs")
    await until(
        lambda: _settled(cluster.store, tg, traffic),
        SETTLE_TIMEOUT,
        "every message answered and every chunk sent",
        interval=0.3,
    )
    cluster.note("settled")

    await _check_messages(cluster.store, tg, twilio, traffic)
    cluster.note(_latencies(tg, traffic))
    cluster.note(await _stages(cluster.store))
    await _check_job(cluster.store, tg, job_id)
    cluster.note(
        f"takeover: poller lease after {takeover.lease:.2f}s, polling after "
        f"{takeover.polled:.2f}s, probe stored after {takeover.accepted:.2f}s and answered "
        f"after {takeover.answer:.2f}s (TTL {TTL:g}s, heartbeat {HEARTBEAT:g}s, poll {POLL:g}s)"
    )
    assert takeover.lease <= TTL + HEARTBEAT + LEASE_MARGIN, cluster.events
    assert takeover.polled <= TTL + HEARTBEAT + POLL + POLL_MARGIN, cluster.events
    assert takeover.answer <= ANSWER_BOUND, cluster.events

    # A clean stop of every instance still drains and exits 0.
    for name, daemon in cluster.daemons.items():
        assert await daemon.stop() == 0, name


async def _add_job(cluster: Cluster) -> tuple[str, datetime]:
    """An every-minute job reporting to REPORT_CHAT; its id and its anchor (creation time)."""
    first = next(iter(cluster.daemons.values()))
    async with httpx.AsyncClient(
        base_url=first.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10
    ) as api:
        created = await api.post(
            "/api/jobs",
            json={
                "name": "cluster report",
                "prompt": "report on the cluster",
                "schedule": "every 1m",
                "targets": [f"telegram:{REPORT_CHAT}"],
            },
        )
    assert created.status_code == 201, created.text
    job = created.json()
    next_run = datetime.fromisoformat(job["next_run_at"])
    return str(job["id"]), next_run - timedelta(minutes=1)


def _plan(rng: random.Random) -> dict[str, dict[int, list[float]]]:
    """Per platform and chat: the moments (seconds into the traffic) of its messages."""
    return {
        platform: {
            first + i: sorted(rng.uniform(0.0, SPAN) for _ in range(PER_CHAT)) for i in range(chats)
        }
        for platform, first, chats in (
            ("telegram", FIRST_TG_CHAT, TG_CHATS),
            ("twilio", 0, SMS_CHATS),
        )
    }


async def _at(cluster: Cluster, moment: float) -> None:
    """Sleep until `moment` seconds into the traffic."""
    await asyncio.sleep(max(0.0, cluster.traffic_began + moment - time.monotonic()))


async def _telegram_sender(
    cluster: Cluster,
    tg: FakeTelegramServer,
    traffic: Traffic,
    plan: dict[int, list[float]],
) -> None:
    moments = sorted((at, chat) for chat, times in plan.items() for at in times)
    for n, (at, chat) in enumerate(moments):
        await _at(cluster, at)
        traffic.telegram(tg, chat, f"tg {chat} m{n}")


async def _sms_sender(
    cluster: Cluster,
    *,
    twilio: FakeTwilioServer,
    balancer: Balancer,
    traffic: Traffic,
    chat: int,
    times: list[float],
) -> None:
    """One number's messages, each sent once the previous one was answered 200."""
    sender = number(chat)
    for i, at in enumerate(times):
        await _at(cluster, at)
        text = f"sms {chat} m{i}"
        form = twilio.message_form(sender, text)
        traffic.injected["twilio"][dict(form)["MessageSid"]] = (sender, text)
        traffic.order[sender].append(text)
        await balancer.post(form)
        traffic.sms_answered += 1


async def _kills(
    cluster: Cluster, tg: FakeTelegramServer, traffic: Traffic, rng: random.Random
) -> Takeover:
    """Kill the poller's instance, measure the takeover, restart it; kill another one,
    restart it after one to two TTLs."""
    takeover = Takeover()
    await _at(cluster, rng.uniform(*FIRST_KILL))
    poller = await cluster.holder(TELEGRAM_LEASE)
    assert poller is not None, "nobody polls Telegram"
    held = await cluster.holdings()
    killed = await cluster.kill(poller)
    killed_at = datetime.now(UTC) - timedelta(seconds=time.monotonic() - killed)
    traffic.telegram(tg, PROBE_CHAT, "probe after the kill")
    cluster.note(f"SIGKILL {poller} (held {sorted(k for k, v in held.items() if v == poller)})")

    async def taken() -> bool:
        owner = await cluster.holder(TELEGRAM_LEASE)
        return owner is not None and owner != poller

    await until(taken, TAKEOVER_TIMEOUT, "another instance polls Telegram", interval=0.1)
    takeover.lease = time.monotonic() - killed
    cluster.note(
        f"{await cluster.holder(TELEGRAM_LEASE)} holds the poller after {takeover.lease:.2f}s"
    )
    probe = "You said: probe after the kill"

    async def probe_answered() -> bool:
        return any(s.plain_text == probe for s in tg.sent)

    await until(probe_answered, ANSWER_BOUND, "the probe answered", interval=0.05)
    takeover.polled = (
        next(c.received_at for c in tg.calls if c.method == "getUpdates" and c.received_at > killed)
        - killed
    )
    reply = next(s for s in tg.sent if s.plain_text == probe)
    takeover.answer = reply.received_at - killed
    cluster.note(f"probe answered after {takeover.answer:.2f}s; leases {await cluster.holdings()}")
    story, accepted = await _probe_story(cluster.store, killed_at)
    cluster.note(story)
    takeover.accepted = accepted
    await asyncio.sleep(rng.uniform(0.0, 2.0))
    await cluster.daemons[poller].start()
    cluster.note(f"restarted {poller}")

    await _at(cluster, rng.uniform(*SECOND_KILL))
    current = await cluster.holder(TELEGRAM_LEASE)
    others = [n for n in cluster.up() if n != current]
    # Another life than the one killed first, when there is one: two instances die.
    victim = rng.choice([n for n in others if n != poller] or others)
    held = await cluster.holdings()
    await cluster.kill(victim)
    cluster.note(f"SIGKILL {victim} (held {sorted(k for k, v in held.items() if v == victim)})")
    await asyncio.sleep(rng.uniform(TTL, 2 * TTL))
    await cluster.daemons[victim].start()
    cluster.note(f"restarted {victim}; leases {await cluster.holdings()}")
    return takeover


async def _probe_story(store: Store, killed_at: datetime) -> tuple[str, float]:
    """When the probe was accepted, its turn ran and its reply was queued and sent, after the
    kill; and the seconds until it was accepted."""
    async with store.read() as conn:
        row = (
            await conn.execute(
                select(inbox.c.accepted_at, turns.c.started_at, turns.c.finished_at)
                .join(turns, turns.c.id == inbox.c.turn_id)
                .where(inbox.c.chat_id == str(PROBE_CHAT))
            )
        ).one()
        sent = (
            await conn.execute(
                select(outbox.c.created_at, outbox.c.sent_at, outbox.c.claimed_by).where(
                    outbox.c.chat_id == str(PROBE_CHAT)
                )
            )
        ).one()

    def after(moment: datetime | None) -> str:
        return "-" if moment is None else f"{(moment - killed_at).total_seconds():.2f}s"

    story = (
        f"probe: accepted {after(row[0])}, turn {after(row[1])} to {after(row[2])}, "
        f"queued {after(sent[0])}, sent by {sent[2]}"
    )
    return story, (row[0] - killed_at).total_seconds()


def _latencies(tg: FakeTelegramServer, traffic: Traffic) -> str:
    """Median, 95th percentile and maximum of Telegram message → reply, in seconds."""
    first: dict[str, float] = {}
    for s in tg.sent:
        first.setdefault(s.plain_text.removeprefix("You said: "), s.received_at)
    waits = sorted(first[t] - at for t, at in traffic.sent_at.items() if t in first)
    median, p95 = waits[len(waits) // 2], waits[int(len(waits) * 0.95)]
    return f"telegram message to reply: median {median:.2f}s, p95 {p95:.2f}s, max {waits[-1]:.2f}s"


async def _stages(store: Store) -> str:
    """Median seconds of each stage of the answered messages: accepted → turn started →
    turn finished (reply queued) → sent."""
    async with store.read() as conn:
        rows = (
            await conn.execute(
                select(
                    inbox.c.platform,
                    inbox.c.accepted_at,
                    turns.c.started_at,
                    turns.c.finished_at,
                    outbox.c.sent_at,
                )
                .join(turns, turns.c.id == inbox.c.turn_id)
                .join(outbox, (outbox.c.turn_id == turns.c.id) & (outbox.c.kind == "reply"))
                .where(inbox.c.outcome == "answered", outbox.c.sent_at.is_not(None))
            )
        ).all()
    parts = []
    for platform in ("telegram", "twilio"):
        mine = [r for r in rows if r[0] == platform]
        stages = [sorted((r[i + 1] - r[i]).total_seconds() for r in mine) for i in range(1, 4)]
        medians = ", ".join(f"{s[len(s) // 2]:.2f}s" for s in stages if s)
        parts.append(f"{platform} {medians}")
    return "median accepted → started → finished → sent: " + "; ".join(parts)


async def _slots_done(store: Store, job_id: str) -> bool:
    """Whether SLOTS runs of the job are decided and none waits for its delivery."""
    async with store.read() as conn:
        rows = (
            await conn.execute(
                select(job_runs.c.status, job_runs.c.delivery_status).where(
                    job_runs.c.job_id == job_id
                )
            )
        ).all()
    decided = [r for r in rows if r[0] != "running"]
    return len(decided) >= SLOTS and all(r[1] != "pending" for r in decided)


async def _settled(store: Store, tg: FakeTelegramServer, traffic: Traffic) -> bool:
    """Nothing waits on Telegram, every SMS was answered 200, and no work is left."""
    done = not tg.pending and traffic.sms_answered == len(traffic.injected["twilio"])
    return done and not await work_left(store)


async def _read(store: Store) -> tuple[list[RowMapping], dict[int, str], list[RowMapping]]:
    """The inbox rows, the status of every turn of a chat session, and every outbox chunk."""
    async with store.read() as conn:
        rows = list((await conn.execute(select(inbox).order_by(inbox.c.id))).mappings().all())
        turn_status = {
            int(r[0]): str(r[1])
            for r in (
                await conn.execute(
                    select(turns.c.id, turns.c.status)
                    .join(sessions, sessions.c.id == turns.c.session_id)
                    .where(~sessions.c.key.startswith("cron:"))
                )
            ).all()
        }
        chunks = list((await conn.execute(select(outbox).order_by(outbox.c.id))).mappings().all())
    return rows, turn_status, chunks


async def _check_messages(
    store: Store, tg: FakeTelegramServer, twilio: FakeTwilioServer, traffic: Traffic
) -> None:
    rows, turn_status, chunks = await _read(store)
    assert len(traffic.injected["telegram"]) == TG_CHATS * PER_CHAT + 1  # and the probe
    assert len(traffic.injected["twilio"]) == SMS_CHATS * PER_CHAT
    assert set(traffic.update_ids) <= set(tg.confirmed)

    # Every message was accepted once, as sent, and has exactly one outcome; no message was
    # answered by two turns, and no turn answered two messages.
    check_accepted_once(
        rows, {**traffic.injected["telegram"], **traffic.injected["twilio"]}, kills=2
    )
    answered, _ = check_turns_once(rows, turn_status)

    # Every answered message's reply reached its own chat once (twice only if its chunk was
    # resent after a crash, marked recovered), and nothing reached a chat that was not queued.
    replies = [c for c in chunks if c["kind"] != "report"]
    tg_received: defaultdict[tuple[str, str], list[TelegramSent]] = defaultdict(list)
    for s in tg.sent:
        if s.chat_id != REPORT_CHAT:
            tg_received[str(s.chat_id), s.plain_text].append(s)
    sms_received: defaultdict[tuple[str, str], list[str]] = defaultdict(list)
    for m in twilio.sent:
        sms_received[m.to, m.body].append(m.sid)
    for platform, received in (("telegram", tg_received), ("twilio", sms_received)):
        check_deliveries(
            [c for c in replies if c["platform"] == platform],
            [r for r in answered if r["platform"] == platform],
            received,
            chat=f"{platform} chat",
        )

    # Each chat got its replies in the order of its messages (a recovered resend may repeat
    # a reply, but never after a later one).
    expected = {str(r["text"]) for r in answered}
    arrived: defaultdict[str, list[str]] = defaultdict(list)
    for s in tg.sent:
        arrived[str(s.chat_id)].append(s.plain_text)
    for m in twilio.sent:
        arrived[m.to].append(m.body)
    for chat, texts in traffic.order.items():
        position = {f"You said: {t}": i for i, t in enumerate(texts) if t in expected}
        got = [position[t] for t in arrived[chat] if t in position]
        assert sorted(set(got)) == sorted(position.values()), (chat, texts, arrived[chat])
        assert got == sorted(got), f"chat {chat} got its replies out of order: {arrived[chat]}"


async def _check_job(store: Store, tg: FakeTelegramServer, job_id: str) -> None:
    async with store.read() as conn:
        runs = (
            (
                await conn.execute(
                    select(job_runs)
                    .where(job_runs.c.job_id == job_id)
                    .order_by(job_runs.c.scheduled_for)
                )
            )
            .mappings()
            .all()
        )
        reports = (
            (await conn.execute(select(outbox).where(outbox.c.kind == "report"))).mappings().all()
        )
    # One run per slot, for every minute since the job was made, none skipped.
    slots = Counter(r["scheduled_for"] for r in runs)
    assert set(slots.values()) == {1}, slots
    times = sorted(slots)
    assert len(times) >= SLOTS
    assert all(b - a == timedelta(minutes=1) for a, b in itertools.pairwise(times))
    assert all(r["trigger"] == "schedule" for r in runs)
    # A run cut off by a kill is recorded interrupted and not run again; a completed one's
    # report reached the chat once (twice only from a recovered resend).
    statuses = Counter(str(r["status"]) for r in runs)
    assert set(statuses) <= {"ok", "interrupted"}, statuses
    received = Counter(s.plain_text for s in tg.sent if s.chat_id == REPORT_CHAT)
    by_run = {int(c["job_run_id"]): c for c in reports}
    assert len(by_run) == len(reports), [dict(c) for c in reports]
    for run in runs:
        if run["status"] != "ok":
            assert int(run["id"]) not in by_run, dict(run)
            continue
        assert run["delivery_status"] == "delivered", dict(run)
        chunk = by_run[int(run["id"])]
        assert chunk["text"] == f"⏰ cluster report\n\n{run['output']}"
        assert run["output"].startswith("cron report ")
        count = received[chunk["text"]]
        assert count == 1 or (count == 2 and chunk["recovered"]), (dict(chunk), count)
    assert set(received) == {c["text"] for c in reports}
