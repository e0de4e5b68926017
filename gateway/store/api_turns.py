"""API requests tried again: what an earlier try of the same request left in a session.

A client that got 503 (the openai SDK does so by itself) sends the same request again. The
API recognises it so the question is stored once and answered once:
- a try that failed before producing anything leaves no message (`forget_question`), so its
  retry is a first try;
- a try whose tools ran keeps its question: the retry continues it (`earlier_try`) instead
  of asking it again;
- with an `Idempotency-Key`, a retry of an answered request gets the stored answer.
Each function runs in the caller's transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.contracts.ids import SessionId, TurnId
from gateway.contracts.messages import utcnow
from gateway.store.tables import messages, sessions, turns

MAX_KEY_LENGTH = 256
"""`Idempotency-Key` values are at most this long (`turns.idempotency_key`)."""


class KeyReused(ValueError):
    """The `Idempotency-Key` names an earlier request with a different question."""


@dataclass(frozen=True, slots=True)
class EarlierTry:
    """What an earlier try of the same request left."""

    turn_id: TurnId
    answer: str | None
    """The stored answer when that try completed (send it again), else None (continue it:
    its question is in the history already)."""


async def earlier_try(
    conn: AsyncConnection,
    session_id: SessionId,
    text: str,
    *,
    key: str | None,
    window: float,
) -> EarlierTry | None:
    """The earlier try this request repeats, or None (a new request: store its question).

    With `key`: the turns made under it, whatever their age (KeyReused when their question
    differs from `text`). Without: the session's last question, when it is `text`, no later
    turn completed, and it was asked within `window` seconds.
    """
    if key is not None:
        return await _keyed(conn, session_id, text, key)
    last = (
        await conn.execute(
            select(messages.c.turn_id, messages.c.content, messages.c.created_at)
            .where(messages.c.session_id == session_id, messages.c.role == "user")
            .order_by(messages.c.id.desc())
            .limit(1)
        )
    ).first()
    if last is None or last.turn_id is None or last.content != text:
        return None
    if last.created_at < utcnow() - timedelta(seconds=window):
        return None
    answered = await conn.scalar(
        select(func.count())
        .select_from(turns)
        .where(
            turns.c.session_id == session_id,
            turns.c.id >= last.turn_id,
            turns.c.status == "completed",
        )
    )
    return None if answered else EarlierTry(TurnId(last.turn_id), None)


async def _keyed(
    conn: AsyncConnection, session_id: SessionId, text: str, key: str
) -> EarlierTry | None:
    tried = (
        await conn.execute(
            select(turns.c.id, turns.c.status)
            .where(turns.c.session_id == session_id, turns.c.idempotency_key == key)
            .order_by(turns.c.id)
        )
    ).all()
    if not tried:
        return None
    ids = [TurnId(t.id) for t in tried]
    asked = (
        await conn.execute(
            select(messages.c.content)
            .where(messages.c.turn_id.in_(ids), messages.c.role == "user")
            .order_by(messages.c.id)
            .limit(1)
        )
    ).scalar()
    if asked is not None and asked != text:
        raise KeyReused(
            "this Idempotency-Key was used for a different request in this session; "
            "send a new key with a new request"
        )
    done = [t for t in tried if t.status == "completed"]
    if done:
        return EarlierTry(TurnId(done[-1].id), await _answer(conn, TurnId(done[-1].id)))
    if asked is None:
        return None  # no try kept the question: this one asks it
    return EarlierTry(ids[-1], None)


async def _answer(conn: AsyncConnection, turn_id: TurnId) -> str:
    """The final answer of a completed turn ("" when it has none)."""
    rows = (
        await conn.execute(
            select(messages.c.content, messages.c.tool_calls, messages.c.interrupted)
            .where(messages.c.turn_id == turn_id, messages.c.role == "assistant")
            .order_by(messages.c.id.desc())
        )
    ).all()
    for row in rows:
        if not row.tool_calls and not row.interrupted:
            return str(row.content)
    return ""


async def mark(conn: AsyncConnection, turn_id: TurnId, key: str) -> None:
    """Record that `turn_id` answers the request sent with `Idempotency-Key: key`."""
    await conn.execute(update(turns).where(turns.c.id == turn_id).values(idempotency_key=key))


async def forget_question(conn: AsyncConnection, session_id: SessionId, turn_id: TurnId) -> int:
    """Remove the messages of a turn that failed before producing anything (its question): the
    caller was refused, so the history holds nothing of the request. The turn row stays, with
    its status and error. Returns how many messages went."""
    gone = (await conn.execute(delete(messages).where(messages.c.turn_id == turn_id))).rowcount
    if gone:
        await conn.execute(
            update(sessions)
            .where(sessions.c.id == session_id)
            .values(message_count=sessions.c.message_count - gone)
        )
    return int(gone or 0)
