"""The session manager: the facade over admission, lanes, turns, commands, signals and API
turns, and the one TaskGroup that owns their tasks.

One lane per session key runs at most one turn at a time; turns of different sessions run
concurrently up to `sessions.max_concurrent_turns`. Inbound platform messages arrive through
`accept` (the adapters' InboundSink): stored in the inbox and committed before `accept`
returns, then handled by the session's lane according to its busy mode. HTTP API requests
arrive through `submit` and stream their reply back to the caller.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Self

from agent_core.agent import Agent
from agent_core.media.speech import Synthesizer
from gateway.access import Access
from gateway.agents import ProfileAgents
from gateway.channels import Channels
from gateway.cluster.bus import LocalBus
from gateway.cluster.lanes import Lanes, SoloLanes
from gateway.commands import ParsedCommand
from gateway.config import SessionsConfig
from gateway.contracts.config import PlatformSection
from gateway.contracts.ids import AccountId, Platform, PlatformMessageId, SessionKey, UserId
from gateway.contracts.messages import InboundMessage, Reaction
from gateway.media import StoredFiles
from gateway.memory_sync import SyncQueue
from gateway.metrics import Metrics
from gateway.sessions.admission import Admission
from gateway.sessions.api import ApiTurns
from gateway.sessions.api_commands import ApiCommands
from gateway.sessions.commands import Commands
from gateway.sessions.context import SessionContext, SnapshotReader
from gateway.sessions.feedback import Feedback
from gateway.sessions.lanes import LaneWorkers
from gateway.sessions.runner import InboxTurns
from gateway.sessions.signals import ClusterSignals
from gateway.sessions.stream import TurnRequest, TurnStream
from gateway.store import Store
from gateway.store import inbox as inbox_sql
from gateway.tools.approvals import ChatApprovals

logger = logging.getLogger(__name__)


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
        platforms: Mapping[tuple[str, str], PlatformSection] | None = None,
        on_outbox: Callable[[], None] | None = None,
        lanes: Lanes | None = None,
        bus: LocalBus | None = None,
        scan_interval: float = 1.0,
        approvals: ChatApprovals | None = None,
        memory_sync: SyncQueue | None = None,
        files: StoredFiles | None = None,
        speech: Synthesizer | None = None,
        homes: Sequence[str] = (),
        redact: Callable[[str], str] = lambda text: text,
        profiles: ProfileAgents | None = None,
        profile_homes: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.ctx = ctx = SessionContext(
            store=store,
            agent=agent,
            config=config,
            metrics=metrics,
            snapshot=snapshot,
            channels=channels or Channels(),
            access=access,
            platforms=dict(platforms or {}),
            on_outbox=on_outbox or (lambda: None),
            lane_store=lanes or SoloLanes(),
            bus=bus or LocalBus(),
            approvals=approvals,
            memory_sync=memory_sync,
            files=files,
            speech=speech,
            homes=tuple(homes),
            redact=redact,
            profiles=profiles,
            profile_homes={k: tuple(v) for k, v in (profile_homes or {}).items()},
        )
        self.signals = ClusterSignals(ctx, scan_interval)
        self.commands = Commands(ctx, self.signals)
        self.turns = InboxTurns(ctx, Feedback(ctx))
        self.workers = LaneWorkers(ctx, self.turns.run_batch, self.commands.run)
        ctx.wake = self.workers.wake
        self.admission = Admission(ctx, self.commands.run)
        self.api = ApiTurns(ctx, self.workers)
        self.api_commands = ApiCommands(ctx)
        self._recovered: list[SessionKey] = []

    @property
    def store(self) -> Store:
        """The store the sessions live in."""
        return self.ctx.store

    @property
    def agent(self) -> Agent:
        """The agent of the default profile."""
        return self.ctx.agent

    @property
    def profiles(self) -> ProfileAgents:
        """The agent of each profile (just the default one without `profiles`)."""
        return self.ctx.profiles or ProfileAgents.single(self.ctx.agent)

    @property
    def metrics(self) -> Metrics:
        """The daemon's metrics."""
        return self.ctx.metrics

    @property
    def snapshot(self) -> SnapshotReader:
        """How a new session's memory snapshot is read."""
        return self.ctx.snapshot

    async def __aenter__(self) -> Self:
        ctx = self.ctx
        ctx.tg = asyncio.TaskGroup()
        await ctx.tg.__aenter__()
        try:
            await self._recover()
        except BaseException as err:
            await ctx.tg.__aexit__(type(err), err, err.__traceback__)
            raise
        ctx.accepting = True
        for key in self._recovered:
            ctx.wake(key)
        if ctx.clustered:
            ctx.bus.on_ignored = lambda reason: ctx.metrics.signals_ignored.labels(
                reason=reason
            ).inc()
            ctx.bus.subscribe(self.signals.on_signal)
            ctx.tg.create_task(self.signals.scanner(), name="orphan scan")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.drain(self.ctx.config.drain_timeout)
        self.ctx.closed.set()
        assert self.ctx.tg is not None
        await self.ctx.tg.__aexit__(exc_type, exc, tb)

    async def _recover(self) -> None:
        ctx = self.ctx
        if ctx.clustered:
            # Only what no live instance is doing; claiming each lane recovers it.
            self._recovered = await ctx.lane_store.orphans(limit=100_000, started=True)
            return
        interrupted = await ctx.store.interrupt_running_turns()
        if interrupted:
            logger.warning("%d turn(s) were cut off by the last stop", interrupted)
        self._recovered = await inbox_sql.Inbox(ctx.store).recover()
        for key in self._recovered:
            async with ctx.store.read() as conn:
                commands = await inbox_sql.pending(conn, key, kind="command")
            for row in commands:
                await self.commands.run(row)

    # what the rest of Herald asks ------------------------------------------------------------

    @property
    def clustered(self) -> bool:
        """Whether other instances may share the database (lanes are claimed in SQL)."""
        return self.ctx.clustered

    @property
    def accepting(self) -> bool:
        """False once draining has begun."""
        return self.ctx.accepting

    @property
    def active_turns(self) -> int:
        """Turns submitted or queued and not yet finished (API requests and busy lanes)."""
        return len(self.ctx.tasks)

    @property
    def lanes(self) -> int:
        """Sessions with a turn running or waiting; lanes are freed when they empty."""
        return len(self.ctx.lanes)

    def running(self, key: SessionKey) -> bool:
        """Whether a turn of that session is running now."""
        lane = self.ctx.lanes.get(key)
        return lane is not None and lane.running is not None

    def steering(self, key: SessionKey) -> int:
        """Steer messages waiting for the next boundary of the turn running here."""
        lane = self.ctx.lanes.get(key)
        return 0 if lane is None or lane.running is None else len(lane.running.steer.waiting)

    async def accept(self, message: InboundMessage) -> None:
        """See `Admission.accept`. Raises ShuttingDown."""
        await self.admission.accept(message)

    async def react(self, reaction: Reaction) -> None:
        """`ReactionSink`: see `Admission.react`."""
        await self.admission.react(reaction)

    async def settle(self, message: InboundMessage, detail: str) -> None:
        """See `Admission.settle`. Raises ShuttingDown."""
        await self.admission.settle(message, detail)

    async def may_fetch(self, message: InboundMessage) -> bool:
        """See `Admission.may_fetch`."""
        return await self.admission.may_fetch(message)

    async def delivery_report(
        self,
        platform: Platform,
        account: AccountId,
        message: PlatformMessageId,
        status: str,
        error: str | None = None,
    ) -> bool:
        """Record a platform's later report on a sent chunk (see `Outbox.delivery_report`)."""
        return await self.ctx.outbox.delivery_report(platform, account, message, status, error)

    def admit(self) -> None:
        """See `ApiTurns.admit`. Raises Overloaded."""
        self.api.admit()

    def submit(self, request: TurnRequest) -> TurnStream:
        """See `ApiTurns.submit`. Raises ShuttingDown or Overloaded."""
        return self.api.submit(request)

    async def api_command(
        self, key: SessionKey | None, user_id: UserId | None, command: ParsedCommand
    ) -> str:
        """See `ApiCommands.answer`."""
        return await self.api_commands.answer(key, user_id, command)

    async def drain(self, grace: float) -> None:
        """Stop accepting; wait up to `grace` seconds for turns, then cancel what is left.

        Lanes start no new turn once draining: what waits stays in the inbox for the next
        start. Cancelled turns keep their partial output and are answered after a restart.
        """
        ctx = self.ctx
        ctx.accepting = False
        ctx.draining.set()
        for key in list(ctx.reviews):
            ctx.cancel_review(key)
        self.signals.scan.set()
        for lane in ctx.lanes.values():
            lane.wake.set()
        if ctx.tasks:
            logger.info("draining %d turn(s), up to %.0fs", len(ctx.tasks), grace)
            try:
                async with asyncio.timeout(grace):
                    await ctx.idle.wait()
            except TimeoutError:
                logger.warning("cancelling %d turn(s) after the drain timeout", len(ctx.tasks))
                for task in list(ctx.tasks):
                    task.cancel()
                await ctx.idle.wait()
