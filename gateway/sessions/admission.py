"""Admission: an inbound message stored in one transaction with the decision about it.

The access decision, the inbox row (unique per platform message), what its busy policy does
when the session is answering already (its acknowledgement, the queue cap, a steer or an
interrupt), and a signal to the instance running the session all commit together, before the
adapter acknowledges the message to its platform.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.access import Decision, Verdict
from gateway.cluster.bus import Signal, SignalAction
from gateway.cluster.lanes import LaneState
from gateway.commands import WITH_TEXT, ParsedCommand, parse_command
from gateway.contracts.config import BusyMode, EditRule, GroupSessions, ReactionRule
from gateway.contracts.errors import ShuttingDown
from gateway.contracts.history import ChatMessage, Role
from gateway.contracts.ids import InboxId, PlatformMessageId, SessionId, SessionKey
from gateway.contracts.messages import InboundMessage, Reaction
from gateway.sessions.context import SessionContext
from gateway.sessions.keys import derive_session_key
from gateway.sessions.policies import policy
from gateway.sessions.state import INTERRUPTED_BY_NEWER, Running
from gateway.storable import storable
from gateway.store import approvals as approvals_sql
from gateway.store import inbox as inbox_sql
from gateway.store.inbox import InboxRow, Outcome, Status
from gateway.store.outbox import Chunk, Target, enqueue
from gateway.store.store import record_note

logger = logging.getLogger(__name__)

RunCommand = Callable[[InboxRow], Awaitable[None]]

APPROVAL_CHUNK = re.compile(r"approval:(\d{1,18}):\d+(?::\d+)?")
"""The idempotency key of a chunk of an approval question (`gateway/tools/approvals.py`)."""
APPROVE_EMOJI = frozenset(
    {
        "👍",
        "✅",
        "✔",
        "☑",
        "+1",
        "thumbsup",
        "white_check_mark",
        "heavy_check_mark",
        "ballot_box_with_check",
    }
)
DENY_EMOJI = frozenset(
    {"👎", "❌", "✖", "🚫", "-1", "thumbsdown", "x", "heavy_multiplication_x", "no_entry_sign"}
)


def reaction_verb(emoji: str) -> str | None:
    """`approve`, `deny` or None for a reaction's emoji (or its name), skin tone and
    variation selectors aside."""
    name = emoji.strip(":").split("::", 1)[0]
    bare = "".join(c for c in name if not ("\U0001f3fb" <= c <= "\U0001f3ff" or c == "\ufe0f"))
    if bare in APPROVE_EMOJI:
        return "approve"
    if bare in DENY_EMOJI:
        return "deny"
    return None


EDIT_OF_CURRENT = "[edit of the message you are answering; it now reads:]"
"""Before the text of an edit of the message a running turn answers (steered or queued)."""
EDIT_OF_ANSWERED = "[edit of an earlier message, answered already; it now reads:]"
"""Before the text of an edit of a message answered before."""


@dataclass(slots=True)
class _Admitted:
    """What the accept transaction decided for one message."""

    row_id: InboxId | None
    """None: delivered before (a duplicate), nothing to do."""
    outcome: Outcome | None = None
    """Settled at once (rejected, or refused by the queue cap)."""
    notices: list[Chunk] = field(default_factory=list)
    command: bool = False
    elsewhere: bool = False
    """Another instance runs the session; it was told."""
    steer_text: str | None = None
    interrupt: bool = False
    replaced: tuple[InboxId, str] | None = None
    """An edit replaced the text of this waiting message (a steer message: in memory too)."""


class Admission:
    """The adapters' InboundSink side of the session manager."""

    def __init__(self, ctx: SessionContext, run_command: RunCommand) -> None:
        self.ctx = ctx
        self.run_command = run_command
        self._last_ack: dict[SessionKey, float] = {}
        self._last_full: dict[SessionKey, float] = {}
        """When each session was last told its queue is full (rate-limited like acks)."""

    async def accept(self, message: InboundMessage) -> None:
        """Store an inbound message durably, then act on it. Raises ShuttingDown.

        Returns once the message is committed (the adapter acknowledges it after that); a
        message already stored (same platform, account and platform message id) is ignored.
        """
        ctx = self.ctx
        if not ctx.accepting:
            # Draining: hold the adapter here, unacknowledged, until it is stopped (it keeps
            # sending meanwhile); the platform redelivers the message to the next process.
            await ctx.closed.wait()
            raise ShuttingDown("Herald is shutting down; the platform will redeliver")
        message = storable(message)
        platform = str(message.platform)
        section = ctx.platforms.get((platform, str(message.account)))
        groups = section.group_sessions if section else GroupSessions.CHAT
        key = derive_session_key(message, groups)
        if message.edit_of is not None:
            message, key = await self._edit_session(message, key)
        unbound = await self._unbound_turn(message, key)
        if message.attachments and ctx.files is not None:  # bytes into the blob store
            message = await ctx.files.keep_received(message)
        target = Target(platform, message.account, message.chat_id, message.thread_id)
        # An edit's text is words, never a command: `/stop` typed into an edit stops nothing.
        parsed = None if message.edit_of is not None else parse_command(message.text)

        admitted = await ctx.store.unit(
            lambda conn: self._admit(conn, message, key, target, parsed, unbound=unbound)
        )
        if admitted.row_id is None:
            logger.debug("duplicate delivery of %s ignored", message.platform_message_id)
            return
        ctx.cancel_review(key)  # the person is talking again: the review of their last turn stops
        ctx.metrics.inbound.labels(platform=platform, account=message.account).inc()
        if admitted.outcome is not None:
            ctx.metrics.outcomes.labels(outcome=str(admitted.outcome)).inc()
        if admitted.notices:
            ctx.on_outbox()
        if admitted.replaced is not None:
            self._replace_steer(key, *admitted.replaced, unbound)
        if admitted.outcome is not None or admitted.elsewhere:
            return
        if admitted.command:
            row = await inbox_sql.Inbox(ctx.store).get(admitted.row_id)
            assert row is not None
            await self.run_command(row)
            return
        lane = ctx.lanes.get(key)
        running = lane.running if lane else None
        if running is not None and admitted.row_id not in running.ids:
            if admitted.steer_text is not None and not await ctx.steers_into(
                running, platform, message.account, message.chat_id, message.thread_id
            ):
                await self._unsteer(admitted.row_id)  # its own turn, of the chat's profile now
            elif admitted.steer_text is not None:
                speaker = ctx.speaker(
                    platform,
                    str(message.sender.id),
                    message.sender.display_name,
                    direct=message.is_direct,
                    account=message.account,
                )
                running.steer.add(
                    admitted.row_id,
                    admitted.steer_text,
                    speaker=speaker,
                    files=bool(message.attachments),
                )
            if admitted.interrupt:
                running.cancel(INTERRUPTED_BY_NEWER)
        ctx.wake(key)

    async def _unsteer(self, row_id: InboxId) -> None:
        """A message stored to be steered waits for a turn of its own instead (a failed write
        leaves it to the next claim of its session, which turns steer rows into plain ones)."""
        try:
            async with self.ctx.store.write() as conn:
                await inbox_sql.unsteer(conn, [row_id])
        except Exception as err:
            logger.warning("could not give message %s a turn of its own yet: %s", row_id, err)

    async def _unbound_turn(self, message: InboundMessage, key: SessionKey) -> Running | None:
        """The turn running here in `key` when the chat is bound to another profile now: no
        message is steered into it (it is queued instead, and told so), and a waiting steer
        message an edit changes leaves that turn."""
        lane = self.ctx.lanes.get(key)
        running = lane.running if lane else None
        if running is None or await self.ctx.steers_into(
            running, str(message.platform), message.account, message.chat_id, message.thread_id
        ):
            return None
        return running

    async def _edit_session(
        self, message: InboundMessage, key: SessionKey
    ) -> tuple[InboundMessage, SessionKey]:
        """An edit belongs to the session (and thread) of the message it changes, whatever
        thread its event names (a Slack DM message gets a `thread_ts` once replied under)."""
        assert message.edit_of is not None
        async with self.ctx.store.read() as conn:
            original = await inbox_sql.by_platform_id(
                conn, str(message.platform), message.account, message.edit_of
            )
        if (
            original is None
            or original.outcome is Outcome.REJECTED
            or original.sender_id != message.sender.id
        ):
            return message, key
        return replace(message, thread_id=original.thread_id), original.session_key

    async def _admit(
        self,
        conn: AsyncConnection,
        message: InboundMessage,
        key: SessionKey,
        target: Target,
        parsed: ParsedCommand | None,
        *,
        unbound: Running | None = None,
    ) -> _Admitted:
        """In one write transaction (one trip to SQLite's thread): who may write, and the
        row stored as a command, a queued message or a rejection, with its notices.
        `unbound`: the running turn of a profile the chat is no longer bound to."""
        ctx = self.ctx
        decision = await ctx.access.decide(conn, message) if ctx.access else None
        if decision is not None and decision.verdict is not Verdict.ALLOW:
            admitted = await self._reject(conn, message, key, target, decision)
        elif message.edit_of is not None:
            admitted = await self._edit(conn, message, key, target, unbound)
        elif parsed is not None and (parsed.command not in WITH_TEXT or not parsed.arg):
            row_id = await inbox_sql.insert(conn, message, key=key, user_id=None, kind="command")
            admitted = _Admitted(row_id, command=True)
        else:
            text = message.text if parsed is None else parsed.arg
            forced = None if parsed is None else BusyMode(str(parsed.command))
            admitted = await self._queue(
                conn,
                message=message,
                key=key,
                target=target,
                text=text,
                forced=forced,
                rebound=unbound is not None,
            )
        if admitted.notices:
            await enqueue(conn, admitted.notices)
        return admitted

    async def _edit(
        self,
        conn: AsyncConnection,
        message: InboundMessage,
        key: SessionKey,
        target: Target,
        unbound: Running | None = None,
    ) -> _Admitted:
        """In the accept transaction: an edit of an earlier message. Waiting: its text is
        replaced. Being answered: the edit goes by the busy mode (steer and interrupt give the
        turn the new text, queue and collect answer it next). Answered: a new message marked
        as an edit, or recorded only (`edited_messages: ignore`). Never stored: a new message.
        An earlier edit of it still waiting takes the newest edit's text instead.
        """
        assert message.edit_of is not None
        platform = str(message.platform)
        original = await inbox_sql.by_platform_id(conn, platform, message.account, message.edit_of)
        if original is not None and original.outcome is Outcome.REJECTED:
            original = None
        if original is not None and original.sender_id != message.sender.id:
            # An edit never changes who wrote it.
            row_id = await inbox_sql.insert(
                conn,
                message,
                key=key,
                user_id=None,
                outcome=Outcome.DROPPED,
                detail=f"an edit of message #{original.id} by someone else",
            )
            return _Admitted(row_id, Outcome.DROPPED if row_id else None)
        lane = self.ctx.lanes.get(key)
        running = lane.running if lane else None
        taken = running.steer.taken if running is not None else []
        answering = False  # taken by a turn between reading it and replacing its text
        if (
            original is not None
            and original.status is Status.PENDING
            and original.turn_id is None
            and original.id not in taken
            and original.kind == "message"
        ):
            # In memory at once, before any await: a turn at its boundary now reads the new
            # text (checked not taken just above); the row follows when this commits.
            unsteer = self._replace_steer(key, original.id, message.text, unbound)
            replaced = await self._replace(
                conn, message, key, original, message.text, unsteer=unsteer
            )
            if replaced is not None:
                return replaced
            answering = True
        # An earlier edit of it still waiting (a flood of edits): the newest replaces it.
        earlier = await inbox_sql.waiting_edit(conn, platform, message.account, message.edit_of)
        if (
            earlier is not None
            and earlier.sender_id == message.sender.id
            and earlier.id not in taken
        ):
            prefix = next(
                (p for p in (EDIT_OF_CURRENT, EDIT_OF_ANSWERED) if earlier.text.startswith(p)),
                None,
            )
            text = message.text if prefix is None else f"{prefix} {message.text}"
            unsteer = self._replace_steer(key, earlier.id, text, unbound)  # as above
            replaced = await self._replace(conn, message, key, earlier, text, unsteer=unsteer)
            if replaced is not None:
                return replaced
        if original is None:
            return await self._queue(
                conn,
                message=message,
                key=key,
                target=target,
                text=message.text,
                forced=None,
                rebound=unbound is not None,
            )
        if not answering and (original.status is Status.DONE or original.kind != "message"):
            section = self.ctx.platforms.get((str(message.platform), str(message.account)))
            rule = getattr(section, "edited_messages", EditRule.ANSWER)
            if rule is EditRule.IGNORE:
                row_id = await inbox_sql.insert(
                    conn,
                    message,
                    key=key,
                    user_id=None,
                    outcome=Outcome.DROPPED,
                    detail=f"an edit of message #{original.id}, answered already "
                    "(edited_messages: ignore)",
                )
                return _Admitted(row_id, Outcome.DROPPED if row_id else None)
            text = f"{EDIT_OF_ANSWERED} {message.text}"
        else:
            text = f"{EDIT_OF_CURRENT} {message.text}"
        return await self._queue(
            conn,
            message=message,
            key=key,
            target=target,
            text=text,
            forced=None,
            rebound=unbound is not None,
        )

    @staticmethod
    async def _replace(
        conn: AsyncConnection,
        message: InboundMessage,
        key: SessionKey,
        row: InboxRow,
        text: str,
        *,
        unsteer: bool = False,
    ) -> _Admitted | None:
        """In the accept transaction: the edit `message` stored as merged into the waiting
        `row`, whose text becomes `text`; None (nothing stored) when a turn took `row` since
        it was read. `unsteer`: `row` waits for a turn of its own, no longer a steer message."""
        row_id = await inbox_sql.insert(
            conn,
            message,
            key=key,
            user_id=None,
            outcome=Outcome.MERGED,
            detail=f"an edit: replaced the text of waiting message #{row.id}",
        )
        if row_id is None:  # a redelivery
            return _Admitted(None)
        if await inbox_sql.replace_text(conn, row, text, edit=row_id, at=message.received_at):
            if unsteer:
                await inbox_sql.unsteer(conn, [row.id])
            return _Admitted(row_id, Outcome.MERGED, replaced=(row.id, text))
        await inbox_sql.discard(conn, row_id)
        return None

    def _replace_steer(
        self, key: SessionKey, row_id: InboxId, text: str, unbound: Running | None = None
    ) -> bool:
        """A waiting steer message's new text, where the running turn keeps it in memory.
        In `unbound` (a turn of a profile the chat is no longer bound to) the message does
        not wait any more: it leaves the turn unread (True), for a turn of its own."""
        lane = self.ctx.lanes.get(key)
        running = lane.running if lane else None
        if running is None:
            return False
        steer = running.steer
        if running is unbound:
            before = len(steer.waiting)
            steer.waiting = [(i, t) for i, t in steer.waiting if i != row_id]
            return len(steer.waiting) < before
        steer.waiting = [(i, text if i == row_id else t) for i, t in steer.waiting]
        return False

    async def _reject(
        self,
        conn: AsyncConnection,
        message: InboundMessage,
        key: SessionKey,
        target: Target,
        decision: Decision,
    ) -> _Admitted:
        """In the accept transaction: a sender not allowed (a pairing code when due)."""
        row_id = await inbox_sql.insert(
            conn,
            message,
            key=key,
            user_id=None,
            text=message.text[:500],
            outcome=Outcome.REJECTED,
            detail=decision.detail,
        )
        notices = []
        if row_id is not None and decision.verdict is Verdict.PAIR and decision.reply:
            notices.append(Chunk(f"pair:{row_id}", target, decision.reply))
        return _Admitted(row_id, Outcome.REJECTED if row_id else None, notices)

    async def _queue(
        self,
        conn: AsyncConnection,
        *,
        message: InboundMessage,
        key: SessionKey,
        target: Target,
        text: str,
        forced: BusyMode | None,
        rebound: bool = False,
    ) -> _Admitted:
        """In the accept transaction: a message for a turn, and what its busy policy does
        when its session is answering already (here or on another instance). `rebound`: the
        turn running here is of a profile the chat is no longer bound to, so a message that
        would be steered into it is queued for a turn of its own instead."""
        ctx = self.ctx
        section = ctx.platforms.get((str(message.platform), str(message.account)))
        busy_policy = policy(forced or await ctx.mode(conn, key, section))
        if rebound and busy_policy.steers:
            busy_policy = policy(BusyMode.QUEUE)
        lane = ctx.lanes.get(key)
        remote = LaneState(None, False)
        if lane is None or lane.claim is None:
            remote = await ctx.lane_store.state(conn, key)
        elsewhere = remote.owner is not None and remote.owner != ctx.instance
        busy = (lane is not None and lane.running is not None) or (elsewhere and remote.running)
        row_id = await inbox_sql.insert(
            conn,
            message,
            key=key,
            user_id=None,
            text=text,
            priority=1 if busy and busy_policy.interrupts else 0,
            steer=busy and busy_policy.steers,
        )
        admitted = _Admitted(row_id, elsewhere=elsewhere)
        if row_id is not None and busy:
            waiting = await inbox_sql.count_waiting(conn, key)
            if busy_policy.capped and waiting > ctx.config.queue_cap:
                await inbox_sql.settle(conn, [row_id], Outcome.DROPPED, detail="queue full")
                if not self._may_tell(self._last_full, key):  # a flood: told once a while
                    return _Admitted(row_id, Outcome.DROPPED)
                full = (
                    f"⚠ Not queued: {waiting - 1} messages are already waiting. "
                    "Send it again later, or /stop to clear the queue."
                )
                return _Admitted(row_id, Outcome.DROPPED, [Chunk(f"drop:{row_id}", target, full)])
            if not (lane is not None and lane.told_outage) and self._may_ack(key):
                # During a model outage the busy turn is a retry and the sender was already
                # told that their messages wait: no "still working" on top.
                admitted.notices.append(Chunk(f"ack:{row_id}", target, busy_policy.ack))
            admitted.steer_text = text if busy_policy.steers else None
            admitted.interrupt = busy_policy.interrupts
        if row_id is not None and elsewhere:
            # Another instance runs this session: tell it (sent when this commits).
            if admitted.interrupt:
                action = SignalAction.INTERRUPT
                if remote.turn_id is not None:
                    await ctx.lane_store.request_cancel(
                        conn, key, remote.turn_id, INTERRUPTED_BY_NEWER
                    )
            else:
                action = SignalAction.STEER if admitted.steer_text else SignalAction.WAKE
            await ctx.bus.publish(conn, Signal(action, key))
        return admitted

    async def react(self, reaction: Reaction) -> None:
        """A reaction (the adapters' `ReactionSink`): on one of the bot's approval questions,
        👍/✅ approve and 👎/❌ deny as the reactor's own `/approve N` or `/deny N` (the same
        checks as typing it); on another of the bot's messages, a note in its session, or a
        turn (`reactions: turn`). A stranger's reaction, a reaction to someone else's message,
        a note for a session that is not the reactor's, or one on a platform with
        `reactions: ignore`, changes nothing. Raises ShuttingDown."""
        ctx = self.ctx
        if not ctx.accepting:
            raise ShuttingDown("Herald is shutting down; the platform will redeliver")
        platform = str(reaction.platform)
        section = ctx.platforms.get((platform, str(reaction.account)))
        rule = getattr(section, "reactions", ReactionRule.IGNORE)
        if section is None or rule is ReactionRule.IGNORE:
            return
        as_message = InboundMessage(
            platform=reaction.platform,
            account=reaction.account,
            chat_id=reaction.chat_id,
            sender=reaction.sender,
            text="",
            platform_message_id=PlatformMessageId(f"{reaction.message}:r{reaction.event_id}"),
            is_direct=reaction.is_direct,
            mentions_bot=True,
            thread_id=reaction.thread_id,
            reply_to=reaction.message,
            received_at=reaction.received_at,
            raw=reaction.raw,
        )
        if ctx.access is not None and not await ctx.access.permits(as_message):
            logger.debug("%s: a reaction by a sender not allowed ignored", platform)
            return
        chunk = await ctx.outbox.sent_as(platform, reaction.account, reaction.message)
        if chunk is None:
            logger.debug("%s: a reaction to a message not Herald's ignored", platform)
            return
        # The session of the reacted message: its thread (reactions often do not say it).
        as_message = replace(as_message, thread_id=chunk.target.thread_id)
        question = APPROVAL_CHUNK.fullmatch(chunk.idempotency_key)
        verb = reaction_verb(reaction.emoji)
        if question is not None:
            if verb is not None and await self._may_decide(as_message, int(question[1])):
                await self.accept(replace(as_message, text=f"/{verb} {question[1]}"))
            return
        groups = section.group_sessions
        key = derive_session_key(as_message, groups)
        said = None
        if chunk.session_id is not None:  # the conversation the reacted message is of
            said = await ctx.store.get_session_by_id(chunk.session_id)
        if (
            said is not None
            and said.key == key
            and not await ctx.bound_to(
                said.profile, platform, reaction.account, reaction.chat_id, as_message.thread_id
            )
        ):
            # Said in this chat by a profile it is no longer bound to: that conversation gets
            # no word of the chat any more, and the profile answering now never said it (nor
            # reads it, quoted in a turn).
            logger.debug("%s: a reaction to a message of another profile ignored", platform)
            return
        snippet = " ".join(chunk.text.split())
        snippet = snippet if len(snippet) <= 80 else snippet[:79] + "…"
        text = f"[reaction {reaction.emoji} to your message «{snippet}»]"
        if rule is ReactionRule.TURN:
            await self.accept(replace(as_message, text=text))
            return
        if chunk.session_id is None:
            return
        session_id = chunk.session_id
        session = said
        if session is None or session.key != key:
            # Someone else's session (one per person in a group): no note there.
            logger.debug("%s: a reaction to a message of another session ignored", platform)
            return
        who = reaction.sender.display_name or str(reaction.sender.id)
        note = ChatMessage(Role.USER, text if reaction.is_direct else f"[{who}] {text}")

        def noted(conn: AsyncConnection) -> Awaitable[InboxId | None]:
            return self._note(conn, as_message, key, session_id, note)

        if await ctx.store.unit(noted) is not None:
            ctx.metrics.inbound.labels(platform=platform, account=reaction.account).inc()

    async def _may_decide(self, message: InboundMessage, approval_id: int) -> bool:
        """Whether the reactor could decide approval `approval_id` in its session now. A
        reaction that could not (a group member's 👍 on someone else's question, one on a
        question already decided) is ignored quietly: a reaction is not a command the bot
        answers with a refusal in the chat. `/approve` itself makes the decision."""
        ctx = self.ctx
        section = ctx.platforms.get((str(message.platform), str(message.account)))
        if section is None:
            return False
        key = derive_session_key(message, section.group_sessions)
        async with ctx.store.read() as conn:
            pending = await approvals_sql.pending_approvals(conn, key)
        row = next((r for r in pending if r.id == approval_id), None)
        if row is None:
            logger.debug(
                "%s: a reaction to approval #%d, not pending", message.platform, approval_id
            )
            return False
        sender = str(message.sender.id)
        operator = ctx.access is not None and ctx.access.is_operator(
            str(message.platform), sender, message.account
        )
        if row.requester and row.requester != f"{message.platform}:{sender}" and not operator:
            logger.info(
                "%s: a reaction to approval #%d by someone who may not decide it ignored",
                message.platform,
                approval_id,
            )
            return False
        return True

    @staticmethod
    async def _note(
        conn: AsyncConnection,
        message: InboundMessage,
        key: SessionKey,
        session_id: SessionId,
        note: ChatMessage,
    ) -> InboxId | None:
        """In one transaction: a reaction's row (settled; it deduplicates) and its note in
        the session's history. None when the reaction was stored before."""
        row_id = await inbox_sql.insert(
            conn,
            message,
            key=key,
            user_id=None,
            text=note.content,
            outcome=Outcome.MERGED,
            detail="a reaction, noted in the session's history",
        )
        if row_id is not None:
            await record_note(conn, session_id, note)
        return row_id

    async def settle(self, message: InboundMessage, detail: str) -> None:
        """Store a message its adapter handled by itself (an opt-out keyword): outcome
        `dropped` with `detail`, no turn. A message already stored is ignored. Raises
        ShuttingDown while draining."""
        ctx = self.ctx
        if not ctx.accepting:
            raise ShuttingDown("Herald is shutting down; the platform will redeliver")
        platform = str(message.platform)
        section = ctx.platforms.get((platform, str(message.account)))
        key = derive_session_key(message, section.group_sessions if section else GroupSessions.CHAT)
        async with ctx.store.write() as conn:
            row_id = await inbox_sql.insert(
                conn, message, key=key, user_id=None, outcome=Outcome.DROPPED, detail=detail
            )
        if row_id is not None:
            ctx.metrics.inbound.labels(platform=platform, account=message.account).inc()
            ctx.metrics.outcomes.labels(outcome=str(Outcome.DROPPED)).inc()

    async def may_fetch(self, message: InboundMessage) -> bool:
        """Whether `message`'s sender is allowed, so its files may be downloaded (reads only;
        `accept` still decides)."""
        return self.ctx.access is None or await self.ctx.access.permits(message)

    def _may_ack(self, key: SessionKey) -> bool:
        return self._may_tell(self._last_ack, key)

    def _may_tell(self, last: dict[SessionKey, float], key: SessionKey) -> bool:
        """Whether `key` may be told now (at most once per `ack_interval`); records it."""
        now = time.monotonic()
        interval = self.ctx.config.ack_interval
        if now - last.get(key, -math.inf) < interval:
            return False
        if len(last) > 10_000:  # bounded, whatever the number of sessions
            for k in [k for k, t in last.items() if now - t >= interval]:
                del last[k]
        last[key] = now
        return True
