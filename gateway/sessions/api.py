"""API turns: a request submitted over HTTP, run in its session's lane (or stateless), its
reply streamed back on a `TurnStream`."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_core.loop import TurnProgress
from agent_core.media import TurnMedia
from gateway.cluster.lanes import Claim
from gateway.contracts.errors import LeaseLost, Overloaded, ShuttingDown
from gateway.contracts.history import ChatMessage, History, Role, SessionInfo, TurnResult
from gateway.contracts.ids import AccountId, ChatId, SessionId, SessionKey, ThreadId, TurnId
from gateway.media import file_chunks
from gateway.sessions.context import SessionContext
from gateway.sessions.lanes import LaneWorkers
from gateway.sessions.state import Lane
from gateway.sessions.stream import Finished, TurnRequest, TurnStream
from gateway.store.api_turns import EarlierTry, KeyReused, earlier_try, forget_question, mark
from gateway.store.outbox import Chunk, Target, enqueue
from gateway.store.store import current_session, read_history, record_finish, record_start
from gateway.turns import TurnStatus, run_agent

logger = logging.getLogger(__name__)

OVERLOAD_RETRY_AFTER = 1.0
"""Seconds a refused API turn is told to wait (`Retry-After`)."""


class ApiTurns:
    """Runs submitted turns: one at a time per session, within the turn slots."""

    def __init__(self, ctx: SessionContext, lanes: LaneWorkers) -> None:
        self.ctx = ctx
        self.lanes = lanes
        self.waiting = 0
        """Turns submitted that do not hold a slot yet (`sessions.max_waiting_turns`)."""

    def admit(self) -> None:
        """Raise Overloaded (and count it) when `submit` would refuse a turn now."""
        if self.waiting >= self.ctx.config.max_waiting_turns:
            self.ctx.metrics.refused_turns.inc()
            raise Overloaded(
                OVERLOAD_RETRY_AFTER,
                f"{self.waiting} turns are waiting already; retry in a moment",
            )

    def submit(self, request: TurnRequest) -> TurnStream:
        """Start a turn; its events arrive on the returned stream.

        Raises ShuttingDown, or Overloaded when `sessions.max_waiting_turns` turns wait
        for a slot or their session already.
        """
        if not self.ctx.accepting or self.ctx.tg is None:
            raise ShuttingDown("Herald is shutting down; retry shortly")
        self.admit()
        stream = TurnStream(request.key)
        self.waiting += 1
        stream.task = self.ctx.spawn(self._run(request, stream), f"turn {request.key}")
        return stream

    async def _run(self, request: TurnRequest, stream: TurnStream) -> None:
        if request.history is not None:
            try:
                await self._stateless(
                    request.history, stream, tokens=request.stream, profile=request.profile
                )
            except asyncio.CancelledError:
                stream.finish(Finished(TurnStatus.INTERRUPTED, error="the turn was cancelled"))
                raise
            return
        ctx = self.ctx
        lane = ctx.lanes.setdefault(request.key, Lane())
        lane.users += 1
        ctx.metrics.waiting_turns.inc()
        waiting = True
        try:
            # Lane first, then a global slot: a busy session never holds slots idle.
            async with lane.lock:
                await self._hold(request.key, lane)
                async with ctx.slots:
                    ctx.metrics.waiting_turns.dec()
                    waiting = False
                    self.waiting -= 1
                    outcome = await self._turn(request, stream)
            if outcome is not None:
                await ctx.profile(request.profile).memory_pass(*outcome)
        except asyncio.CancelledError:
            stream.finish(Finished(TurnStatus.INTERRUPTED, error="Herald is shutting down"))
            raise
        except LeaseLost as err:
            lane.claim = None
            logger.warning("turn for %s not run: %s", request.key, err)
            stream.finish(Finished(TurnStatus.FAILED, error=f"{err}; retry shortly"))
        except Exception as err:  # a turn must never take the manager's TaskGroup down
            logger.exception("turn for %s failed", request.key)
            stream.finish(
                Finished(TurnStatus.FAILED, error=f"internal error: {type(err).__name__}")
            )
        finally:
            if waiting:
                ctx.metrics.waiting_turns.dec()
                self.waiting -= 1
            lane.users -= 1
            if lane.claim is not None and lane.users == 0 and lane.worker is None:
                try:
                    await self.lanes.unclaim(lane)
                except Exception as err:  # the lane of a gone claim is taken over anyway
                    logger.warning("could not release session %s: %s", request.key, err)
            self.lanes.release(request.key, lane)

    async def _hold(self, key: SessionKey, lane: Lane) -> None:
        """Claim the session's lane for an API turn, waiting while another instance runs
        one of its turns (up to `sessions.turn_timeout`)."""
        timeout = self.ctx.config.turn_timeout
        delay = 0.05
        try:
            async with asyncio.timeout(timeout):
                while await self.lanes.claim(key, lane) is None:
                    await asyncio.sleep(delay)
                    delay = min(1.0, delay * 2)
        except TimeoutError:
            raise LeaseLost(
                f"session {key} stayed busy on another instance for {timeout}s"
            ) from None

    async def _turn(
        self, request: TurnRequest, stream: TurnStream
    ) -> tuple[SessionInfo, list[ChatMessage]] | None:
        ctx = self.ctx
        agent = ctx.profile(request.profile)
        text = agent.skill_message(request.text, request.key, request.user_id)
        user_message = ChatMessage(Role.USER, text)
        claim = ctx.lanes[request.key].claim
        assert claim is not None
        created: SessionInfo | None = None
        while True:
            # One transaction begins the turn: the session, the turn with the user's message
            # (none when it repeats an earlier try that kept it), and the history the model
            # reads. Fenced like an inbox turn: an instance whose claim was taken over writes
            # nothing.
            try:
                begin = functools.partial(
                    self._begin,
                    request=request,
                    claim=claim,
                    created=created,
                    user_message=user_message,
                    window=agent.settings.history_window,
                )
                session, earlier, turn_id, history = await ctx.store.unit(begin)
            except KeyReused as err:
                stream.finish(Finished(TurnStatus.FAILED, error=str(err), code=422))
                return None
            if session is not None and earlier is not None and earlier.answer is not None:
                # Answered already: the same answer again, nothing stored, no model call.
                if request.stream and earlier.answer:
                    await stream.token(earlier.answer)
                stream.finish(
                    Finished(TurnStatus.COMPLETED, text=earlier.answer, turn_id=earlier.turn_id)
                )
                return None
            if session is not None:
                break
            created = await ctx.store.open_session(
                request.key,
                platform=request.platform,
                user_id=request.user_id,
                snapshot=agent.snapshot,
                profile=request.profile,
            )
        progress = TurnProgress()
        media = TurnMedia()  # pictures `view_attachment` shows; files sent to other chats
        started = time.monotonic()
        ctx.metrics.running_turns.inc()
        on_token = stream.token if request.stream else None
        try:
            failure = await run_agent(
                lambda: agent.run_turn(
                    session,
                    progress,
                    on_token=on_token,
                    operator=request.operator,
                    turn_id=turn_id,
                    media=media,
                    history=history,
                    # A caller who asked for the whole answer at once never sees a part
                    # of it: the model call is not streamed either.
                    partial=request.stream,
                ),
                timeout=ctx.config.turn_timeout,
                what=f"API turn {turn_id} of {request.key}",
                on_failure=ctx.failed,
            )
        except asyncio.CancelledError:
            # Keep the partial output, marked interrupted; then let the cancellation go on.
            result = progress.result(TurnStatus.INTERRUPTED, "cancelled")
            with contextlib.suppress(LeaseLost):
                await self._finish(claim, session.id, turn_id, result)
            ctx.count(TurnStatus.INTERRUPTED, started)
            stream.finish(Finished(TurnStatus.INTERRUPTED, turn_id=turn_id, error="interrupted"))
            raise
        status = TurnStatus.COMPLETED if failure is None else failure.status
        error = None if failure is None else failure.error
        result = progress.result(
            TurnStatus.COMPLETED if failure is None else TurnStatus.FAILED, error=error
        )
        sync = (session, [user_message, *progress.messages]) if failure is None else None
        files = _file_chunks(media, session.id, turn_id) if failure is None else []
        try:
            await self._finish(claim, session.id, turn_id, result, sync=sync, files=files)
        except LeaseLost as err:
            ctx.count(TurnStatus.INTERRUPTED, started)
            stream.finish(Finished(TurnStatus.INTERRUPTED, turn_id=turn_id, error=str(err)))
            return None
        ctx.count(status, started)
        stream.finish(
            Finished(
                status,
                text=progress.final_text,
                turn_id=turn_id,
                usage=progress.usage,
                error=error,
                retryable=failure is None or failure.transient,
                llm_seconds=progress.llm_seconds,
            )
        )
        if failure is not None:
            return None
        return session, [user_message, *progress.messages]

    async def _begin(
        self,
        conn: AsyncConnection,
        request: TurnRequest,
        claim: Claim,
        created: SessionInfo | None,
        user_message: ChatMessage,
        *,
        window: int,
    ) -> tuple[SessionInfo | None, EarlierTry | None, TurnId, History | None]:
        """In one write transaction (one trip to SQLite's thread): the session (None: not
        made yet), an earlier try of this question, and unless that try was answered, the
        turn with the user's message and the history the model reads."""
        ctx = self.ctx
        await ctx.lane_store.check(conn, claim, None)
        session = created or await current_session(conn, request.key)
        if session is not None and session.profile != request.profile:
            session = None  # answered by another profile: a new session is opened first
        earlier: EarlierTry | None = None
        turn_id, history = TurnId(0), None
        if session is not None:
            earlier = await earlier_try(
                conn,
                session.id,
                user_message.content,
                key=request.idempotency_key,
                window=request.retry_window,
            )
            if earlier is None or earlier.answer is None:
                asked = [] if earlier is not None else [user_message]
                turn_id, _ = await record_start(conn, session.id, asked)
                if request.idempotency_key is not None:
                    await mark(conn, turn_id, request.idempotency_key)
                await ctx.lane_store.check(conn, claim, turn_id)
                history = await read_history(conn, session.id, window)
        return session, earlier, turn_id, history

    async def _finish(
        self,
        claim: Claim,
        session_id: SessionId,
        turn_id: TurnId,
        result: TurnResult,
        *,
        sync: tuple[SessionInfo, list[ChatMessage]] | None = None,
        files: list[Chunk] | None = None,
    ) -> None:
        """Store an API turn's result unless its lane was taken over (LeaseLost); a turn that
        failed having produced nothing keeps no message (its question goes too); with
        `sync`, queue the exchange for the memory provider in the same transaction, and the
        `files` its tools sent to chats."""

        async def finish(conn: AsyncConnection) -> bool:
            await self.ctx.lane_store.check(conn, claim, None)
            await record_finish(conn, session_id, turn_id, result)
            if result.status != TurnStatus.COMPLETED and not result.messages:
                # Refused before anything was produced: the request leaves no message, so
                # the client's retry is a first try, not the question asked twice.
                await forget_question(conn, session_id, turn_id)
            synced = sync is not None and await self.ctx.sync_turn(conn, sync[0], turn_id, sync[1])
            if files:
                await enqueue(conn, files)
            return synced

        synced = await self.ctx.store.unit(finish)  # one trip to the database, on SQLite
        if files:
            self.ctx.on_outbox()
        if synced and self.ctx.memory_sync is not None:
            self.ctx.memory_sync.wake()

    async def _stateless(
        self,
        history: tuple[ChatMessage, ...],
        stream: TurnStream,
        *,
        tokens: bool,
        profile: str = "default",
    ) -> None:
        ctx = self.ctx
        agent = ctx.profile(profile)
        started = time.monotonic()
        try:
            await ctx.slots.acquire()
        finally:
            self.waiting -= 1  # it holds a slot now (or stopped waiting for one)
        progress = TurnProgress()
        try:
            ctx.metrics.running_turns.inc()

            async def answer() -> None:
                on_token = stream.token if tokens else None
                done = await agent.answer_stateless(history, on_token=on_token)
                progress.messages.extend(done.messages)
                progress.usage = done.usage
                progress.llm_seconds = done.llm_seconds

            try:
                failure = await run_agent(
                    answer, timeout=None, what="stateless answer", on_failure=ctx.failed
                )
            except BaseException:
                ctx.count(TurnStatus.INTERRUPTED, started)
                raise
        finally:
            ctx.slots.release()
        if failure is not None:
            ctx.count(failure.status, started)
            stream.finish(
                Finished(failure.status, error=failure.error, retryable=failure.transient)
            )
            return
        ctx.count(TurnStatus.COMPLETED, started)
        stream.finish(
            Finished(
                TurnStatus.COMPLETED,
                text=progress.final_text,
                usage=progress.usage,
                llm_seconds=progress.llm_seconds,
            )
        )


def _file_chunks(media: TurnMedia, session_id: SessionId, turn_id: TurnId) -> list[Chunk]:
    """The files an API turn's `send_file` sent to chats (an API caller has no chat of its
    own, so every file there names its target)."""
    sent = [f for f in media.files if f.to is not None]  # none for the caller: refused
    if not sent or (first := sent[0].to) is None:
        return []
    target = Target(
        first.platform,
        AccountId(first.account),
        ChatId(first.chat_id),
        None if first.thread_id is None else ThreadId(first.thread_id),
    )
    return file_chunks(target, sent, session_id=session_id, turn_id=turn_id)
