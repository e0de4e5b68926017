"""What the parts of the session manager share: its dependencies, its lanes and its tasks.

One `SessionContext` per manager. The parts (admission, lanes, turns, commands, signals, API
turns) each hold it; none of them holds another's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_core.agent import Agent
from agent_core.media.speech import Synthesizer
from gateway.access import Access
from gateway.agents import ProfileAgents
from gateway.backoff import Backoff
from gateway.channels import Channels
from gateway.cluster.bus import LocalBus
from gateway.cluster.lanes import Lanes
from gateway.config import SessionsConfig
from gateway.contracts.config import BusyMode, PlatformSection
from gateway.contracts.history import ChatMessage, SessionInfo
from gateway.contracts.ids import SessionKey, TurnId, UserId
from gateway.media import StoredFiles
from gateway.memory_sync import SyncQueue
from gateway.metrics import Metrics
from gateway.sessions.state import Lane, Running, Speaker
from gateway.store import Store
from gateway.store.inbox import InboxRow
from gateway.store.outbox import Outbox
from gateway.store.store import busy_mode_of
from gateway.tools.approvals import ChatApprovals
from gateway.turns import TurnFailure

logger = logging.getLogger(__name__)

SnapshotReader = Callable[[SessionKey, UserId | None], Awaitable[tuple[str, ...]]]
"""(USER.md, MEMORY.md[, skills index]) for a new session of that key and user."""


@dataclass
class SessionContext:
    """The manager's dependencies and the running state its parts share."""

    store: Store
    agent: Agent
    config: SessionsConfig
    metrics: Metrics
    snapshot: SnapshotReader
    channels: Channels
    access: Access | None
    platforms: dict[tuple[str, str], PlatformSection]
    on_outbox: Callable[[], None]
    lane_store: Lanes
    bus: LocalBus
    memory_sync: SyncQueue | None = None
    """Where finished turns of a person are queued for the memory provider (None: no
    provider)."""
    files: StoredFiles | None = None
    """Where received files are kept when their message is accepted (the blob store; None:
    they stay where the adapter put them)."""
    speech: Synthesizer | None = None
    """Speaks voice replies (`speech`; None: every answer is text)."""
    homes: tuple[str, ...] = ()
    """`home.targets` from the config: `/cron` lists the jobs reporting to them too."""
    profile_homes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """The home of each profile but the default one (`profiles.<name>.home`)."""
    outbox: Outbox = field(init=False)
    lanes: dict[SessionKey, Lane] = field(default_factory=dict)
    """Sessions with a turn running or waiting here; a lane is freed when it empties."""
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    """Lane workers and API turns: what draining waits for."""
    tg: asyncio.TaskGroup | None = None
    accepting: bool = False
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    draining: asyncio.Event = field(default_factory=asyncio.Event)
    slots: asyncio.Semaphore = field(init=False)
    """Turns of different sessions running at once (`sessions.max_concurrent_turns`)."""
    model_backoff: Backoff = field(init=False)
    wake: Callable[[SessionKey], None] = lambda _: None
    """Start or nudge the lane of a session (set by the manager to the lanes' own)."""
    approvals: ChatApprovals | None = None
    """Tool calls waiting for `/approve` (None: no tool asks for approval)."""
    reviews: dict[SessionKey, asyncio.Task[None]] = field(default_factory=dict)
    """Background skill reviews running after a session's turn (one per session)."""
    redact: Callable[[str], str] = lambda text: text
    """Takes the configured secrets out of what is sent to a chat outside the outbox (the
    streamed preview)."""
    profiles: ProfileAgents | None = None
    """The agent of each profile and the bindings (None: `agent` answers everywhere)."""

    def __post_init__(self) -> None:
        self.outbox = Outbox(self.store)
        self.idle.set()
        self.slots = asyncio.Semaphore(self.config.max_concurrent_turns)
        self.model_backoff = Backoff(
            initial=self.config.model_retry_initial, maximum=self.config.model_retry_max
        )

    @property
    def instance(self) -> str:
        """This instance's id among those sharing the database."""
        return self.bus.origin

    @property
    def clustered(self) -> bool:
        """Whether other instances may share the database (lanes are claimed in SQL)."""
        return self.lane_store.clustered

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run `coro` as a child of the manager's TaskGroup, counted until it ends."""
        assert self.tg is not None
        task = self.tg.create_task(coro, name=name)
        self.tasks.add(task)
        self.idle.clear()
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if not self.tasks:
            self.idle.set()

    async def pause(self, seconds: float) -> None:
        """Wait `seconds`, cut short when draining begins."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.draining.wait()

    async def sync_turn(
        self,
        conn: AsyncConnection,
        session: SessionInfo,
        turn_id: TurnId,
        messages: list[ChatMessage],
    ) -> bool:
        """In the turn's own transaction: queue its exchange for the memory provider (when
        there is one and the session is a person's); whether a sync was queued."""
        if self.memory_sync is None or not self.shares_memory(session):
            return False
        return await self.memory_sync.turn(conn, session, turn_id, messages)

    def shares_memory(self, session: SessionInfo) -> bool:
        """Whether the session's profile uses the default memory namespace, the one the
        external memory provider keeps (another namespace's turns are never synced there:
        the default profile would recall them)."""
        if self.profiles is None or session.profile not in self.profiles.agents:
            return session.profile == "default"
        return self.profiles.get(session.profile).memory.namespace is None

    def failed(self, failure: TurnFailure) -> None:
        """Count a failed turn by its kind."""
        self.metrics.model_failures.labels(kind=str(failure.kind)).inc()

    def count(self, status: str, started: float) -> None:
        """A turn ended with `status` after starting at `started` (monotonic)."""
        self.metrics.running_turns.dec()
        self.metrics.turns.labels(status=status).inc()
        self.metrics.turn_seconds.observe(time.monotonic() - started)

    def start_review(self, key: SessionKey, review: Coroutine[Any, Any, None]) -> None:
        """Run a skill review of `key`'s last turn as a child of the manager's TaskGroup,
        off the chat's path: not waited for by draining, cancelled by the next message."""
        self.cancel_review(key)
        assert self.tg is not None
        task = self.tg.create_task(review, name=f"skill review {key}")
        self.reviews[key] = task

        def forget(done: asyncio.Task[None]) -> None:
            if self.reviews.get(key) is done:
                del self.reviews[key]

        task.add_done_callback(forget)

    def cancel_review(self, key: SessionKey) -> None:
        """Cancel the skill review of `key`, if one runs (a new message came)."""
        task = self.reviews.pop(key, None)
        if task is not None:
            task.cancel()

    async def mode(
        self, conn: AsyncConnection, key: SessionKey, section: PlatformSection | None
    ) -> BusyMode:
        """The session's busy mode: its `/mode`, else its platform's, else the default."""
        value = await busy_mode_of(conn, key)
        if value:
            return BusyMode(value)
        if section is not None and section.busy_mode is not None:
            return section.busy_mode
        return self.config.busy_mode

    def is_operator(self, platform: str, sender_id: str, account: str | None = None) -> bool:
        """Whether this sender (on `account`, when known) operates Herald (no access rules:
        nobody does)."""
        return self.access is not None and self.access.is_operator(platform, sender_id, account)

    def speaker(
        self, platform: str, sender_id: str, name: str, *, direct: bool, account: str | None = None
    ) -> Speaker:
        """Who wrote a message, as a message steered into a running turn carries it."""
        return Speaker(
            f"{platform}:{sender_id}",
            self.is_operator(platform, sender_id, account),
            None if direct else (name or sender_id),
        )

    def profile(self, name: str) -> Agent:
        """The agent of profile `name` (UnknownProfile when there is none)."""
        if self.profiles is None:
            return ProfileAgents.single(self.agent).get(name)
        return self.profiles.get(name)

    async def steers_into(
        self, running: Running, platform: str, account: str, chat: str, thread: str | None
    ) -> bool:
        """Whether a message of this chat may join `running`: only while the chat is still
        bound to the turn's profile (one profile never reads words meant for another). A
        binding that cannot be read now counts as changed: the message waits for its own
        turn, which reads the binding again."""
        return await self.bound_to(running.profile, platform, account, chat, thread)

    async def bound_to(
        self, profile: str, platform: str, account: str, chat: str, thread: str | None
    ) -> bool:
        """Whether this chat is bound to `profile` now (a binding that cannot be read now
        counts as another: whatever asks does nothing for `profile`). Without profiles:
        always."""
        if self.profiles is None or len(self.profiles.agents) == 1:
            return True
        try:
            agent = await self.profiles.choose(platform, account, chat, thread)
        except Exception as err:
            logger.warning("could not read the profile bindings: %s", err)
            return False
        return agent.profile == profile

    async def agent_of(self, row: InboxRow) -> Agent:
        """The agent of the profile bound to `row`'s chat now."""
        if self.profiles is None:
            return self.agent
        return await self.profiles.choose(row.platform, row.account, row.chat_id, row.thread_id)

    def snapshot_of(self, row: InboxRow, agent: Agent | None = None) -> SnapshotReader:
        """What a new session of `row` starts with: its person's memory files in a direct
        chat, the group's in a group (one person's own session there too: what they told
        the agent privately is not for the others in the group). `agent`: the profile's
        (None: the manager's)."""
        snapshot = self.snapshot if agent is None or agent is self.agent else agent.snapshot
        if row.is_direct:
            return snapshot

        async def group(key: SessionKey, _user: UserId | None) -> tuple[str, ...]:
            return await snapshot(key, None)

        return group

    async def owner(self, row: InboxRow) -> UserId | None:
        """The user a session of this row belongs to (None for a shared group session)."""
        if row.is_direct or ":u=" in row.session_key:
            return await self.store.resolve_user(row.platform, row.sender_id, row.sender_name)
        return None
