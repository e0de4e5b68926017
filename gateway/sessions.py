"""The session manager: lanes, busy modes and commands, with every queue in SQL.

One lane per session key runs at most one turn at a time; turns of different sessions run
concurrently up to `sessions.max_concurrent_turns`. Inbound platform messages arrive through
`accept` (the adapters' InboundSink): stored in the inbox and committed before `accept`
returns, then handled by the session's lane according to its busy mode. HTTP API requests
arrive through `submit` and stream their reply back to the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Self

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_core.agent import Agent
from agent_core.llm import Usage
from agent_core.loop import TurnProgress
from gateway import inbox as inbox_sql
from gateway.access import Access, Verdict
from gateway.backoff import Backoff
from gateway.channels import Channels
from gateway.cluster.bus import LocalBus, Signal
from gateway.cluster.lanes import Claim, Lanes, LaneState, SoloLanes
from gateway.commands import HELP_TEXT, WITH_TEXT, Command, parse_command
from gateway.config import SessionsConfig
from gateway.contracts.adapter import Adapter, MessageEditor, TypingIndicator, WorkingIndicator
from gateway.contracts.config import BusyMode, GroupSessions, PlatformSection
from gateway.contracts.errors import LeaseLost, Overloaded, ShuttingDown
from gateway.contracts.history import ChatMessage, Role, SessionInfo, TurnResult
from gateway.contracts.ids import (
    AccountId,
    InboxId,
    Platform,
    PlatformMessageId,
    SessionId,
    SessionKey,
    TurnId,
    UserId,
    session_key,
)
from gateway.contracts.messages import InboundMessage, OutboundMessage, TextFormat, utcnow
from gateway.cron.service import JobService, describe
from gateway.cron.targets import HOME_SETTING as CRON_HOME_SETTING
from gateway.cron.targets import chat_target
from gateway.inbox import InboxRow, Outcome
from gateway.metrics import Metrics
from gateway.outbox import Chunk, Outbox, Target, enqueue, reply_chunks
from gateway.store import Store
from gateway.store.store import record_finish, record_start, set_setting
from gateway.store.tables import sessions as sessions_table
from gateway.turns import FailureKind, TurnFailure, TurnStatus, classify, log_failure

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 3
"""Turns started for one message before it is dropped: a message that crashes the process
every time must not crash it forever."""
OVERLOAD_RETRY_AFTER = 1.0
"""Seconds a refused API turn is told to wait (`Retry-After`)."""
HOME_SETTING = CRON_HOME_SETTING
"""The settings key `/sethome` writes: `platform:chat[:thread]`."""

ACKS = {
    BusyMode.QUEUE: "⏳ Still working on your previous message; this one is queued.",
    BusyMode.COLLECT: "⏳ Still working; I'll read this together with your other new messages.",
    BusyMode.STEER: "↪ Got it; I'll take this into account in the answer I'm writing.",
    BusyMode.INTERRUPT: "⏹ Stopping the current answer to read your new message.",
}


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """A new user message for a session, to be answered in its own turn."""

    key: SessionKey
    platform: str
    text: str
    user_id: UserId | None = None
    history: tuple[ChatMessage, ...] | None = None
    """When set, a stateless request: answer this conversation and store nothing."""
    stream: bool = True
    """Whether the caller reads tokens as they come; if not, the model is not asked to
    stream (cheaper), and the stream carries only the final event."""
    operator: bool = False
    """Whether the caller operates Herald (the API key holder): its tools may reach other
    chats."""


@dataclass(frozen=True, slots=True)
class Token:
    """A piece of the reply as the model streams it."""

    text: str


@dataclass(frozen=True, slots=True)
class Finished:
    """The end of a turn. `status`: completed, failed, interrupted or timed_out."""

    status: str
    text: str = ""
    turn_id: TurnId | None = None
    usage: Usage | None = None
    error: str | None = None
    retryable: bool = True
    """For a failed turn: whether the same request may succeed later."""
    llm_seconds: float = 0.0
    """Time the turn spent waiting on the model (the rest is Herald's own)."""


TurnEvent = Token | Finished


@dataclass
class TurnStream:
    """The events of one submitted turn, in order, ending with exactly one Finished."""

    key: SessionKey
    _queue: asyncio.Queue[TurnEvent] = field(default_factory=asyncio.Queue)
    _finished: Finished | None = None
    task: asyncio.Task[None] | None = None
    """The task running the turn (set by `submit`): cancelling it stops the turn."""

    async def token(self, text: str) -> None:
        """Deliver a streamed piece of the reply."""
        if self._finished is None and text:
            self._queue.put_nowait(Token(text))

    def finish(self, event: Finished) -> None:
        """End the stream (only the first call counts)."""
        if self._finished is None:
            self._finished = event
            self._queue.put_nowait(event)

    async def next(self) -> TurnEvent:
        """The next event; safe to cancel (for keep-alive timeouts)."""
        return await self._queue.get()

    async def __aiter__(self) -> AsyncIterator[TurnEvent]:
        while True:
            event = await self._queue.get()
            yield event
            if isinstance(event, Finished):
                return

    async def result(self) -> Finished:
        """Wait for the end of the turn, skipping streamed tokens."""
        async for event in self:
            if isinstance(event, Finished):
                return event
        raise AssertionError("a turn stream always ends with Finished")


SnapshotReader = Callable[[SessionKey, UserId | None], Awaitable[tuple[str, str]]]


def derive_session_key(message: InboundMessage, group_sessions: GroupSessions) -> SessionKey:
    """`platform:account:chat[:thread]`, plus `:u=<sender>` when the session is one person's.

    Direct chats whose chat id is not the sender's own get the suffix too, so two people's
    direct messages can never share a session, whatever the platform's chat ids look like.
    """
    thread = None if message.thread_id is None else _escape(message.thread_id)
    base = session_key(message.platform, message.account, _escape(message.chat_id), thread)
    sender = str(message.sender.id)
    personal = SessionKey(f"{base}:u={_escape(sender)}")
    if message.is_direct:
        return base if sender == message.chat_id else personal
    if group_sessions is GroupSessions.USER:
        return personal
    return base


def _escape(part: str) -> str:
    """A key part that cannot contain the separator (`%` and `:` percent-encoded)."""
    return part.replace("%", "%25").replace(":", "%3A").replace("=", "%3D")


class _Steer:
    """The steer buffer of a running turn (the loop's SteerSource)."""

    def __init__(self) -> None:
        self.waiting: list[tuple[InboxId, str]] = []
        self.taken: list[InboxId] = []

    def take(self) -> list[str]:
        texts = [text for _, text in self.waiting]
        self.taken.extend(i for i, _ in self.waiting)
        self.waiting.clear()
        return texts


@dataclass
class _Running:
    """The turn a lane is running now."""

    turn_id: TurnId
    ids: list[InboxId]
    started: float
    steer: _Steer = field(default_factory=_Steer)
    task: asyncio.Task[BaseException | None] | None = None
    cancel_reason: str | None = None
    finishing: bool = False

    def cancel(self, reason: str) -> bool:
        """Cancel the agent's work unless its result is already being stored.

        Before the work has started, it is cancelled as soon as it starts.
        """
        if self.finishing or (self.task is not None and self.task.done()):
            return False
        self.cancel_reason = self.cancel_reason or reason
        if self.task is not None:
            self.task.cancel()
        return True


@dataclass
class _Lane:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    users: int = 0
    """HTTP API turns waiting for or holding the lock."""
    worker: asyncio.Task[None] | None = None
    running: _Running | None = None
    claim: Claim | None = None
    """This instance's hold on the session (several instances share the database)."""
    claiming: asyncio.Lock = field(default_factory=asyncio.Lock)
    retries: int = 0
    """Tries in a row that failed because the model was unreachable (for the backoff)."""
    retry_in: float = 0.0
    """Seconds to wait before the next try, after such a failure; 0 when none."""
    told_outage: bool = False
    """Whether this session's sender was told of the outage that is going on."""
    stops: int = 0
    """/stop and /new requests seen; a turn that failed for an unreachable model while one
    came drops its messages instead of trying them again."""
    settling: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while a turn decides and stores its outcome, and while /stop or /new runs."""


INTERRUPTED_BY_NEWER = "interrupted by a newer message"
_STOPPING = (Command.STOP, Command.NEW, Command.RESET)
"""Commands that end what the session is doing."""


class _BatchChanged(Exception):
    """Some of a batch's messages were settled after it was read: roll back, read again."""


class SessionManager:
    """Accepts messages and turn requests and runs them in per-session lanes.

    An async context manager: entering recovers what a previous process left unfinished
    (turns cut off, messages taken but unanswered, commands not yet run); leaving drains.
    Every task is a child of the manager's TaskGroup.
    """

    def __init__(
        self,
        store: Store,
        agent: Agent,
        config: SessionsConfig,
        metrics: Metrics,
        snapshot: SnapshotReader,
        *,
        channels: Channels | None = None,
        access: Access | None = None,
        platforms: Mapping[str, PlatformSection] | None = None,
        on_outbox: Callable[[], None] | None = None,
        lanes: Lanes | None = None,
        bus: LocalBus | None = None,
        scan_interval: float = 1.0,
    ) -> None:
        self.store = store
        self.agent = agent
        self.config = config
        self.metrics = metrics
        self.snapshot = snapshot
        self.channels = channels or Channels()
        self.access = access
        self.platforms = dict(platforms or {})
        self.on_outbox = on_outbox or (lambda: None)
        self.outbox = Outbox(store)
        self.lane_store: Lanes = lanes or SoloLanes()
        self.bus = bus or LocalBus()
        self.instance = self.bus.origin
        self.scan_interval = scan_interval
        self._scan = asyncio.Event()
        self._lanes: dict[SessionKey, _Lane] = {}
        self._slots = asyncio.Semaphore(config.max_concurrent_turns)
        self._waiting = 0
        """API turns submitted that do not hold a slot yet (`sessions.max_waiting_turns`)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._tg: asyncio.TaskGroup | None = None
        self._accepting = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = asyncio.Event()
        self._draining = asyncio.Event()
        self._model_backoff = Backoff(
            initial=config.model_retry_initial, maximum=config.model_retry_max
        )
        self._last_ack: dict[SessionKey, float] = {}
        self._recovered: list[SessionKey] = []

    async def __aenter__(self) -> Self:
        self._tg = asyncio.TaskGroup()
        await self._tg.__aenter__()
        try:
            await self._recover()
        except BaseException as err:
            await self._tg.__aexit__(type(err), err, err.__traceback__)
            raise
        self._accepting = True
        for key in self._recovered:
            self._wake(key)
        if self.clustered:
            self.bus.subscribe(self._on_signal)
            self._tg.create_task(self._scanner(), name="orphan scan")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.drain(self.config.drain_timeout)
        self._closed.set()
        assert self._tg is not None
        await self._tg.__aexit__(exc_type, exc, tb)

    @property
    def clustered(self) -> bool:
        """Whether other instances may share the database (lanes are claimed in SQL)."""
        return not isinstance(self.lane_store, SoloLanes)

    async def _recover(self) -> None:
        if self.clustered:
            # Only what no live instance is doing; claiming each lane recovers it.
            self._recovered = await self.lane_store.orphans(limit=100_000, started=True)
            return
        interrupted = await self.store.interrupt_running_turns()
        if interrupted:
            logger.warning("%d turn(s) were cut off by the last stop", interrupted)
        self._recovered = await inbox_sql.Inbox(self.store).recover()
        for key in self._recovered:
            async with self.store.read() as conn:
                commands = await inbox_sql.pending(conn, key, kind="command")
            for row in commands:
                await self._run_command(row)

    @property
    def accepting(self) -> bool:
        """False once draining has begun."""
        return self._accepting

    @property
    def active_turns(self) -> int:
        """Turns submitted or queued and not yet finished (API requests and busy lanes)."""
        return len(self._tasks)

    @property
    def lanes(self) -> int:
        """Sessions with a turn running or waiting; lanes are freed when they empty."""
        return len(self._lanes)

    def running(self, key: SessionKey) -> bool:
        """Whether a turn of that session is running now."""
        lane = self._lanes.get(key)
        return lane is not None and lane.running is not None

    def steering(self, key: SessionKey) -> int:
        """Steer messages waiting for the next boundary of the turn running here."""
        lane = self._lanes.get(key)
        return 0 if lane is None or lane.running is None else len(lane.running.steer.waiting)

    # tasks -----------------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        assert self._tg is not None
        task = self._tg.create_task(coro, name=name)
        self._tasks.add(task)
        self._idle.clear()
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not self._tasks:
            self._idle.set()

    async def drain(self, grace: float) -> None:
        """Stop accepting; wait up to `grace` seconds for turns, then cancel what is left.

        Lanes start no new turn once draining: what waits stays in the inbox for the next
        start. Cancelled turns keep their partial output and are answered after a restart.
        """
        self._accepting = False
        self._draining.set()
        self._scan.set()
        for lane in self._lanes.values():
            lane.wake.set()
        if self._tasks:
            logger.info("draining %d turn(s), up to %.0fs", len(self._tasks), grace)
            try:
                async with asyncio.timeout(grace):
                    await self._idle.wait()
            except TimeoutError:
                logger.warning("cancelling %d turn(s) after the drain timeout", len(self._tasks))
                for task in list(self._tasks):
                    task.cancel()
                await self._idle.wait()

    # inbound ---------------------------------------------------------------------------------

    async def accept(self, message: InboundMessage) -> None:
        """Store an inbound message durably, then act on it. Raises ShuttingDown.

        Returns once the message is committed (the adapter acknowledges it after that); a
        message already stored (same platform, account and platform message id) is ignored.
        """
        if not self._accepting:
            # Draining: hold the adapter here, unacknowledged, until it is stopped (it keeps
            # sending meanwhile); the platform redelivers the message to the next process.
            await self._closed.wait()
            raise ShuttingDown("Herald is shutting down; the platform will redeliver")
        platform = str(message.platform)
        section = self.platforms.get(platform)
        groups = section.group_sessions if section else GroupSessions.CHAT
        key = derive_session_key(message, groups)
        target = Target(platform, message.account, message.chat_id, message.thread_id)
        parsed = parse_command(message.text)
        notices: list[Chunk] = []
        steer_text: str | None = None
        interrupt = False
        elsewhere = False
        async with self.store.write() as conn:
            decision = await self.access.decide(conn, message) if self.access else None
            if decision is not None and decision.verdict is not Verdict.ALLOW:
                row_id = await inbox_sql.insert(
                    conn,
                    message,
                    key=key,
                    user_id=None,
                    text=message.text[:500],
                    outcome=Outcome.REJECTED,
                    detail=decision.detail,
                )
                if row_id is not None and decision.verdict is Verdict.PAIR and decision.reply:
                    notices.append(Chunk(f"pair:{row_id}", target, decision.reply))
                    await enqueue(conn, notices)
                outcome: Outcome | None = Outcome.REJECTED if row_id else None
                command_id = None
            elif parsed is not None and (parsed.command not in WITH_TEXT or not parsed.arg):
                command_id = await inbox_sql.insert(
                    conn, message, key=key, user_id=None, kind="command"
                )
                outcome, row_id = None, command_id
            else:
                command_id = None
                text = message.text if parsed is None else parsed.arg
                forced = None if parsed is None else BusyMode(str(parsed.command))
                mode = forced or await self._mode(conn, key, section)
                lane = self._lanes.get(key)
                remote = LaneState(None, False)
                if lane is None or lane.claim is None:
                    remote = await self.lane_store.state(conn, key)
                elsewhere = remote.owner is not None and remote.owner != self.instance
                busy = (lane is not None and lane.running is not None) or (
                    elsewhere and remote.running
                )
                row_id = await inbox_sql.insert(
                    conn,
                    message,
                    key=key,
                    user_id=None,
                    text=text,
                    priority=1 if busy and mode is BusyMode.INTERRUPT else 0,
                    steer=busy and mode is BusyMode.STEER,
                )
                outcome = None
                if row_id is not None and busy:
                    waiting = await inbox_sql.count_waiting(conn, key)
                    if (
                        mode in (BusyMode.QUEUE, BusyMode.COLLECT)
                        and waiting > self.config.queue_cap
                    ):
                        await inbox_sql.settle(conn, [row_id], Outcome.DROPPED, detail="queue full")
                        outcome = Outcome.DROPPED
                        notices.append(
                            Chunk(
                                f"drop:{row_id}",
                                target,
                                f"⚠ Not queued: {waiting - 1} messages are already waiting. "
                                "Send it again later, or /stop to clear the queue.",
                            )
                        )
                    elif not (lane is not None and lane.told_outage) and self._may_ack(key):
                        # During a model outage the busy turn is a retry and the sender was
                        # already told that their messages wait: no "still working" on top.
                        notices.append(Chunk(f"ack:{row_id}", target, ACKS[mode]))
                    steer_text = text if mode is BusyMode.STEER else None
                    interrupt = mode is BusyMode.INTERRUPT
                    if notices:
                        await enqueue(conn, notices)
                if row_id is not None and outcome is None and elsewhere:
                    # Another instance runs this session: tell it (sent when this commits).
                    action = "interrupt" if interrupt else "steer" if steer_text else "wake"
                    if interrupt and remote.turn_id is not None:
                        await self.lane_store.request_cancel(
                            conn, key, remote.turn_id, INTERRUPTED_BY_NEWER
                        )
                    await self.bus.publish(conn, Signal(action, key))
        if row_id is None:
            logger.debug("duplicate delivery of %s ignored", message.platform_message_id)
            return
        self.metrics.inbound.labels(platform=platform).inc()
        if outcome is not None:
            self.metrics.outcomes.labels(outcome=str(outcome)).inc()
        if notices:
            self.on_outbox()
        if outcome is not None:
            return
        if command_id is not None:
            row = await inbox_sql.Inbox(self.store).get(command_id)
            assert row is not None
            await self._run_command(row)
            return
        if elsewhere:
            return
        lane = self._lanes.get(key)
        running = lane.running if lane else None
        if running is not None and row_id not in running.ids:
            if steer_text is not None:
                running.steer.waiting.append((row_id, steer_text))
            if interrupt:
                running.cancel(INTERRUPTED_BY_NEWER)
        self._wake(key)

    async def settle(self, message: InboundMessage, detail: str) -> None:
        """Store a message its adapter handled by itself (an opt-out keyword): outcome
        `dropped` with `detail`, no turn. A message already stored is ignored. Raises
        ShuttingDown while draining."""
        if not self._accepting:
            raise ShuttingDown("Herald is shutting down; the platform will redeliver")
        platform = str(message.platform)
        section = self.platforms.get(platform)
        key = derive_session_key(message, section.group_sessions if section else GroupSessions.CHAT)
        async with self.store.write() as conn:
            row_id = await inbox_sql.insert(
                conn, message, key=key, user_id=None, outcome=Outcome.DROPPED, detail=detail
            )
        if row_id is not None:
            self.metrics.inbound.labels(platform=platform).inc()
            self.metrics.outcomes.labels(outcome=str(Outcome.DROPPED)).inc()

    async def delivery_report(
        self,
        platform: Platform,
        account: AccountId,
        message: PlatformMessageId,
        status: str,
        error: str | None = None,
    ) -> bool:
        """Record a platform's later report on a sent chunk (see `Outbox.delivery_report`)."""
        return await self.outbox.delivery_report(platform, account, message, status, error)

    async def may_fetch(self, message: InboundMessage) -> bool:
        """Whether `message`'s sender is allowed, so its files may be downloaded (reads only;
        `accept` still decides)."""
        return self.access is None or await self.access.permits(message)

    def _may_ack(self, key: SessionKey) -> bool:
        now = time.monotonic()
        interval = self.config.ack_interval
        if now - self._last_ack.get(key, -math.inf) < interval:
            return False
        if len(self._last_ack) > 10_000:  # bounded, whatever the number of sessions
            self._last_ack = {k: t for k, t in self._last_ack.items() if now - t < interval}
        self._last_ack[key] = now
        return True

    async def _mode(
        self, conn: AsyncConnection, key: SessionKey, section: PlatformSection | None
    ) -> BusyMode:
        value = await conn.scalar(
            select(sessions_table.c.busy_mode)
            .where(sessions_table.c.key == key)
            .order_by(sessions_table.c.epoch.desc())
            .limit(1)
        )
        if value:
            return BusyMode(value)
        if section is not None and section.busy_mode is not None:
            return section.busy_mode
        return self.config.busy_mode

    # lanes -----------------------------------------------------------------------------------

    def _wake(self, key: SessionKey) -> None:
        if not self._accepting:
            return
        lane = self._lanes.setdefault(key, _Lane())
        lane.wake.set()
        if lane.worker is None:
            lane.worker = self._spawn(self._lane_worker(key, lane), f"lane {key}")

    def _release(self, key: SessionKey, lane: _Lane) -> None:
        if lane.users == 0 and lane.worker is None and self._lanes.get(key) is lane:
            del self._lanes[key]

    async def _lane_worker(self, key: SessionKey, lane: _Lane) -> None:
        failures = 0
        try:
            while self._accepting:
                try:
                    if lane.claim is None and await self._claim(key, lane) is None:
                        break  # another instance runs this session; it was told
                    lane.wake.clear()
                    batch = await self._next_batch(key, lane)
                    if batch is None:
                        if lane.wake.is_set():
                            continue
                        if await self._unclaim(lane, worker=True) and lane.wake.is_set():
                            continue  # something arrived while letting go
                        break
                    if batch:
                        await self._run_batch(key, lane, batch)
                    failures = 0
                except LeaseLost:
                    raise
                except Exception:
                    # The database may be away for a moment: try again, slower each time.
                    if failures == 0:
                        logger.exception("lane %s failed; trying again with backoff", key)
                    else:
                        logger.debug("lane %s failed again (%d)", key, failures, exc_info=True)
                    lane.retry_in = max(lane.retry_in, self._model_backoff.delay(failures))
                    failures += 1
                if lane.retry_in > 0:
                    await self._pause(lane.retry_in)
                    lane.retry_in = 0.0
        except LeaseLost as err:
            lane.claim = None
            logger.warning("%s; this instance stops working on it", err)
        finally:
            lane.worker = None
            self._release(key, lane)

    async def _pause(self, seconds: float) -> None:
        """Wait `seconds`, cut short when draining begins."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._draining.wait()

    async def _claim(self, key: SessionKey, lane: _Lane) -> Claim | None:
        """Hold the session's lane (once per lane, whoever asks); None while another
        instance holds it. A fresh claim in a cluster first runs the commands a stopped
        instance left unanswered."""
        async with lane.claiming:
            if lane.claim is not None:
                return lane.claim
            claim = await self.lane_store.claim(key)
            if claim is None:
                return None
            lane.claim = claim
        if self.clustered:
            async with self.store.read() as conn:
                commands = await inbox_sql.pending(conn, key, kind="command")
            for row in commands:
                await self._run_command(row)
        return claim

    async def _unclaim(self, lane: _Lane, *, worker: bool = False) -> bool:
        """Let the session's lane go when nothing here uses it any more; True if it did."""
        async with lane.claiming:
            if lane.claim is None or lane.users > 0 or (lane.worker is not None and not worker):
                return False
            claim, lane.claim = lane.claim, None
        await self.lane_store.release(claim)
        return True

    # signals from other instances --------------------------------------------------------

    def _on_signal(self, signal: Signal) -> None:
        """A hint from another instance (see `gateway.cluster.bus`)."""
        if signal.action == "resync":
            self._scan.set()
            assert self._tg is not None
            self._tg.create_task(self._missed_signals(), name="missed signals")
            return
        if not signal.key or not self._accepting:
            return
        key = SessionKey(signal.key)
        lane = self._lanes.get(key)
        running = lane.running if lane is not None else None
        if signal.action == "cancel" and lane is not None:
            lane.stops += 1
        if signal.action == "cancel" and running is not None:
            running.cancel(signal.reason or "cancelled")
        elif signal.action == "interrupt" and running is not None:
            running.cancel(INTERRUPTED_BY_NEWER)
        elif signal.action == "steer" and running is not None:
            assert self._tg is not None
            self._tg.create_task(self._pick_up_steer(key, running), name=f"steer {key}")
            return
        if signal.action != "cancel" and lane is not None and lane.claim is not None:
            self._wake(key)  # a lane free here is found by the scan, if nobody else runs it

    async def _missed_signals(self) -> None:
        """The signal connection came back: what was asked of the turns running here while
        it was away (cancels are stored on the lane, steer texts in the inbox)."""
        for key, lane in list(self._lanes.items()):
            running, claim = lane.running, lane.claim
            if running is None or claim is None:
                continue
            try:
                reason = await self.lane_store.cancel_requested(claim)
            except Exception as err:  # the next resync looks again
                logger.warning("could not read cancel requests for %s: %s", key, err)
                continue
            if reason is not None:
                logger.info("%s: a cancel came while signals were away (%s)", key, reason)
                running.cancel(reason)
            else:
                await self._pick_up_steer(key, running)

    async def _pick_up_steer(self, key: SessionKey, running: _Running) -> None:
        """Steer rows another instance stored for the turn running here."""
        try:
            async with self.store.read() as conn:
                rows = await inbox_sql.pending(conn, key)
        except Exception as err:  # the row stays pending and becomes the next turn
            logger.warning("could not read steer messages for %s: %s", key, err)
            return
        known = {*running.ids, *running.steer.taken, *(i for i, _ in running.steer.waiting)}
        for row in rows:
            if row.steer and row.id not in known:
                running.steer.waiting.append((row.id, row.text))
        self._wake(key)

    async def _scanner(self) -> None:
        """Take up work no live instance is doing, every `scan_interval` seconds (and at once
        after the signal connection came back)."""
        while self._accepting:
            try:
                async with asyncio.timeout(self.scan_interval):
                    await self._scan.wait()
            except TimeoutError:
                pass
            self._scan.clear()
            if not self.accepting:  # drain began while waiting
                return
            try:
                orphans = await self.lane_store.orphans()
            except Exception as err:  # the database may be away for a moment
                logger.warning("looking for orphaned sessions failed: %s", err)
                continue
            for key in orphans:
                lane = self._lanes.get(key)
                # A lane in use here is not an orphan, whatever SQL says about its owner.
                if lane is None or (lane.worker is None and lane.claim is None and not lane.users):
                    self._wake(key)

    async def _elsewhere(self, key: SessionKey) -> LaneState | None:
        """The lane of `key` when another instance holds it."""
        if not self.clustered:
            return None
        async with self.store.read() as conn:
            state = await self.lane_store.state(conn, key)
        return state if state.owner not in (None, self.instance) else None

    async def _tell_owner(self, key: SessionKey, action: str, reason: str) -> None:
        """Signal the instance running `key`, when that is another one."""
        if not self.clustered:
            return
        async with self.store.write() as conn:
            state = await self.lane_store.state(conn, key)
            if state.owner is not None and state.owner != self.instance:
                if action == "cancel" and state.turn_id is not None:
                    await self.lane_store.request_cancel(conn, key, state.turn_id, reason)
                await self.bus.publish(conn, Signal(action, key, reason))

    async def _next_batch(self, key: SessionKey, lane: _Lane) -> list[InboxRow] | None:
        """The rows of the next turn; [] to look again; None when nothing waits."""
        async with self.store.read() as conn:
            rows = await inbox_sql.pending(conn, key)
            section = self.platforms.get(rows[0].platform) if rows else None
            mode = await self._mode(conn, key, section) if rows else BusyMode.QUEUE
        if not rows:
            return None
        if rows[0].priority > 0 or mode in (BusyMode.QUEUE, BusyMode.INTERRUPT):
            return rows[:1]
        if mode is BusyMode.COLLECT and self.config.debounce_seconds > 0:
            newest = max(r.accepted_at for r in rows)
            quiet = (utcnow() - newest).total_seconds()
            if quiet < self.config.debounce_seconds:
                try:
                    async with asyncio.timeout(self.config.debounce_seconds - quiet):
                        await lane.wake.wait()
                except TimeoutError:
                    pass
                return []
        return rows[: self.config.queue_cap + 1]

    async def _run_batch(self, key: SessionKey, lane: _Lane, batch: list[InboxRow]) -> None:
        head = batch[0]
        target = Target(head.platform, head.account, head.chat_id, head.thread_id)
        over = [r for r in batch if r.attempts >= MAX_ATTEMPTS]
        if over:
            async with self.store.write() as conn:
                await inbox_sql.settle(
                    conn,
                    [r.id for r in over],
                    Outcome.DROPPED,
                    detail=f"the process stopped {MAX_ATTEMPTS} times while answering it",
                )
                await enqueue(
                    conn,
                    [
                        Chunk(
                            f"poison:{r.id}",
                            target,
                            "⚠ I could not answer one of your messages: answering it failed "
                            "several times. Please rephrase it or send it again later.",
                        )
                        for r in over
                    ],
                )
            self.metrics.outcomes.labels(outcome=str(Outcome.DROPPED)).inc(len(over))
            self.on_outbox()
            batch = [r for r in batch if r.attempts < MAX_ATTEMPTS]
            if not batch:
                return
            head = batch[0]
        user_id = await self._owner(head)
        exchange: tuple[SessionInfo, list[ChatMessage]] | None = None
        async with lane.lock:
            self.metrics.waiting_turns.inc()
            try:
                await self._slots.acquire()
            finally:
                self.metrics.waiting_turns.dec()
            try:
                exchange = await self._inbox_turn(key, lane, batch, target, user_id)
            finally:
                self._slots.release()
        if exchange is not None:
            await self.agent.memory_pass(*exchange)

    async def _inbox_turn(
        self,
        key: SessionKey,
        lane: _Lane,
        batch: list[InboxRow],
        target: Target,
        user_id: UserId | None,
    ) -> tuple[SessionInfo, list[ChatMessage]] | None:
        head = batch[0]
        session = await self.store.open_session(
            key, platform=head.platform, user_id=user_id, snapshot=self.snapshot
        )
        new_messages = [_user_message(r) for r in batch if r.turn_id is None]
        claim = lane.claim
        assert claim is not None
        # Busy from here on, so a /stop or an interrupt during the commit below is not lost.
        stops = lane.stops
        running = _Running(TurnId(0), [r.id for r in batch], time.monotonic())
        lane.running = running
        try:
            async with self.store.write() as conn:
                # The lane first: a takeover locks the lane row, then the inbox rows.
                await self.lane_store.check(conn, claim, None)
                turn_id, _ = await record_start(conn, session.id, new_messages)
                if await inbox_sql.take(conn, [r.id for r in batch], turn_id) < len(batch):
                    raise _BatchChanged
                await self.lane_store.check(conn, claim, turn_id)
            running.turn_id = turn_id
            progress = TurnProgress()
            preview = await self._preview(target, turn_id)
        except _BatchChanged:
            lane.running = None  # settled meanwhile (a /stop): nothing was started
            return None
        except BaseException:
            lane.running = None
            raise
        assert self._tg is not None
        self.metrics.running_turns.inc()
        started = time.monotonic()
        # The turn may reach other chats only when everyone it answers operates Herald.
        operator = self.access is not None and all(
            self.access.is_operator(r.platform, r.sender_id) for r in batch
        )
        running.task = self._tg.create_task(
            self._agent_turn(session, progress, running, preview, operator=operator),
            name=f"turn {key}",
        )
        if running.cancel_reason is not None:
            running.task.cancel()
        answering = batch[-1].platform_message_id if batch else None
        typing = self._tg.create_task(self._typing(target, answering), name=f"typing {key}")
        try:
            await asyncio.wait({running.task})
        except asyncio.CancelledError:
            # Draining: checkpoint the partial output; the messages are answered after a restart.
            running.task.cancel()
            await asyncio.wait({running.task})
            lane.running = None
            try:
                async with self.store.write() as conn:
                    await self.lane_store.check(conn, claim, None)
                    cut = progress.result("interrupted", "process stopping")
                    await record_finish(conn, session.id, turn_id, cut)
                    await inbox_sql.requeue(
                        conn, [*running.ids, *running.steer.taken], turn_id=turn_id
                    )
            except LeaseLost:
                pass  # the instance that took the session over has recovered it already
            self._count("interrupted", started)
            raise
        finally:
            lane.running = None
            typing.cancel()
            if preview is not None:
                await preview.close()
        await lane.settling.acquire()
        try:
            task = running.task
            ids = running.ids
            steered = running.steer.taken
            leftover = [i for i, _ in running.steer.waiting]
            notices: list[Chunk] = []
            outcomes: list[tuple[list[InboxId], Outcome, str | None]]
            postponed: list[InboxId] = []
            err = None if task.cancelled() else task.result()
            if task.cancelled():
                reason = running.cancel_reason or "cancelled"
                status = TurnStatus.INTERRUPTED
                result = progress.result(status, reason)
                outcomes = [(ids + steered, Outcome.DROPPED, reason)]
            elif err is not None:
                failure = classify(err, self.config.turn_timeout)
                log_failure(failure, err, f"turn {turn_id} of {key}")
                self.metrics.model_failures.labels(kind=str(failure.kind)).inc()
                status = failure.status
                result = progress.result(TurnStatus.FAILED, failure.error)
                waited = (utcnow() - min(r.accepted_at for r in batch)).total_seconds()
                if failure.transient and lane.stops != stops:
                    # A /stop or /new came while this try was ending: no further try.
                    outcomes = [
                        (ids + steered, Outcome.DROPPED, "stopped while the model was away")
                    ]
                    lane.retries, lane.told_outage = 0, False
                elif failure.transient and waited < self.config.model_outage_max_wait:
                    # The messages wait for the model to come back; their sender hears it once.
                    outcomes = []
                    postponed = ids + steered
                    lane.retry_in = self._model_backoff.delay(lane.retries)
                    lane.retries += 1
                    if not lane.told_outage:
                        lane.told_outage = True
                        notices.append(
                            Chunk(
                                f"outage:{ids[0]}",
                                target,
                                "⏳ I can't reach my language model right now. Your message is "
                                "saved; I'll answer as soon as the model is back.",
                                session_id=session.id,
                                turn_id=turn_id,
                            )
                        )
                else:
                    if failure.transient:
                        error = (
                            f"the model was unreachable for {waited / 60:.0f} min ({failure.error})"
                        )
                        text = (
                            "⚠ I couldn't answer your message: my language model has been "
                            f"unreachable for {waited / 60:.0f} minutes. "
                            "Please send it again later."
                        )
                    else:
                        error = failure.error
                        text = _failure_notice(failure)
                    outcomes = [(ids + steered, Outcome.DROPPED, error)]
                    lane.retries, lane.told_outage = 0, False
                    notices.append(
                        Chunk(
                            f"fail:{turn_id}", target, text, session_id=session.id, turn_id=turn_id
                        )
                    )
            else:
                status = TurnStatus.COMPLETED
                lane.retries, lane.told_outage = 0, False
                result = progress.result(status)
                outcomes = [
                    (ids[:1], Outcome.ANSWERED, None),
                    (ids[1:], Outcome.MERGED, None),
                    (steered, Outcome.STEERED, None),
                ]
                limits = self.channels.limits(target.platform, target.account)
                notices.extend(
                    reply_chunks(
                        target,
                        progress.final_text,
                        limits,
                        session_id=session.id,
                        turn_id=turn_id,
                        inbox_id=ids[0],
                        reply_to=None if head.is_direct else head.platform_message_id,
                        edit_of=None if preview is None else preview.message_id,
                        not_before=None if preview is None else preview.next_edit_at(),
                    )
                )
            try:
                async with self.store.write() as conn:
                    await self.lane_store.check(conn, claim, None)
                    await self._finish(
                        conn,
                        session_id=session.id,
                        turn_id=turn_id,
                        result=result,
                        outcomes=outcomes,
                        leftover=leftover,
                        notices=notices,
                    )
                    if postponed:
                        await inbox_sql.requeue(conn, postponed, turn_id=turn_id, refund=True)
            except LeaseLost:
                self._count("interrupted", started)
                raise
        finally:
            lane.settling.release()
        self._count(status, started)
        if notices:
            self.on_outbox()
        if status != TurnStatus.COMPLETED:
            return None
        return session, [*new_messages, *progress.messages]

    async def _finish(
        self,
        conn: AsyncConnection,
        *,
        session_id: SessionId,
        turn_id: TurnId,
        result: TurnResult,
        outcomes: list[tuple[list[InboxId], Outcome, str | None]],
        leftover: list[InboxId],
        notices: list[Chunk],
    ) -> None:
        """A turn's end in the caller's transaction: its result, each message's outcome, the
        steer messages it did not read back to the queue, and its reply chunks."""
        await record_finish(conn, session_id, turn_id, result)
        for row_ids, outcome, detail in outcomes:
            n = await inbox_sql.settle(conn, row_ids, outcome, turn_id=turn_id, detail=detail)
            if n:
                self.metrics.outcomes.labels(outcome=str(outcome)).inc(n)
        await inbox_sql.requeue(conn, leftover)
        if notices:
            await enqueue(conn, notices)

    async def _agent_turn(
        self,
        session: SessionInfo,
        progress: TurnProgress,
        running: _Running,
        preview: _Preview | None,
        *,
        operator: bool = False,
    ) -> BaseException | None:
        """Run the agent; return what it raised (None when it answered).

        A child of the manager's TaskGroup, so nothing but cancellation may leave it: an
        exception escaping here would stop every lane and the daemon with them.
        """
        try:
            async with asyncio.timeout(self.config.turn_timeout):
                await self.agent.run_turn(
                    session,
                    progress,
                    on_token=None if preview is None else preview.token,
                    steer=running.steer,
                    operator=operator,
                )
        except Exception as err:
            running.finishing = True
            return err
        running.finishing = True
        return None

    async def _typing(self, target: Target, answering: PlatformMessageId | None) -> None:
        """Show that a turn is running until cancelled: "typing…" every few seconds, and a
        mark on the message being answered where the platform has one. Best effort."""
        adapter: object = self.channels.adapter(target.platform, target.account)
        marked = False
        if isinstance(adapter, WorkingIndicator) and answering is not None:
            try:
                await adapter.working(target.chat_id, answering)
                marked = True
            except Exception as err:
                logger.debug("working indicator failed: %s", err)
        try:
            while isinstance(adapter, TypingIndicator):
                try:
                    await adapter.typing(target.chat_id, target.thread_id)
                except Exception as err:  # a failed indicator changes nothing
                    logger.debug("typing indicator failed: %s", err)
                    break
                await asyncio.sleep(4.0)
            await asyncio.Event().wait()  # until the turn ends
        finally:
            if marked:
                assert isinstance(adapter, WorkingIndicator)
                assert answering is not None
                try:
                    async with asyncio.timeout(5.0):
                        await adapter.done(target.chat_id, answering)
                except Exception as err:
                    logger.debug("working indicator not removed: %s", err)

    async def _preview(self, target: Target, turn_id: TurnId) -> _Preview | None:
        section = self.platforms.get(target.platform)
        live = self.channels.adapter(target.platform, target.account)
        editor: object = live
        if (
            live is None
            or not getattr(section, "stream_edits", False)
            or not isinstance(editor, MessageEditor)
        ):
            return None
        # A preview is sent directly; never let it overtake earlier chunks still queued.
        if await self.outbox.unsent(target.chat):
            return None
        assert self._tg is not None
        limits = self.channels.limits(target.platform, target.account)
        return _Preview(
            live,
            editor,
            target,
            turn_id,
            max_chars=limits.max_chunk,
            interval=limits.min_edit_interval,
            tg=self._tg,
        )

    # commands --------------------------------------------------------------------------------

    async def _run_command(self, row: InboxRow) -> None:
        """Act on a command row and answer it; the row's outcome and the answer in one commit."""
        if self.clustered:
            # Another instance may be recovering the same row: whoever takes it runs it.
            async with self.store.write() as conn:
                if not await inbox_sql.take_command(conn, row.id, self.instance):
                    return
        lane = self._lanes.get(row.session_key)
        parsed = parse_command(row.text)
        if lane is None or parsed is None or parsed.command not in _STOPPING:
            await self._command(row, lane)
            return
        # Not while a turn of this lane is settling its outcome: either that turn sees this
        # stop (and drops what it would have tried again), or its rows are back in the queue
        # before this command clears it.
        async with lane.settling:
            lane.stops += 1
            await self._command(row, lane)

    async def _command(self, row: InboxRow, lane: _Lane | None) -> None:
        parsed = parse_command(row.text)
        key = row.session_key
        target = Target(row.platform, row.account, row.chat_id, row.thread_id)
        running = lane.running if lane else None
        cancel: str | None = None
        outcome, detail = Outcome.ANSWERED, None
        section = self.platforms.get(row.platform)
        if (
            parsed is None or parsed.command is Command.HELP
        ):  # cannot happen for stored command rows; answer rather than crash
            reply = HELP_TEXT
        elif parsed.command in WITH_TEXT:
            reply = f"Usage: /{parsed.command} TEXT"
        elif parsed.command is Command.STOP:
            async with self.store.read() as conn:
                waiting = await inbox_sql.pending(conn, key)
            cancel = "stopped by /stop"
            dropped = [r.id for r in waiting]
            async with self.store.write() as conn:
                n = await inbox_sql.settle(
                    conn, dropped, Outcome.DROPPED, detail="cleared by /stop", only_pending=True
                )
            if n:
                self.metrics.outcomes.labels(outcome=str(Outcome.DROPPED)).inc(n)
            remote = None if running is not None else await self._elsewhere(key)
            busy = (
                running is not None
                or (lane is not None and lane.worker is not None and n == 0)
                or (remote is not None and remote.running)
            )
            stopped = "Stopped." if busy else "Nothing was running."
            reply = f"⏹ {stopped} Cleared {n} queued message{'s' if n != 1 else ''}."
        elif parsed.command in (Command.NEW, Command.RESET):
            cancel = "the session was reset with /new"
            old = await self.store.get_session(key)
            await self.store.open_session(
                key,
                platform=row.platform,
                user_id=await self._owner(row) if old is None else old.user_id,
                snapshot=self.snapshot,
                new_epoch=True,
            )
            if old is not None and old.busy_mode:
                await self.store.set_busy_mode(key, old.busy_mode)
            async with self.store.write() as conn:
                # What still waits is answered in the new conversation, so it goes there too.
                await inbox_sql.restore_pending(conn, key)
            reply = "✨ Started a new conversation. Earlier messages stay searchable."
        elif parsed.command is Command.MODE:
            async with self.store.read() as conn:
                current = await self._mode(conn, key, section)
            if not parsed.arg:
                reply = f"Busy mode: {current}. Choose with /mode queue|collect|steer|interrupt."
            else:
                try:
                    mode = BusyMode(parsed.arg.strip().lower())
                except ValueError:
                    reply = (
                        f"Unknown mode {parsed.arg!r}. "
                        "Use one of: queue, collect, steer, interrupt."
                    )
                else:
                    if await self.store.get_session(key) is None:
                        await self.store.open_session(
                            key,
                            platform=row.platform,
                            user_id=await self._owner(row),
                            snapshot=self.snapshot,
                        )
                    await self.store.set_busy_mode(key, str(mode))
                    reply = f"Busy mode set to {mode}."
        elif parsed.command is Command.STATUS:
            reply = await self._status(key, section, running)
        elif parsed.command is Command.CRON:
            reply = await self._jobs(row)
        elif self.access is not None and not self.access.is_operator(row.platform, row.sender_id):
            # The home channel receives the operator's reports: nobody else may redirect them.
            outcome, detail = Outcome.REJECTED, "/sethome: not an operator"
            reply = (
                "🚫 Only Herald's operator can choose where scheduled reports go. "
                f"(An operator lists {row.platform}:{row.sender_id} in access.operators.)"
            )
        else:  # SETHOME by an operator
            home = ":".join(p for p in (row.platform, row.chat_id, row.thread_id) if p)
            async with self.store.write() as conn:
                await set_setting(conn, HOME_SETTING, home)
            reply = f"🏠 Scheduled reports will come to this chat ({home})."
        async with self.store.write() as conn:
            await inbox_sql.settle(
                conn,
                [row.id],
                outcome,
                detail=detail or (f"/{parsed.command}" if parsed else "command"),
            )
            await enqueue(conn, [Chunk(f"cmd:{row.id}", target, reply, format=TextFormat.PLAIN)])
        self.metrics.outcomes.labels(outcome=str(outcome)).inc()
        self.on_outbox()
        if cancel is not None and running is not None:
            running.cancel(cancel)
        elif cancel is not None:
            await self._tell_owner(key, "cancel", cancel)

    async def _jobs(self, row: InboxRow) -> str:
        """`/cron`: the scheduled jobs of the sender and those that report to this chat
        (by name, or as the home channel that `/sethome` set)."""
        service = JobService(self.store, configured=self.platforms)
        user_id = await self.store.resolve_user(row.platform, row.sender_id, row.sender_name)
        here = chat_target(row.platform, row.chat_id, row.thread_id)
        sethome = await self.store.get_setting(HOME_SETTING)
        reporting = {j.id for j in await service.delivering_to(here, sethome=sethome)}
        found = [
            j
            for j in await service.find()
            if (user_id is not None and j.user_id == user_id) or j.id in reporting
        ]
        if not found:
            return "No scheduled jobs here. Ask me to schedule one, e.g. “every weekday at 9…”."
        lines = [f"Scheduled jobs ({len(found)}):"]
        lines.extend(f"• {describe(j, service.next_run(j))}" for j in found)
        return "\n".join(lines)

    async def _owner(self, row: InboxRow) -> UserId | None:
        """The user a session of this row belongs to (None for a shared group session)."""
        if row.is_direct or ":u=" in row.session_key:
            return await self.store.resolve_user(row.platform, row.sender_id, row.sender_name)
        return None

    async def _status(
        self, key: SessionKey, section: PlatformSection | None, running: _Running | None
    ) -> str:
        session = await self.store.get_session(key)
        async with self.store.read() as conn:
            mode = await self._mode(conn, key, section)
            waiting = await inbox_sql.count_waiting(conn, key)
        lines = [f"Session {key}"]
        if session is not None:
            lines.append(f"Conversation #{session.epoch + 1}, {session.message_count} messages")
        lines.append(f"Busy mode: {mode}")
        remote = None if running is not None else await self._elsewhere(key)
        if running is not None:
            lines.append(f"Answering now (for {time.monotonic() - running.started:.0f}s)")
        elif remote is not None and remote.running:
            lines.append(f"Answering now (on instance {remote.owner})")
        else:
            lines.append("Idle")
        lines.append(f"Waiting: {waiting}")
        return "\n".join(lines)

    # HTTP API turns --------------------------------------------------------------------------

    def admit(self) -> None:
        """Raise Overloaded (and count it) when `submit` would refuse a turn now."""
        if self._waiting >= self.config.max_waiting_turns:
            self.metrics.refused_turns.inc()
            raise Overloaded(
                OVERLOAD_RETRY_AFTER,
                f"{self._waiting} turns are waiting already; retry in a moment",
            )

    def submit(self, request: TurnRequest) -> TurnStream:
        """Start a turn; its events arrive on the returned stream.

        Raises ShuttingDown, or Overloaded when `sessions.max_waiting_turns` turns wait
        for a slot or their session already.
        """
        if not self._accepting or self._tg is None:
            raise ShuttingDown("Herald is shutting down; retry shortly")
        self.admit()
        stream = TurnStream(request.key)
        self._waiting += 1
        stream.task = self._spawn(self._run(request, stream), f"turn {request.key}")
        return stream

    async def _run(self, request: TurnRequest, stream: TurnStream) -> None:
        if request.history is not None:
            await self._stateless(request.history, stream, tokens=request.stream)
            return
        lane = self._lanes.setdefault(request.key, _Lane())
        lane.users += 1
        self.metrics.waiting_turns.inc()
        waiting = True
        try:
            # Lane first, then a global slot: a busy session never holds slots idle.
            async with lane.lock:
                await self._hold(request.key, lane)
                async with self._slots:
                    self.metrics.waiting_turns.dec()
                    waiting = False
                    self._waiting -= 1
                    outcome = await self._turn(request, stream)
            if outcome is not None:
                await self.agent.memory_pass(*outcome)
        except asyncio.CancelledError:
            stream.finish(Finished("interrupted", error="Herald is shutting down"))
            raise
        except LeaseLost as err:
            lane.claim = None
            logger.warning("turn for %s not run: %s", request.key, err)
            stream.finish(Finished("failed", error=f"{err}; retry shortly"))
        except Exception as err:  # a turn must never take the manager's TaskGroup down
            logger.exception("turn for %s failed", request.key)
            stream.finish(Finished("failed", error=f"internal error: {type(err).__name__}"))
        finally:
            if waiting:
                self.metrics.waiting_turns.dec()
                self._waiting -= 1
            lane.users -= 1
            if lane.claim is not None and lane.users == 0 and lane.worker is None:
                try:
                    await self._unclaim(lane)
                except Exception as err:  # the lane of a gone claim is taken over anyway
                    logger.warning("could not release session %s: %s", request.key, err)
            self._release(request.key, lane)

    async def _hold(self, key: SessionKey, lane: _Lane) -> None:
        """Claim the session's lane for an API turn, waiting while another instance runs
        one of its turns (up to `sessions.turn_timeout`)."""
        delay = 0.05
        try:
            async with asyncio.timeout(self.config.turn_timeout):
                while await self._claim(key, lane) is None:
                    await asyncio.sleep(delay)
                    delay = min(1.0, delay * 2)
        except TimeoutError:
            raise LeaseLost(
                f"session {key} stayed busy on another instance for {self.config.turn_timeout}s"
            ) from None

    async def _turn(
        self, request: TurnRequest, stream: TurnStream
    ) -> tuple[SessionInfo, list[ChatMessage]] | None:
        session = await self.store.open_session(
            request.key,
            platform=request.platform,
            user_id=request.user_id,
            snapshot=self.snapshot,
        )
        user_message = ChatMessage(Role.USER, request.text)
        claim = self._lanes[request.key].claim
        assert claim is not None
        async with self.store.write() as conn:
            # Fenced like an inbox turn: an instance whose claim was taken over writes nothing.
            await self.lane_store.check(conn, claim, None)
            turn_id, _ = await record_start(conn, session.id, [user_message])
            await self.lane_store.check(conn, claim, turn_id)
        progress = TurnProgress()
        started = time.monotonic()
        self.metrics.running_turns.inc()
        status, error, retryable = TurnStatus.COMPLETED, None, True
        try:
            async with asyncio.timeout(self.config.turn_timeout):
                on_token = stream.token if request.stream else None
                await self.agent.run_turn(
                    session, progress, on_token=on_token, operator=request.operator
                )
        except Exception as err:  # one turn's failure is its caller's answer, nothing more
            failure = classify(err, self.config.turn_timeout)
            log_failure(failure, err, f"API turn {turn_id} of {request.key}")
            self.metrics.model_failures.labels(kind=str(failure.kind)).inc()
            status, error, retryable = failure.status, failure.error, failure.transient
        except asyncio.CancelledError:
            # Keep the partial output, marked interrupted; then let the cancellation go on.
            result = progress.result("interrupted", "cancelled")
            with contextlib.suppress(LeaseLost):
                await self._finish_api_turn(claim, session.id, turn_id, result)
            self._count("interrupted", started)
            stream.finish(Finished("interrupted", turn_id=turn_id, error="interrupted"))
            raise
        result = progress.result(
            TurnStatus.COMPLETED if status == TurnStatus.COMPLETED else TurnStatus.FAILED,
            error=error,
        )
        try:
            await self._finish_api_turn(claim, session.id, turn_id, result)
        except LeaseLost as err:
            self._count("interrupted", started)
            stream.finish(Finished("interrupted", turn_id=turn_id, error=str(err)))
            return None
        self._count(status, started)
        stream.finish(
            Finished(
                status,
                text=progress.final_text,
                turn_id=turn_id,
                usage=progress.usage,
                error=error,
                retryable=retryable,
                llm_seconds=progress.llm_seconds,
            )
        )
        if status != "completed":
            return None
        return session, [user_message, *progress.messages]

    async def _finish_api_turn(
        self, claim: Claim, session_id: SessionId, turn_id: TurnId, result: TurnResult
    ) -> None:
        """Store an API turn's result unless its lane was taken over (LeaseLost)."""
        async with self.store.write() as conn:
            await self.lane_store.check(conn, claim, None)
            await record_finish(conn, session_id, turn_id, result)

    async def _stateless(
        self, history: tuple[ChatMessage, ...], stream: TurnStream, *, tokens: bool
    ) -> None:
        started = time.monotonic()
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1  # it holds a slot now (or stopped waiting for one)
        try:
            self.metrics.running_turns.inc()
            try:
                on_token = stream.token if tokens else None
                progress = await self.agent.answer_stateless(history, on_token=on_token)
            except Exception as err:
                failure = classify(err, self.config.turn_timeout)
                log_failure(failure, err, "stateless answer")
                self.metrics.model_failures.labels(kind=str(failure.kind)).inc()
                self._count(failure.status, started)
                stream.finish(
                    Finished(failure.status, error=failure.error, retryable=failure.transient)
                )
                return
            except BaseException:
                self._count("interrupted", started)
                raise
        finally:
            self._slots.release()
        self._count("completed", started)
        stream.finish(
            Finished(
                "completed",
                text=progress.final_text,
                usage=progress.usage,
                llm_seconds=progress.llm_seconds,
            )
        )

    def _count(self, status: str, started: float) -> None:
        self.metrics.running_turns.dec()
        self.metrics.turns.labels(status=status).inc()
        self.metrics.turn_seconds.observe(time.monotonic() - started)


def _failure_notice(failure: TurnFailure) -> str:
    """What the sender of a message dropped for `failure` is told."""
    if failure.kind is FailureKind.REJECTED:
        return (
            "⚠ I couldn't answer that: my language model refused the request "
            "(the operator can see why in Herald's log)."
        )
    if failure.kind is FailureKind.TIMEOUT:
        return f"⚠ I couldn't answer that: {failure.error}. Please try again, perhaps shorter."
    return "⚠ I couldn't answer that: something went wrong on my side. Please send it again later."


def _user_message(row: InboxRow) -> ChatMessage:
    """How an inbound message appears in history: in groups, with who wrote it."""
    if row.is_direct:
        return ChatMessage(Role.USER, row.content)
    name = row.sender_name or row.sender_id
    return ChatMessage(Role.USER, f"[{name}] {row.content}")


class _Preview:
    """Streams a turn's text into one message, edited at most every `interval` seconds.

    Best effort: any failure just stops the preview. The final text is never sent by the
    preview; the turn's first reply chunk replaces it (`edit_of`) through the outbox.
    """

    def __init__(
        self,
        sender: Adapter,
        editor: MessageEditor,
        target: Target,
        turn_id: TurnId,
        *,
        max_chars: int,
        interval: float,
        tg: asyncio.TaskGroup,
    ) -> None:
        self.sender = sender
        self.editor = editor
        self.target = target
        self.turn_id = turn_id
        self.max_chars = max(16, max_chars)
        self.interval = interval
        self.message_id: PlatformMessageId | None = None
        self._last_edit = -math.inf
        self._parts: list[str] = []
        self._changed = asyncio.Event()
        self._closing = asyncio.Event()
        self._task = tg.create_task(self._run(), name=f"preview {turn_id}")

    async def token(self, text: str) -> None:
        """Add streamed text."""
        self._parts.append(text)
        self._changed.set()

    def next_edit_at(self) -> datetime:
        """The earliest moment the preview may be edited again (the platform's edit rate)."""
        wait = max(0.0, self._last_edit + self.interval - time.monotonic())
        return utcnow() + timedelta(seconds=wait)

    async def close(self) -> None:
        """Stop editing; an edit in flight completes first (so `message_id` is known)."""
        self._closing.set()
        self._changed.set()
        try:
            async with asyncio.timeout(10):
                await asyncio.shield(self._task)
        except TimeoutError:
            self._task.cancel()
        except Exception as err:
            logger.debug("preview ended with %s", err)

    async def _run(self) -> None:
        try:
            while True:
                await self._changed.wait()
                if self._closing.is_set():
                    return
                self._changed.clear()
                text = "".join(self._parts).strip()
                if not text:
                    continue
                if len(text) > self.max_chars - 2:
                    text = text[: self.max_chars - 2]
                message = OutboundMessage(
                    platform=Platform(self.target.platform),
                    account=self.target.account,
                    chat_id=self.target.chat_id,
                    thread_id=self.target.thread_id,
                    text=text + " …",
                    idempotency_key=f"preview:{self.turn_id}",
                    format=TextFormat.PLAIN,
                )
                if self.message_id is None:
                    receipt = await self.sender.send(message)
                    self.message_id = receipt.platform_message_id
                    if self.message_id is None:
                        return
                else:
                    await self.editor.edit(self.message_id, message)
                self._last_edit = time.monotonic()
                try:
                    async with asyncio.timeout(self.interval):
                        await self._closing.wait()
                    return
                except TimeoutError:
                    pass
        except Exception as err:  # best effort
            logger.debug("preview stopped: %s", err)
