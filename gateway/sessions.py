"""The session manager: one lane per session key, at most one running turn per lane.

Turns of different sessions run concurrently up to `sessions.max_concurrent_turns`; turns of
one session run one after another in arrival order (busy mode `queue`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

from agent_core.agent import Agent
from agent_core.llm import Usage
from agent_core.loop import TurnProgress
from gateway.config import SessionsConfig
from gateway.contracts.errors import LLMError, LLMRejected, ShuttingDown
from gateway.contracts.history import ChatMessage, Role, SessionInfo
from gateway.contracts.ids import SessionKey, TurnId, UserId
from gateway.metrics import Metrics
from gateway.store import Store

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """A new user message for a session, to be answered in its own turn."""

    key: SessionKey
    platform: str
    text: str
    user_id: UserId | None = None
    history: tuple[ChatMessage, ...] | None = None
    """When set, a stateless request: answer this conversation and store nothing."""


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


TurnEvent = Token | Finished


@dataclass
class TurnStream:
    """The events of one submitted turn, in order, ending with exactly one Finished."""

    key: SessionKey
    _queue: asyncio.Queue[TurnEvent] = field(default_factory=asyncio.Queue)
    _finished: Finished | None = None

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


@dataclass
class _Lane:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


SnapshotReader = Callable[[UserId | None], Awaitable[tuple[str, str]]]


class SessionManager:
    """Accepts turn requests and runs them in per-session lanes. An async context manager.

    Every turn task is a child of the manager's TaskGroup. Leaving the context drains: no new
    turns are accepted, running ones get `drain_timeout` to finish, then are cancelled and
    their partial output is stored marked interrupted.
    """

    def __init__(
        self,
        store: Store,
        agent: Agent,
        config: SessionsConfig,
        metrics: Metrics,
        snapshot: SnapshotReader,
    ) -> None:
        self.store = store
        self.agent = agent
        self.config = config
        self.metrics = metrics
        self.snapshot = snapshot
        self._lanes: dict[SessionKey, _Lane] = {}
        self._slots = asyncio.Semaphore(config.max_concurrent_turns)
        self._tasks: set[asyncio.Task[None]] = set()
        self._tg: asyncio.TaskGroup | None = None
        self._accepting = False
        self._idle = asyncio.Event()
        self._idle.set()

    async def __aenter__(self) -> Self:
        self._tg = asyncio.TaskGroup()
        await self._tg.__aenter__()
        self._accepting = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.drain(self.config.drain_timeout)
        assert self._tg is not None
        await self._tg.__aexit__(exc_type, exc, tb)

    @property
    def accepting(self) -> bool:
        """False once draining has begun."""
        return self._accepting

    @property
    def active_turns(self) -> int:
        """Turns submitted and not yet finished (running or waiting for their lane)."""
        return len(self._tasks)

    @property
    def lanes(self) -> int:
        """Sessions with a turn running or waiting; lanes are freed when they empty."""
        return len(self._lanes)

    def submit(self, request: TurnRequest) -> TurnStream:
        """Queue a turn; its events arrive on the returned stream. Raises ShuttingDown."""
        if not self._accepting or self._tg is None:
            raise ShuttingDown("Herald is shutting down; retry shortly")
        stream = TurnStream(request.key)
        task = self._tg.create_task(self._run(request, stream), name=f"turn {request.key}")
        self._tasks.add(task)
        self._idle.clear()
        task.add_done_callback(self._done)
        return stream

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not self._tasks:
            self._idle.set()

    async def drain(self, grace: float) -> None:
        """Stop accepting; wait up to `grace` seconds for turns, then cancel what is left."""
        self._accepting = False
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

    async def _run(self, request: TurnRequest, stream: TurnStream) -> None:
        if request.history is not None:
            await self._stateless(request.history, stream)
            return
        lane = self._lanes.setdefault(request.key, _Lane())
        lane.users += 1
        self.metrics.waiting_turns.inc()
        waiting = True
        try:
            # Lane first, then a global slot: a busy session never holds slots idle.
            async with lane.lock, self._slots:
                self.metrics.waiting_turns.dec()
                waiting = False
                outcome = await self._turn(request, stream)
            if outcome is not None:
                await self.agent.memory_pass(*outcome)
        except asyncio.CancelledError:
            stream.finish(Finished("interrupted", error="Herald is shutting down"))
            raise
        except Exception as err:  # a turn must never take the manager's TaskGroup down
            logger.exception("turn for %s failed", request.key)
            stream.finish(Finished("failed", error=f"internal error: {type(err).__name__}"))
        finally:
            if waiting:
                self.metrics.waiting_turns.dec()
            lane.users -= 1
            if lane.users == 0:
                self._lanes.pop(request.key, None)

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
        turn_id, _ = await self.store.start_turn(session.id, user_message)
        progress = TurnProgress()
        started = time.monotonic()
        self.metrics.running_turns.inc()
        status, error, retryable = "completed", None, True
        try:
            async with asyncio.timeout(self.config.turn_timeout):
                await self.agent.run_turn(session, progress, on_token=stream.token)
        except TimeoutError:
            status, error = "timed_out", f"the turn took longer than {self.config.turn_timeout}s"
        except LLMError as err:
            status, error, retryable = "failed", str(err), not isinstance(err, LLMRejected)
        except asyncio.CancelledError:
            # Keep the partial output, marked interrupted; then let the cancellation go on.
            result = progress.result("interrupted", "cancelled")
            await self.store.finish_turn(session.id, turn_id, result)
            self._count("interrupted", started)
            stream.finish(Finished("interrupted", turn_id=turn_id, error="interrupted"))
            raise
        result = progress.result("completed" if status == "completed" else "failed", error=error)
        await self.store.finish_turn(session.id, turn_id, result)
        self._count(status, started)
        stream.finish(
            Finished(
                status,
                text=progress.final_text,
                turn_id=turn_id,
                usage=progress.usage,
                error=error,
                retryable=retryable,
            )
        )
        if status != "completed":
            return None
        return session, [user_message, *progress.messages]

    async def _stateless(self, history: tuple[ChatMessage, ...], stream: TurnStream) -> None:
        started = time.monotonic()
        async with self._slots:
            self.metrics.running_turns.inc()
            try:
                progress = await self.agent.answer_stateless(history, on_token=stream.token)
            except LLMError as err:
                self._count("failed", started)
                retryable = not isinstance(err, LLMRejected)
                stream.finish(Finished("failed", error=str(err), retryable=retryable))
                return
            except BaseException:
                self._count("interrupted", started)
                raise
        self._count("completed", started)
        stream.finish(Finished("completed", text=progress.final_text, usage=progress.usage))

    def _count(self, status: str, started: float) -> None:
        self.metrics.running_turns.dec()
        self.metrics.turns.labels(status=status).inc()
        self.metrics.turn_seconds.observe(time.monotonic() - started)
