"""Inbox turns: the messages a lane took, answered by the agent, settled in one commit.

A turn's exception never leaves it (it is the messages' outcome): an unreachable model keeps
them queued and tells their sender once; anything else drops them with a notice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_core.agent import Agent
from agent_core.loop import TurnProgress
from agent_core.media import TurnMedia
from gateway.cluster.lanes import Claim
from gateway.contracts.errors import LeaseLost
from gateway.contracts.history import ChatMessage, History, Role, SessionInfo, TurnResult
from gateway.contracts.ids import (
    InboxId,
    PlatformMessageId,
    SessionId,
    SessionKey,
    TurnId,
    UserId,
)
from gateway.contracts.messages import utcnow
from gateway.media import file_chunks
from gateway.sessions.context import SessionContext
from gateway.sessions.feedback import Feedback, Preview
from gateway.sessions.state import Lane, Running, Steer
from gateway.sessions.voice import VoiceNotes
from gateway.sessions.voice_replies import VoiceJob, VoiceReplies, voice_chunk
from gateway.store import inbox as inbox_sql
from gateway.store.inbox import InboxRow, Outcome
from gateway.store.outbox import Chunk, Target, enqueue, reply_chunks
from gateway.store.store import read_history, record_finish, record_start, turns_in_session
from gateway.turns import FailureKind, TurnFailure, TurnStatus, run_agent

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 3
"""Turns started for one message before it is dropped: a message that crashes the process
every time must not crash it forever."""


class _BatchChanged(Exception):
    """Some of a batch's messages were settled after it was read: roll back, read again."""


@dataclass(frozen=True, slots=True)
class _Settlement:
    """How a try of a turn ends for its messages."""

    status: TurnStatus
    result: TurnResult
    outcomes: list[tuple[list[InboxId], Outcome, str | None]]
    notices: list[Chunk]
    postponed: list[InboxId]


class InboxTurns:
    """Runs the turns of the lanes."""

    def __init__(self, ctx: SessionContext, feedback: Feedback) -> None:
        self.ctx = ctx
        self.feedback = feedback
        self.voice_replies = VoiceReplies(ctx, ctx.speech)

    async def run_batch(self, key: SessionKey, lane: Lane, batch: list[InboxRow]) -> None:
        head = batch[0]
        target = Target(head.platform, head.account, head.chat_id, head.thread_id)
        over = [r for r in batch if r.attempts >= MAX_ATTEMPTS]
        if over:
            async with self.ctx.store.write() as conn:
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
            self.ctx.metrics.outcomes.labels(outcome=str(Outcome.DROPPED)).inc(len(over))
            self.ctx.on_outbox()
            batch = [r for r in batch if r.attempts < MAX_ATTEMPTS]
            if not batch:
                return
            head = batch[0]
        # The profile bound to the chat now (a session's rows are of one chat): its voice
        # notes are heard by that profile's transcription, never another's.
        agent = await self.ctx.agent_of(head)
        batch = await VoiceNotes(self.ctx, agent.transcriber).prepare(batch, target)
        if not batch:
            return
        head = batch[0]
        user_id = await self.ctx.owner(head)
        exchange: tuple[SessionInfo, list[ChatMessage]] | None = None
        async with lane.lock:
            self.ctx.metrics.waiting_turns.inc()
            try:
                await self.ctx.slots.acquire()
            finally:
                self.ctx.metrics.waiting_turns.dec()
            try:
                exchange = await self._inbox_turn(key, lane, batch, target, user_id, agent=agent)
            finally:
                self.ctx.slots.release()
        if exchange is not None:
            review = agent.skill_review(*exchange)
            if review is not None and not self.ctx.draining.is_set():
                self.ctx.start_review(key, review)
            elif review is not None:
                review.close()
            await agent.memory_pass(*exchange)

    async def _inbox_turn(  # noqa: PLR0915 - a turn's life in order (start, run, checkpoint, settle) shares its locals
        self,
        key: SessionKey,
        lane: Lane,
        batch: list[InboxRow],
        target: Target,
        user_id: UserId | None,
        *,
        agent: Agent,
    ) -> tuple[SessionInfo, list[ChatMessage]] | None:
        head = batch[0]
        # A chat bound to another profile since its last turn starts a new session.
        session = await self.ctx.store.open_session(
            key,
            platform=head.platform,
            user_id=user_id,
            snapshot=self.ctx.snapshot_of(head, agent),
            profile=agent.profile,
        )
        # A group stays a group, even one person's session in it (no recall, no sync,
        # the group's memory files).
        session = replace(session, group=not head.is_direct)
        # A row an earlier try stored in the history is not stored again, unless that try was
        # in another session (the chat's profile changed since, as `/new` stores it again):
        # the one answering now must read it.
        tried = [r.turn_id for r in batch if r.turn_id is not None]
        if tried:
            async with self.ctx.store.read() as conn:
                stored = await turns_in_session(conn, session.id, tried)
        else:
            stored = set()
        new_messages = [
            _user_message(r, agent.skill_message(r.content, key, user_id))
            for r in batch
            if r.turn_id is None or r.turn_id not in stored
        ]
        claim = lane.claim
        assert claim is not None
        # Busy from here on, so a /stop or an interrupt during the commit below is not lost.
        running = Running(
            TurnId(0),
            [r.id for r in batch],
            time.monotonic(),
            Steer(VoiceNotes(self.ctx, agent.transcriber).steered),
            profile=agent.profile,
        )
        lane.running = running
        try:
            # Taken under the settling lock, as /stop and /new run: such a command either
            # clears these rows first (the take finds them gone) or comes after the take,
            # and this turn sees its count when it settles.
            async with lane.settling:
                stops = lane.stops
                if stops != lane.batch_stops:
                    # A /stop or /new ran since these rows were read: /new stores a waiting
                    # message again in the new conversation, so which of them this turn must
                    # add to the history is known only from a fresh read.
                    raise _BatchChanged
                # One trip to the database (on SQLite): the whole transaction at once.
                window = agent.settings.history_window
                turn_id, history = await self.ctx.store.unit(
                    lambda conn: self._begin(
                        conn, claim, session.id, new_messages, batch, window=window
                    )
                )
            running.turn_id = turn_id
            progress = TurnProgress()
            media = TurnMedia()
            preview = await self.feedback.preview(target, turn_id)
        except _BatchChanged:
            lane.running = None  # settled meanwhile (a /stop): nothing was started
            return None
        except BaseException:
            lane.running = None
            raise
        assert self.ctx.tg is not None
        self.ctx.metrics.running_turns.inc()
        started = time.monotonic()
        # The rights of a turn are those everyone whose words are in it has: it may reach
        # other chats only when all of them operate Herald (steered words narrow it later).
        operator = all(self.ctx.is_operator(r.platform, r.sender_id, r.account) for r in batch)
        sender = f"{batch[-1].platform}:{batch[-1].sender_id}"
        others = frozenset(f"{r.platform}:{r.sender_id}" for r in batch) - {sender}
        voice = self.voice_replies.job(target, batch)
        running.task = self.ctx.tg.create_task(
            self._agent_turn(
                f"turn {turn_id} of {key}",
                session,
                progress,
                running,
                preview,
                operator=operator,
                sender=sender,
                others=others,
                group=not head.is_direct,
                media=media,
                history=history,
                voice=voice,
                agent=agent,
            ),
            name=f"turn {key}",
        )
        if running.cancel_reason is not None:
            running.task.cancel()
        answering = batch[-1].platform_message_id if batch else None
        turn_ended = asyncio.Event()
        self.ctx.tg.create_task(
            self.feedback.typing(target, answering, turn_ended), name=f"typing {key}"
        )
        try:
            await asyncio.wait({running.task})
        except asyncio.CancelledError:
            # Draining: checkpoint the partial output; the messages are answered after a restart.
            running.task.cancel()
            await asyncio.wait({running.task})
            lane.running = None
            try:
                async with self.ctx.store.write() as conn:
                    await self.ctx.lane_store.check(conn, claim, None)
                    cut = progress.result("interrupted", "process stopping")
                    await record_finish(conn, session.id, turn_id, cut)
                    await inbox_sql.requeue(
                        conn, [*running.ids, *running.steer.taken], turn_id=turn_id
                    )
            except LeaseLost:
                pass  # the instance that took the session over has recovered it already
            self.ctx.count("interrupted", started)
            raise
        finally:
            lane.running = None
            turn_ended.set()
            if preview is not None:
                await preview.close()
        synced = False
        await lane.settling.acquire()
        try:
            settled = self._settlement(
                lane=lane,
                batch=batch,
                running=running,
                progress=progress,
                preview=preview,
                session_id=session.id,
                turn_id=turn_id,
                target=target,
                stops=stops,
                media=media,
                voice=voice,
            )
            status, result, outcomes = settled.status, settled.result, settled.outcomes
            notices, postponed = settled.notices, settled.postponed
            leftover = [i for i, _ in running.steer.waiting]
            try:

                async def settle(conn: AsyncConnection) -> tuple[bool, bool]:
                    await self.ctx.lane_store.check(conn, claim, None)
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
                    synced = status == TurnStatus.COMPLETED and await self.ctx.sync_turn(
                        conn, session, turn_id, [*map(_user_message, batch), *progress.messages]
                    )
                    # Read here, so the lane need not look again when nothing waits.
                    return synced, not await inbox_sql.has_pending(conn, key)

                synced, lane.drained = await self.ctx.store.unit(settle)
            except LeaseLost:
                self.ctx.count("interrupted", started)
                raise
        finally:
            lane.settling.release()
        self.ctx.count(status, started)
        if notices:
            self.ctx.on_outbox()
        if synced and self.ctx.memory_sync is not None:
            self.ctx.memory_sync.wake()
        if status != TurnStatus.COMPLETED:
            return None
        return session, [*new_messages, *progress.messages]

    async def _begin(
        self,
        conn: AsyncConnection,
        claim: Claim,
        session_id: SessionId,
        new_messages: list[ChatMessage],
        batch: list[InboxRow],
        *,
        window: int,
    ) -> tuple[TurnId, History]:
        """In one write transaction: the turn with its new messages, the batch taken by it
        (`_BatchChanged` when a row went meanwhile), and the history the model reads."""
        # The lane first: a takeover locks the lane row, then the inbox rows.
        await self.ctx.lane_store.check(conn, claim, None)
        turn_id, _ = await record_start(conn, session_id, new_messages)
        # Taken as read: a row edited since is read again (its new text is the one to store).
        taken = await inbox_sql.take(
            conn, [r.id for r in batch], turn_id, texts=[r.text for r in batch]
        )
        if taken < len(batch):
            raise _BatchChanged
        await self.ctx.lane_store.check(conn, claim, turn_id)
        # What the model reads, in the same transaction (no read of its own).
        history = await read_history(conn, session_id, window)
        return turn_id, history

    def _settlement(
        self,
        *,
        lane: Lane,
        batch: list[InboxRow],
        running: Running,
        progress: TurnProgress,
        preview: Preview | None,
        session_id: SessionId,
        turn_id: TurnId,
        target: Target,
        stops: int,
        media: TurnMedia | None = None,
        voice: VoiceJob | None = None,
    ) -> _Settlement:
        """What a finished try means for its messages: each one's outcome, the chunks to
        send, and which wait for another try (the model was unreachable)."""
        head = batch[0]
        task = running.task
        assert task is not None
        ids = running.ids
        steered = running.steer.taken
        notices: list[Chunk] = []
        outcomes: list[tuple[list[InboxId], Outcome, str | None]]
        postponed: list[InboxId] = []
        failure = None if task.cancelled() else task.result()
        if task.cancelled():
            reason = running.cancel_reason or "cancelled"
            status = TurnStatus.INTERRUPTED
            result = progress.result(status, reason)
            outcomes = [(ids + steered, Outcome.DROPPED, reason)]
        elif failure is not None:
            status = failure.status
            result = progress.result(TurnStatus.FAILED, failure.error)
            waited = (utcnow() - min(r.accepted_at for r in batch)).total_seconds()
            if failure.transient and lane.stops != stops:
                # A /stop or /new came while this try was ending: no further try.
                outcomes = [(ids + steered, Outcome.DROPPED, "stopped while the model was away")]
                lane.retries, lane.told_outage = 0, False
            elif failure.transient and waited < self.ctx.config.model_outage_max_wait:
                # The messages wait for the model to come back; their sender hears it once.
                outcomes = []
                postponed = ids + steered
                lane.retry_in = self.ctx.model_backoff.delay(lane.retries)
                lane.retries += 1
                if failure.kind is FailureKind.UNREACHABLE and not lane.told_outage:
                    lane.told_outage = True
                    notices.append(
                        Chunk(
                            f"outage:{ids[0]}",
                            target,
                            "⏳ I can't reach my language model right now. Your message is "
                            "saved; I'll answer as soon as the model is back.",
                            session_id=session_id,
                            turn_id=turn_id,
                        )
                    )
            else:
                if failure.kind is FailureKind.UNREACHABLE:
                    error = f"the model was unreachable for {waited / 60:.0f} min ({failure.error})"
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
                    Chunk(f"fail:{turn_id}", target, text, session_id=session_id, turn_id=turn_id)
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
            notices.extend(
                self._answer(
                    target,
                    progress.final_text,
                    session_id=session_id,
                    turn_id=turn_id,
                    inbox_id=ids[0],
                    reply_to=None if head.is_direct else head.platform_message_id,
                    preview=preview,
                    voice=voice,
                )
            )
            if media is not None and media.files:
                notices.extend(
                    file_chunks(
                        target,
                        media.files,
                        session_id=session_id,
                        turn_id=turn_id,
                        inbox_id=ids[0],
                        first_index=len(notices),
                    )
                )
        return _Settlement(status, result, outcomes, notices, postponed)

    def _answer(
        self,
        target: Target,
        text: str,
        *,
        session_id: SessionId,
        turn_id: TurnId,
        inbox_id: InboxId,
        reply_to: PlatformMessageId | None,
        preview: Preview | None,
        voice: VoiceJob | None,
    ) -> list[Chunk]:
        """The chunks of an answer: its text cut to the platform's limit (the first replacing
        the streamed preview), and its voice note when it was spoken."""
        limits = self.ctx.channels.limits(target.platform, target.account)
        not_before = self.feedback.not_before(target.chat, preview)
        edit_of = None if preview is None else preview.message_id
        spoken = None if voice is None else voice.spoken
        if spoken is None or edit_of is not None:
            chunks = reply_chunks(
                target,
                text,
                limits,
                session_id=session_id,
                turn_id=turn_id,
                inbox_id=inbox_id,
                reply_to=reply_to,
                edit_of=edit_of,
                not_before=not_before,
            )
            if spoken is not None:
                # The streamed preview already shows the answer: the voice note follows it.
                chunks.append(
                    voice_chunk(
                        target,
                        replace(spoken, text=""),
                        limits,
                        session_id=session_id,
                        turn_id=turn_id,
                        inbox_id=inbox_id,
                        chunk_index=len(chunks),
                    )
                )
            return chunks
        # The voice note first (its text as caption where shown), then the rest as text.
        chunks = [
            voice_chunk(
                target,
                spoken,
                limits,
                session_id=session_id,
                turn_id=turn_id,
                inbox_id=inbox_id,
                reply_to=reply_to,
                not_before=not_before,
            )
        ]
        if spoken.rest:
            rest = reply_chunks(
                target,
                spoken.rest,
                limits,
                session_id=session_id,
                turn_id=turn_id,
                inbox_id=inbox_id,
                not_before=not_before,
            )
            chunks.extend(replace(c, chunk_index=c.chunk_index + 1) for c in rest)
        return chunks

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
                self.ctx.metrics.outcomes.labels(outcome=str(outcome)).inc(n)
        await inbox_sql.requeue(conn, leftover)
        if notices:
            await enqueue(conn, notices)

    async def _agent_turn(
        self,
        what: str,
        session: SessionInfo,
        progress: TurnProgress,
        running: Running,
        preview: Preview | None,
        *,
        operator: bool = False,
        sender: str | None = None,
        others: frozenset[str] = frozenset(),
        group: bool = False,
        media: TurnMedia | None = None,
        history: History | None = None,
        voice: VoiceJob | None = None,
        agent: Agent,
    ) -> TurnFailure | None:
        """Run the agent; its failure, or None when it answered.

        A child of the manager's TaskGroup, so nothing but cancellation may leave it: an
        exception escaping here would stop every lane and the daemon with them.
        """
        failure = await run_agent(
            lambda: agent.run_turn(
                session,
                progress,
                on_token=None if preview is None else preview.token,
                steer=running.steer,
                operator=operator,
                sender=sender,
                others=others,
                group=group,
                turn_id=running.turn_id,
                media=media,
                history=history,
            ),
            timeout=self.ctx.config.turn_timeout,
            what=what,
            on_failure=self.ctx.failed,
        )
        running.finishing = True
        if failure is None and voice is not None:
            await self.voice_replies.speak(voice, progress.final_text, running.steer.taken)
        return failure


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


def _user_message(row: InboxRow, content: str | None = None) -> ChatMessage:
    """How an inbound message appears in history: in groups, with who wrote it. `content`:
    the text to store instead of the row's (a `/<skill>` invocation carries the skill)."""
    text = row.content if content is None else content
    if row.is_direct:
        return ChatMessage(Role.USER, text)
    name = row.sender_name or row.sender_id
    return ChatMessage(Role.USER, f"[{name}] {text}")
