"""Triggers: taking a signed request (`receive`) and running what it starts (`run`).

A request is checked in this order, and refused before anything is stored: the trigger
exists and is enabled (404), the body fits (413), the signature holds (401: counted, logged
once per interval), the route's rate (429 with Retry-After), the filters (200, skipped: nothing
runs), then the delivery is stored in one transaction (`TriggerRuns.accept`: a redelivery
finds its row and is answered 202 without running; a trigger with `max_queued` runs waiting
is answered 429) and the sender is answered 202 after the commit, before the run.

The runner takes queued rows (a conditional write each), and runs each as an agent turn in
a session of its own (`trigger:default:<name>:run-<id>`) without operator rights, with only the
tools the trigger allows, the payload fenced as data. The answer goes to the trigger's
targets through the outbox in the run's final transaction (`[SILENT]`: nowhere). A run cut
off by a crash is taken again once at the next start (or, in a cluster, once its instance is
gone); a run cut off by a drain is queued again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from agent_core.agent import Agent
from agent_core.loop import TurnProgress
from gateway.agents import ProfileAgents
from gateway.backoff import Backoff, FailureLog
from gateway.channels import Channels
from gateway.chunking import split_chunks
from gateway.contracts.config import PlatformSection
from gateway.contracts.errors import LeaseLost
from gateway.contracts.history import ChatMessage, Role
from gateway.contracts.ids import ChatId, Origin, SessionKey, session_key
from gateway.contracts.messages import TextFormat, utcnow
from gateway.cron.scheduler import SILENT
from gateway.cron.targets import HOME_SETTING, resolve
from gateway.metrics import Metrics
from gateway.profiles import DEFAULT
from gateway.redact import Redactor
from gateway.store import Store
from gateway.store.outbox import Chunk, OutboxKind, Target, enqueue
from gateway.store.store import SnapshotFactory, record_finish, record_start
from gateway.store.triggers import (
    Accepted,
    TriggerRun,
    TriggerRuns,
    TriggerStatus,
    finish_run,
    start_run,
)
from gateway.triggers import outbound
from gateway.triggers.config import TriggerConfig
from gateway.triggers.prompt import Delivery, build_prompt, parse_payload, skipped_by
from gateway.triggers.verify import Unverified, verify
from gateway.turns import FailureKind, TurnStatus, run_agent

logger = logging.getLogger(__name__)

ACCOUNT = "default"
WEBHOOK_PREFIX = "webhook:"
MAX_ATTEMPTS = 2
"""Times a run is started at most: a run cut off by a crash is run once more."""
RETENTION = timedelta(days=30)
"""Finished runs are kept this long: a delivery (or a replay) within it is recognized."""
PRUNE_INTERVAL = 3600.0
"""Seconds between two prunings of old runs."""
LOG_INTERVAL = 60.0
"""Seconds between two log lines about one trigger's refused requests."""
KEPT_HEADERS = 50
"""Headers of a request stored with it (for the filters and the template) at most."""
HEADING = "⚡ {name}"


def trigger_session_key(name: str, run_id: int) -> SessionKey:
    """The session of one run: its own (a thread of the trigger), so that no payload, which
    is untrusted, reaches a later run — not even through a compressed history's summary,
    which is not fenced."""
    return session_key(Origin.TRIGGER, ACCOUNT, name, f"run-{run_id}")


@dataclass(frozen=True, slots=True)
class Answer:
    """What the sender is told: a status, a JSON body, extra headers."""

    status: int
    body: Mapping[str, object]
    headers: Mapping[str, str] = field(default_factory=dict)


class RateLimit:
    """At most `limit` requests per `window` seconds (a sliding window; in this process)."""

    def __init__(self, limit: int, window: float, clock: Callable[[], float]) -> None:
        self.limit = limit
        self.window = window
        self.clock = clock
        self._times: deque[float] = deque()

    def take(self) -> float | None:
        """None when the request may go on (and counts it); else seconds until one may."""
        now = self.clock()
        while self._times and now - self._times[0] >= self.window:
            self._times.popleft()
        if len(self._times) >= self.limit:
            return self.window - (now - self._times[0])
        self._times.append(now)
        return None


class QuietLog:
    """Logs a kind of event at most once per `interval` seconds, counting the rest."""

    def __init__(self, interval: float, clock: Callable[[], float]) -> None:
        self.interval = interval
        self.clock = clock
        self._last: dict[str, float] = {}
        self._quiet: dict[str, int] = {}

    def warn(self, key: str, message: str) -> bool:
        """Log `message` unless `key` was logged within the interval; whether it was."""
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._quiet[key] = self._quiet.get(key, 0) + 1
            return False
        more = self._quiet.pop(key, 0)
        self._last[key] = now
        suffix = f" ({more} more since the last report)" if more else ""
        logger.warning("%s%s", message, suffix)
        return True


def split_targets(targets: Sequence[str]) -> tuple[list[str], list[str]]:
    """(chat targets, outbound webhook names) of a trigger's targets."""
    chats: list[str] = []
    hooks: list[str] = []
    for target in targets:
        if target.strip().lower().startswith(WEBHOOK_PREFIX):
            hooks.append(target.strip()[len(WEBHOOK_PREFIX) :])
        else:
            chats.append(target)
    return chats, hooks


def stored_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The request's headers kept with a delivery (lower-case names, no secrets: signature
    and token headers are left out; each cut to 1000 characters)."""
    secretish = ("signature", "token", "authorization", "cookie", "secret")
    kept: dict[str, str] = {}
    for name, value in headers.items():
        low = name.lower()
        if any(word in low for word in secretish):
            continue
        kept[low] = value[:1000]
        if len(kept) >= KEPT_HEADERS:
            break
    return kept


class TriggerService:
    """The configured triggers: `receive` for the HTTP route, `run` until cancelled."""

    def __init__(
        self,
        store: Store,
        agent: Agent | None,
        triggers: Mapping[str, TriggerConfig],
        *,
        webhooks: Sequence[str] = (),
        homes: Sequence[str] = (),
        sections: Mapping[tuple[str, str], PlatformSection] | None = None,
        channels: Channels | None = None,
        snapshot: SnapshotFactory | None = None,
        instance: str = "",
        run_timeout: float = 600.0,
        max_concurrent: int = 4,
        poll_interval: float = 5.0,
        lease_ttl: float | None = None,
        metrics: Metrics | None = None,
        redactor: Redactor | None = None,
        on_outbox: Callable[[], None] = lambda: None,
        clock: Callable[[], datetime] = utcnow,
        monotonic: Callable[[], float] = time.monotonic,
        profiles: ProfileAgents | None = None,
        profile_homes: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """`agent` None: requests are taken and stored, nothing runs here (the CLI).
        `profiles`: the agent of each trigger's `profile` (None: `agent` for all);
        `profile_homes`: the home of each profile but the default one (`homes`)."""
        self.store = store
        self.runs = TriggerRuns(store)
        self.agent = agent
        self.profiles = profiles
        self.profile_homes = {k: tuple(v) for k, v in (profile_homes or {}).items()}
        self.triggers = dict(triggers)
        self.webhooks = frozenset(webhooks)
        self.homes = tuple(homes)
        self.sections = dict(sections or {})
        self.channels = channels or Channels()
        self.snapshot = snapshot
        self.instance = instance
        self.run_timeout = run_timeout
        self.poll_interval = poll_interval
        self.lease_ttl = lease_ttl
        self.metrics = metrics
        self.redactor = redactor or Redactor()
        self.on_outbox = on_outbox
        self.clock = clock
        self.quiet = QuietLog(LOG_INTERVAL, monotonic)
        self._limits = {
            name: RateLimit(t.rate_limit, t.rate_window, monotonic)
            for name, t in self.triggers.items()
        }
        self._slots = max_concurrent
        self._wake = asyncio.Event()
        self._active: set[int] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._draining = False
        self.backoff = Backoff(initial=1.0, maximum=60.0)
        self.failures = FailureLog(logger, "looking at the triggers' runs")
        self.looks = 0
        """Looks at the queued runs completed so far (tests wait on it)."""

    # receiving ---------------------------------------------------------------------------------

    def count(self, name: str, outcome: str) -> None:
        """Count a request to `/hooks/<name>` by outcome."""
        if self.metrics is not None:
            self.metrics.trigger_requests.labels(trigger=name, outcome=outcome).inc()

    def config(self, name: str) -> TriggerConfig | None:
        """The enabled trigger of that name, or None."""
        cfg = self.triggers.get(name)
        return cfg if cfg is not None and cfg.enabled else None

    async def receive(self, name: str, headers: Mapping[str, str], body: bytes) -> Answer:
        """Check and store one request to `/hooks/<name>` (the body read within the
        trigger's `max_body_bytes`). Never raises for bad input; a database failure
        raises (the route answers 503 and the sender delivers again)."""
        cfg = self.config(name)
        if cfg is None:
            self.count("", "unknown")
            return Answer(404, {"error": "no such trigger"})
        lower = {k.lower(): v for k, v in headers.items()}
        try:
            verified = verify(cfg, lower, body, self.clock())
        except Unverified as err:
            self.count(name, "unverified")
            self.quiet.warn(
                f"unverified:{name}",
                f"trigger {name}: refused a request (401): {self.redactor(str(err))}",
            )
            return Answer(401, {"error": "missing or wrong signature"})
        wait = self._limits[name].take()
        if wait is not None:
            self.count(name, "rate_limited")
            retry = str(max(1, int(wait + 0.999)))
            self.quiet.warn(f"rate:{name}", f"trigger {name}: over its rate limit (429)")
            return Answer(
                429,
                {"error": f"too many requests; retry after {retry}s"},
                {"Retry-After": retry},
            )
        kept = stored_headers(lower)
        payload = parse_payload(body)
        reason = skipped_by(
            kept, payload, header_rules=cfg.filter.headers, field_rules=cfg.filter.fields
        )
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            self.count(name, "bad_body")
            return Answer(400, {"error": "the body is not UTF-8 text"})
        if reason is not None:
            # Recorded, so that a replay with an unsigned header changed is a duplicate.
            outcome, _ = await self.runs.accept(
                name,
                verified.delivery_id,
                event=verified.event,
                headers=kept,
                payload="",
                now=self.clock(),
                max_queued=cfg.max_queued,
                content_key=verified.content_key,
                skipped=True,
            )
            if outcome is Accepted.DUPLICATE:
                return Answer(202, {"status": "duplicate", "delivery": verified.delivery_id})
            self.count(name, "skipped")
            logger.info("trigger %s: delivery %s skipped: %s", name, verified.delivery_id, reason)
            return Answer(
                200, {"status": "skipped", "delivery": verified.delivery_id, "reason": reason}
            )
        outcome, run_id = await self.runs.accept(
            name,
            verified.delivery_id,
            event=verified.event,
            headers=kept,
            payload=text,
            now=self.clock(),
            max_queued=cfg.max_queued,
            content_key=verified.content_key,
        )
        self.count(name, str(outcome))
        if outcome is Accepted.FULL:
            self.quiet.warn(
                f"full:{name}", f"trigger {name}: {cfg.max_queued} runs wait already (429)"
            )
            return Answer(
                429,
                {"error": f"{cfg.max_queued} runs of this trigger wait already; retry later"},
                {"Retry-After": "60"},
            )
        if outcome is Accepted.DUPLICATE:
            return Answer(202, {"status": "duplicate", "delivery": verified.delivery_id})
        logger.info("trigger %s: delivery %s queued as run %s", name, verified.delivery_id, run_id)
        self.wake()
        return Answer(202, {"status": "queued", "delivery": verified.delivery_id, "run": run_id})

    # running -----------------------------------------------------------------------------------

    def wake(self) -> None:
        """A delivery was stored: look for queued runs now."""
        self._wake.set()

    @property
    def active_runs(self) -> int:
        """Runs executing here now."""
        return len(self._active)

    async def run(self) -> None:
        """Run queued deliveries until cancelled."""
        assert self.agent is not None, "a TriggerService without an agent runs nothing"
        if not self.triggers:
            return
        async with asyncio.TaskGroup() as tg:
            recovered = False
            last_recovery = 0.0
            last_prune = 0.0
            while True:
                self._wake.clear()
                try:
                    if not recovered or (
                        self.lease_ttl is not None
                        and time.monotonic() - last_recovery > self.lease_ttl / 3
                    ):
                        await self._recover(started=not recovered)
                        recovered = True
                        last_recovery = time.monotonic()
                    if time.monotonic() - last_prune > PRUNE_INTERVAL or not last_prune:
                        await self.runs.prune(self.clock() - RETENTION)
                        last_prune = time.monotonic()
                    free = self._slots - len(self._active)
                    if not self._draining and free > 0:
                        for run in await self.runs.take(self.instance, self.clock(), free):
                            self._start(tg, run)
                except Exception as err:  # the database may be away: back off
                    self.failures.failed(err)
                    self.looks += 1
                    await asyncio.sleep(self.backoff.delay(self.failures.failures - 1))
                    continue
                else:
                    self.failures.recovered()
                self.looks += 1
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.poll_interval):
                        await self._wake.wait()

    async def _recover(self, *, started: bool) -> None:
        requeued, interrupted = await self.runs.recover(
            self.instance,
            self.clock(),
            own=started,
            lease_ttl=self.lease_ttl,
            max_attempts=MAX_ATTEMPTS,
        )
        if requeued or interrupted:
            logger.warning(
                "trigger runs cut off by a stopped process: %d queued again, %d not run again",
                requeued,
                interrupted,
            )

    async def drain(self, grace: float) -> None:
        """Start no more runs; wait up to `grace` seconds for the running ones (those still
        going are queued again when cancelled, for the next start)."""
        self._draining = True
        self.wake()
        if self._active:
            logger.info("waiting up to %.0fs for %d trigger run(s)", grace, len(self._active))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self._idle.wait()

    def _start(self, tg: asyncio.TaskGroup, run: TriggerRun) -> None:
        self._active.add(run.id)
        self._idle.clear()
        tg.create_task(self._execute(run), name=f"trigger {run.trigger} run {run.id}")

    async def _execute(self, run: TriggerRun) -> None:
        try:
            await self._run(run)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.runs.requeue(run.id))
            raise
        except LeaseLost as err:
            logger.warning("trigger %s: %s", run.trigger, err)
        except Exception:  # one run must never take the runner down
            logger.exception("trigger %s: run %d failed", run.trigger, run.id)
            with contextlib.suppress(Exception):
                async with self.store.write() as conn:
                    await finish_run(
                        conn,
                        run.id,
                        status=str(TriggerStatus.FAILED),
                        error="internal error",
                        finished_at=self.clock(),
                    )
        finally:
            self._active.discard(run.id)
            if not self._active:
                self._idle.set()
            self.wake()

    async def _run(self, run: TriggerRun) -> None:
        cfg = self.triggers.get(run.trigger)
        if cfg is None:  # removed from the config since it was stored
            async with self.store.write() as conn:
                await finish_run(
                    conn,
                    run.id,
                    status=str(TriggerStatus.FAILED),
                    error="the trigger is no longer configured",
                    finished_at=self.clock(),
                )
            return
        assert self.agent is not None
        assert self.snapshot is not None
        agent = self.agent if self.profiles is None else self.profiles.get(cfg.profile)
        snapshot = self.snapshot if agent is self.agent else agent.snapshot
        delivery = Delivery(run.trigger, run.delivery_id, run.event, run.headers, run.payload)
        prompt = build_prompt(
            cfg.prompt,
            delivery,
            budget=cfg.payload_budget,
            silent=SILENT,
            payload=parse_payload(run.payload.encode()),
        )
        session = await self.store.open_session(
            trigger_session_key(run.trigger, run.id),
            platform=str(Origin.TRIGGER),
            user_id=None,
            snapshot=snapshot,
            profile=cfg.profile,
        )
        async with self.store.write() as conn:
            turn_id, _ = await record_start(conn, session.id, [ChatMessage(Role.USER, prompt)])
            await start_run(conn, run.id, session.id, turn_id)
        progress = TurnProgress()
        allowed = frozenset(cfg.tools)

        async def work() -> None:
            # Never operator rights: the payload is a stranger's words. Only the tools the
            # trigger allows, whatever the payload asks for.
            await agent.run_turn(
                session,
                progress,
                operator=False,
                turn_id=turn_id,
                others=frozenset({f"{Origin.TRIGGER}:{run.trigger}"}),
                allowed=allowed,
            )

        try:
            failure = await run_agent(
                work,
                timeout=cfg.timeout or self.run_timeout,
                what=f"trigger {run.trigger}: run {run.id}",
            )
        except asyncio.CancelledError:  # a drain: the turn ends interrupted, the run waits
            async with self.store.write() as conn:
                await record_finish(
                    conn,
                    session.id,
                    turn_id,
                    progress.result(TurnStatus.INTERRUPTED, "process stopping"),
                )
            raise
        status, error = TriggerStatus.OK, None
        if failure is not None:
            timed_out = failure.kind is FailureKind.TIMEOUT
            status = TriggerStatus.TIMED_OUT if timed_out else TriggerStatus.FAILED
            error = failure.error
        output = progress.final_text if status is TriggerStatus.OK else None
        chunks: list[Chunk] = []
        delivery_status: str | None = None
        problems: list[str] = []
        if output is not None:
            if output.strip() == SILENT:
                delivery_status = "suppressed"
            else:
                chunks, problems = await self._chunks(cfg, run, output)
                delivery_status = "failed" if problems or not chunks else "pending"
        turn_status = TurnStatus.COMPLETED if status is TriggerStatus.OK else TurnStatus.FAILED
        async with self.store.write() as conn:
            await record_finish(conn, session.id, turn_id, progress.result(turn_status, error))
            await finish_run(
                conn,
                run.id,
                status=str(status),
                error=error if not problems else "; ".join(problems),
                output=output,
                finished_at=self.clock(),
                delivery_status=delivery_status,
            )
            if chunks:
                await enqueue(conn, chunks)
        logger.info("trigger %s: run %d %s", run.trigger, run.id, status)
        if problems:
            logger.warning("trigger %s: run %d: %s", run.trigger, run.id, "; ".join(problems))
        if chunks:
            self.on_outbox()

    async def _chunks(
        self, cfg: TriggerConfig, run: TriggerRun, output: str
    ) -> tuple[list[Chunk], list[str]]:
        """The result's chunks for each target (keys per run and target, so they are
        written once), and what could not be resolved."""
        chat_targets, hooks = split_targets(cfg.targets)
        if cfg.profile == DEFAULT:
            sethome, homes = await self.store.get_setting(HOME_SETTING), self.homes
        else:  # `home` is the trigger's profile's home
            sethome, homes = None, self.profile_homes.get(cfg.profile, ())
        resolved = resolve(chat_targets, homes=homes, sethome=sethome, sections=self.sections)
        problems = list(resolved.problems)
        chunks: list[Chunk] = []
        report = f"{HEADING.format(name=run.trigger)}\n\n{output}"
        for n, target in enumerate(resolved.targets):
            limits = self.channels.limits(target.platform, target.account)
            pieces = split_chunks(report, limits.max_chunk, utf16=limits.count_utf16) or [report]
            chunks.extend(
                Chunk(
                    f"trigger:{run.id}:{n}:c{i}",
                    target,
                    piece,
                    kind=OutboxKind.REPORT,
                    chunk_index=i,
                )
                for i, piece in enumerate(pieces)
            )
        for hook in hooks:
            if hook not in self.webhooks:
                problems.append(f"webhook:{hook} is not configured (webhooks.{hook})")
                continue
            result = {
                "trigger": run.trigger,
                "delivery": run.delivery_id,
                "event": run.event,
                "run": run.id,
                "status": "ok",
                "text": output,
            }
            chunks.append(
                Chunk(
                    f"trigger:{run.id}:webhook:{hook}",
                    Target(outbound.PLATFORM, outbound.ACCOUNT, ChatId(hook)),
                    json.dumps(result, ensure_ascii=False),
                    kind=OutboxKind.REPORT,
                    format=TextFormat.PLAIN,
                )
            )
        return chunks, problems
