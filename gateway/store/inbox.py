"""The inbox: every accepted inbound message is a row, and its queue state lives there.

Status: `pending` (waiting for a turn; `steer` rows wait to be injected into the running
turn), `running` (taken by the turn `turn_id`), `done` (with exactly one outcome). A pending
row that already has a `turn_id` was cut off by a stop: its user message is in the history
and the next turn answers it without storing it twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from sqlalchemy import RowMapping, and_, case, delete, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from gateway.contracts.ids import (
    AccountId,
    ChatId,
    ExternalUserId,
    InboxId,
    Origin,
    PlatformMessageId,
    SessionKey,
    ThreadId,
    TurnId,
    UserId,
)
from gateway.contracts.messages import Attachment, InboundMessage, utcnow
from gateway.store import Store
from gateway.store.sql import insert_ignore
from gateway.store.tables import inbox, messages, sessions, turns
from gateway.store.types import aware


class Outcome(StrEnum):
    """What finally happened to an inbound message (recorded exactly once)."""

    ANSWERED = "answered"
    MERGED = "merged"
    STEERED = "steered"
    DROPPED = "dropped"
    REJECTED = "rejected"


class Status(StrEnum):
    """Where an inbound message is in its session's queue."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"


@dataclass(frozen=True, slots=True)
class ApiMessage:
    """A question asked through the HTTP API or the terminal (stored in history only)."""

    received_at: datetime
    text: str
    session_key: SessionKey
    turn_status: str | None
    """Its turn's status (`completed`, `running`, `failed`, …), None before it started."""


@dataclass(frozen=True, slots=True)
class InboxRow:
    """One stored inbound message."""

    id: InboxId
    platform: str
    account: AccountId
    platform_message_id: PlatformMessageId
    session_key: SessionKey
    chat_id: ChatId
    thread_id: ThreadId | None
    sender_id: ExternalUserId
    sender_name: str
    text: str
    is_direct: bool
    kind: str
    priority: int
    steer: bool
    attempts: int
    status: Status
    outcome: Outcome | None
    outcome_detail: str | None
    turn_id: TurnId | None
    user_id: UserId | None
    received_at: datetime
    accepted_at: datetime
    reply_to: PlatformMessageId | None = None
    attachments: tuple[Attachment, ...] = ()

    @property
    def content(self) -> str:
        """The text with a line per attachment, as the agent sees it."""
        lines = [
            f"[attached file: {a.filename or a.path.name} ({a.mime_type}, {a.size} bytes) "
            f"saved at {a.path}]"
            if a.transcript is None
            else f"[voice note {a.filename or a.path.name}, transcribed]: {a.transcript}"
            for a in self.attachments
        ]
        return "\n".join([self.text, *lines]) if self.text else "\n".join(lines)

    @property
    def is_command(self) -> bool:
        """Commands bypass the queue."""
        return self.kind == "command"


async def insert(
    conn: AsyncConnection,
    message: InboundMessage,
    *,
    key: SessionKey,
    user_id: UserId | None,
    text: str | None = None,
    kind: str = "message",
    priority: int = 0,
    steer: bool = False,
    outcome: Outcome | None = None,
    detail: str | None = None,
) -> InboxId | None:
    """Store a message in the caller's transaction; None when it was already stored."""
    new_id = await insert_ignore(
        conn,
        inbox,
        {
            "platform": str(message.platform),
            "account": message.account,
            "platform_message_id": message.platform_message_id,
            "session_key": key,
            "chat_id": message.chat_id,
            "thread_id": message.thread_id,
            "sender_id": message.sender.id,
            "sender_name": message.sender.display_name[:256],
            "text": message.text if text is None else text,
            "payload": _payload(message),
            "received_at": message.received_at,
            "accepted_at": utcnow(),
            "status": str(Status.DONE if outcome else Status.PENDING),
            "outcome": None if outcome is None else str(outcome),
            "outcome_detail": detail,
            "user_id": user_id,
            "is_direct": message.is_direct,
            "kind": kind,
            "priority": priority,
            "steer": steer,
            "attempts": 0,
        },
    )
    return None if new_id is None else InboxId(new_id)


async def by_platform_id(
    conn: AsyncConnection, platform: str, account: str, message: PlatformMessageId
) -> InboxRow | None:
    """In the caller's transaction: the row of a platform message, None when not stored."""
    row = (
        (
            await conn.execute(
                select(inbox).where(
                    inbox.c.platform == platform,
                    inbox.c.account == account,
                    inbox.c.platform_message_id == message,
                )
            )
        )
        .mappings()
        .first()
    )
    return None if row is None else _row(row)


async def waiting_edit(
    conn: AsyncConnection, platform: str, account: str, original: PlatformMessageId
) -> InboxRow | None:
    """In the caller's transaction: the newest edit of `original` (a row whose id is
    `<original>:e<stamp>`) still waiting for a turn, None when there is none."""
    pattern = original.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    row = (
        (
            await conn.execute(
                select(inbox)
                .where(
                    inbox.c.platform == platform,
                    inbox.c.account == account,
                    inbox.c.platform_message_id.like(f"{pattern}:e%", escape="\\"),
                    inbox.c.kind == "message",
                    inbox.c.status == str(Status.PENDING),
                    inbox.c.turn_id.is_(None),
                )
                .order_by(inbox.c.id.desc())
                .limit(1)
            )
        )
        .mappings()
        .first()
    )
    return None if row is None else _row(row)


async def replace_text(
    conn: AsyncConnection, row: InboxRow, text: str, *, edit: InboxId, at: datetime
) -> bool:
    """In the caller's transaction: a waiting message's text replaced by its edit's (the
    edit's row id and time kept in its payload); False when it no longer waits (a turn took
    it, or it was settled)."""
    payload: dict[str, Any] = {}
    if row.reply_to:
        payload["reply_to"] = row.reply_to
    if row.attachments:
        payload["attachments"] = attachments_json(row.attachments)
    payload["edited"] = {"by": int(edit), "at": at.isoformat(), "was": row.text[:2000]}
    result = await conn.execute(
        update(inbox)
        .where(
            inbox.c.id == row.id,
            inbox.c.status == str(Status.PENDING),
            inbox.c.turn_id.is_(None),
        )
        .values(text=text, payload=payload)
    )
    return bool(result.rowcount)


async def discard(conn: AsyncConnection, row_id: InboxId) -> None:
    """In the caller's transaction: forget a row inserted in it (decided otherwise)."""
    await conn.execute(delete(inbox).where(inbox.c.id == row_id))


async def count_waiting(conn: AsyncConnection, key: SessionKey) -> int:
    """Messages of the session waiting for a turn (commands and steer rows excluded)."""
    value = await conn.scalar(
        select(func.count())
        .select_from(inbox)
        .where(
            inbox.c.session_key == key,
            inbox.c.status == str(Status.PENDING),
            inbox.c.kind == "message",
            inbox.c.steer.is_(False),
        )
    )
    return int(value or 0)


async def has_pending(conn: AsyncConnection, key: SessionKey) -> bool:
    """Whether any message of the session waits (steer rows included)."""
    found = await conn.scalar(
        select(inbox.c.id)
        .where(
            inbox.c.session_key == key,
            inbox.c.status == str(Status.PENDING),
            inbox.c.kind == "message",
        )
        .limit(1)
    )
    return found is not None


async def pending(
    conn: AsyncConnection, key: SessionKey, *, kind: str = "message"
) -> list[InboxRow]:
    """The session's pending rows of that kind, in the order they are to be handled."""
    rows = (
        (
            await conn.execute(
                select(inbox)
                .where(
                    inbox.c.session_key == key,
                    inbox.c.status == str(Status.PENDING),
                    inbox.c.kind == kind,
                )
                .order_by(inbox.c.priority.desc(), inbox.c.id)
            )
        )
        .mappings()
        .all()
    )
    return [_row(r) for r in rows]


async def take(
    conn: AsyncConnection,
    ids: Sequence[InboxId],
    turn_id: TurnId,
    *,
    texts: Sequence[str] | None = None,
) -> int:
    """pending → running in `turn_id` (one more attempt each); returns how many were still
    pending (a /stop may have settled some since they were read). With `texts` (one per id,
    as read), a row whose text changed since (an edit) is not taken either."""
    still: ColumnElement[bool] = inbox.c.id.in_(list(ids))
    if texts is not None:
        still = or_(
            *(and_(inbox.c.id == i, inbox.c.text == t) for i, t in zip(ids, texts, strict=True))
        )
    result = await conn.execute(
        update(inbox)
        .where(still, inbox.c.status == str(Status.PENDING))
        .values(
            status=str(Status.RUNNING),
            turn_id=turn_id,
            steer=False,
            attempts=inbox.c.attempts + 1,
        )
    )
    return int(result.rowcount or 0)


async def take_command(conn: AsyncConnection, inbox_id: InboxId, instance: str) -> bool:
    """pending → running for a command row, run by `instance`; False when someone else has
    taken it. (If that instance dies, the row is given back once it counts as gone.)"""
    result = await conn.execute(
        update(inbox)
        .where(inbox.c.id == inbox_id, inbox.c.status == str(Status.PENDING))
        .values(status=str(Status.RUNNING), attempts=inbox.c.attempts + 1, claimed_by=instance)
    )
    return bool(result.rowcount)


async def settle(
    conn: AsyncConnection,
    ids: Sequence[InboxId],
    outcome: Outcome,
    *,
    turn_id: TurnId | None = None,
    detail: str | None = None,
    only_pending: bool = False,
) -> int:
    """Record the final outcome of rows that have none yet; return how many were settled.

    With `only_pending`, rows a turn has already taken are left to that turn.
    """
    if not ids:
        return 0
    values: dict[str, Any] = {
        "status": str(Status.DONE),
        "outcome": str(outcome),
        "outcome_detail": detail,
        "steer": False,
    }
    if turn_id is not None:
        values["turn_id"] = turn_id
    open_ = (
        inbox.c.status == str(Status.PENDING)
        if only_pending
        else inbox.c.status != str(Status.DONE)
    )
    result = await conn.execute(
        update(inbox).where(inbox.c.id.in_(list(ids)), open_).values(**values)
    )
    return int(result.rowcount or 0)


async def requeue(
    conn: AsyncConnection,
    ids: Sequence[InboxId],
    *,
    turn_id: TurnId | None = None,
    refund: bool = False,
) -> None:
    """running / steer → plain pending (the turn stopped before answering them).

    `turn_id`: the turn that already stored them in the history (not to be stored again).
    `refund`: the try does not count towards the attempts after which a message is given up
    (it failed for a reason outside the message, such as the model being unreachable).
    """
    values: dict[str, Any] = {"status": str(Status.PENDING), "steer": False}
    if turn_id is not None:
        values["turn_id"] = turn_id
    if refund:
        values["attempts"] = case((inbox.c.attempts > 0, inbox.c.attempts - 1), else_=0)
    await conn.execute(
        update(inbox)
        .where(inbox.c.id.in_(list(ids)), inbox.c.status != str(Status.DONE))
        .values(**values)
    )


async def unsteer(conn: AsyncConnection, ids: Sequence[InboxId]) -> None:
    """Waiting steer rows → plain waiting rows, each for a turn of its own. A row a turn has
    taken or settled meanwhile is left as it is."""
    await conn.execute(
        update(inbox)
        .where(inbox.c.id.in_(list(ids)), inbox.c.status == str(Status.PENDING))
        .values(steer=False)
    )


async def release_running(conn: AsyncConnection, key: SessionKey) -> int:
    """The session's rows a turn took but never settled (its settling write failed: the
    database went away) → pending again, keeping their turn id and attempts, so that they are
    the next turn's, ahead of later messages. Returns how many."""
    result = await conn.execute(
        update(inbox)
        .where(inbox.c.session_key == key, inbox.c.status == str(Status.RUNNING))
        .values(status=str(Status.PENDING), steer=False)
    )
    return int(result.rowcount or 0)


async def restore_pending(conn: AsyncConnection, key: SessionKey) -> int:
    """The session's waiting rows that an earlier turn already stored in the history (cut
    off, or tried while the model was away) are stored again by their next turn: for a new
    conversation (`/new`), whose history does not hold them. Returns how many."""
    result = await conn.execute(
        update(inbox)
        .where(
            inbox.c.session_key == key,
            inbox.c.status == str(Status.PENDING),
            inbox.c.turn_id.is_not(None),
        )
        .values(turn_id=None)
    )
    return int(result.rowcount or 0)


class Inbox:
    """Queries of the inbox table that are their own transactions."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def recover(self) -> list[SessionKey]:
        """After a stop: rows taken by a turn that never finished go back to pending.

        Returns the session keys with pending rows (to be woken).
        """
        async with self.store.write() as conn:
            await conn.execute(
                update(inbox)
                .where(inbox.c.status == str(Status.RUNNING))
                .values(status=str(Status.PENDING))
            )
            await conn.execute(
                update(inbox)
                .where(inbox.c.status == str(Status.PENDING), inbox.c.steer.is_(True))
                .values(steer=False)
            )
            rows = (
                await conn.execute(
                    select(inbox.c.session_key, func.min(inbox.c.id))
                    .where(inbox.c.status == str(Status.PENDING))
                    .group_by(inbox.c.session_key)
                    .order_by(func.min(inbox.c.id))
                )
            ).all()
        return [SessionKey(r[0]) for r in rows]

    async def get(self, inbox_id: InboxId) -> InboxRow | None:
        """The row with that id, or None."""
        async with self.store.read() as conn:
            row = (
                (await conn.execute(select(inbox).where(inbox.c.id == inbox_id))).mappings().first()
            )
        return None if row is None else _row(row)

    async def for_session(
        self, key: SessionKey | str, *, limit: int = 200, profile: str | None = None
    ) -> list[InboxRow]:
        """The inbound messages of a session key (all epochs), oldest first. With `profile`,
        not those a turn of another profile took (the chat was bound to it then)."""
        query = select(inbox).where(inbox.c.session_key == key)
        if profile is not None:
            other = (
                select(turns.c.id)
                .join(sessions, sessions.c.id == turns.c.session_id)
                .where(turns.c.id == inbox.c.turn_id, sessions.c.profile != profile)
            )
            query = query.where(~other.exists())
        async with self.store.read() as conn:
            rows = (
                (await conn.execute(query.order_by(inbox.c.id.desc()).limit(limit)))
                .mappings()
                .all()
            )
        return [_row(r) for r in reversed(rows)]

    async def recent(self, *, limit: int = 10) -> list[InboxRow]:
        """The newest inbound messages of every session, newest first."""
        async with self.store.read() as conn:
            rows = (
                (await conn.execute(select(inbox).order_by(inbox.c.id.desc()).limit(limit)))
                .mappings()
                .all()
            )
        return [_row(r) for r in rows]

    async def recent_api(self, *, limit: int = 10) -> list[ApiMessage]:
        """The newest questions of HTTP API and terminal sessions (they skip the inbox: their
        words go straight to the session's history), newest first, with their turn's status."""
        async with self.store.read() as conn:
            rows = (
                await conn.execute(
                    select(
                        messages.c.created_at,
                        messages.c.content,
                        sessions.c.key,
                        turns.c.status,
                    )
                    .join(sessions, sessions.c.id == messages.c.session_id)
                    .outerjoin(turns, turns.c.id == messages.c.turn_id)
                    .where(sessions.c.platform == str(Origin.API), messages.c.role == "user")
                    .order_by(messages.c.id.desc())
                    .limit(limit)
                )
            ).all()
        return [
            ApiMessage(aware(at), str(text), SessionKey(str(key)), None if st is None else str(st))
            for at, text, key, st in rows
        ]

    async def last_received(self) -> dict[str, datetime]:
        """When the newest inbound message of each platform (`platform`) and of each of its
        accounts (`platform:account`, as adapters are named) was received."""
        async with self.store.read() as conn:
            rows = (
                await conn.execute(
                    select(
                        inbox.c.platform, inbox.c.account, func.max(inbox.c.received_at)
                    ).group_by(inbox.c.platform, inbox.c.account)
                )
            ).all()
        out: dict[str, datetime] = {}
        for platform, account, at in rows:
            if at is None:
                continue
            when = aware(at)
            out[f"{platform}:{account}"] = when
            out[str(platform)] = max(when, out.get(str(platform), when))
        return out

    async def counts(self) -> dict[str, int]:
        """Rows per outcome (`pending` / `running` for rows without one yet)."""
        async with self.store.read() as conn:
            rows = (
                await conn.execute(
                    select(inbox.c.status, inbox.c.outcome, func.count()).group_by(
                        inbox.c.status, inbox.c.outcome
                    )
                )
            ).all()
        out: dict[str, int] = {}
        for status, outcome, n in rows:
            name = str(outcome) if outcome else str(status)
            out[name] = out.get(name, 0) + int(n)
        return out


def _payload(message: InboundMessage) -> dict[str, Any] | None:
    """What a row keeps beyond its columns: the reply-to id and the attachments."""
    payload: dict[str, Any] = {}
    if message.reply_to:
        payload["reply_to"] = message.reply_to
    if message.attachments:
        payload["attachments"] = attachments_json(message.attachments)
    return payload or None


def attachments_json(attachments: Sequence[Attachment]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for a in attachments:
        item: dict[str, Any] = {
            "path": str(a.path),
            "mime_type": a.mime_type,
            "size": a.size,
            "filename": a.filename,
        }
        if a.transcript is not None:
            item["transcript"] = a.transcript
        if a.blob is not None:
            item["blob"] = a.blob
        out.append(item)
    return out


def attachments_of(payload: Any) -> tuple[Attachment, ...]:
    items = payload.get("attachments") if isinstance(payload, dict) else None
    if not isinstance(items, list):
        return ()
    return tuple(
        Attachment(
            Path(a["path"]),
            str(a["mime_type"]),
            int(a["size"]),
            str(a["filename"]),
            None if a.get("transcript") is None else str(a["transcript"]),
            None if a.get("blob") is None else str(a["blob"]),
        )
        for a in items
        if isinstance(a, dict)
    )


async def set_attachments(
    conn: AsyncConnection, row: InboxRow, attachments: Sequence[Attachment]
) -> None:
    """Store `row`'s attachments as they are now (with transcripts), in the caller's
    transaction; the rest of its payload is kept."""
    payload: dict[str, Any] = {}
    if row.reply_to:
        payload["reply_to"] = row.reply_to
    if attachments:
        payload["attachments"] = attachments_json(attachments)
    await conn.execute(update(inbox).where(inbox.c.id == row.id).values(payload=payload or None))


def _row(r: RowMapping) -> InboxRow:
    payload = r["payload"] or {}
    reply_to = payload.get("reply_to") if isinstance(payload, dict) else None
    return InboxRow(
        id=InboxId(r["id"]),
        platform=str(r["platform"]),
        account=AccountId(r["account"]),
        platform_message_id=PlatformMessageId(r["platform_message_id"]),
        session_key=SessionKey(r["session_key"]),
        chat_id=ChatId(r["chat_id"]),
        thread_id=None if r["thread_id"] is None else ThreadId(r["thread_id"]),
        sender_id=ExternalUserId(r["sender_id"]),
        sender_name=str(r["sender_name"]),
        text=str(r["text"]),
        is_direct=bool(r["is_direct"]),
        kind=str(r["kind"]),
        priority=int(r["priority"]),
        steer=bool(r["steer"]),
        attempts=int(r["attempts"]),
        status=Status(r["status"]),
        outcome=None if r["outcome"] is None else Outcome(r["outcome"]),
        outcome_detail=r["outcome_detail"],
        turn_id=None if r["turn_id"] is None else TurnId(r["turn_id"]),
        user_id=None if r["user_id"] is None else UserId(r["user_id"]),
        received_at=r["received_at"],
        accepted_at=r["accepted_at"],
        reply_to=None if reply_to is None else PlatformMessageId(str(reply_to)),
        attachments=attachments_of(payload),
    )
