"""The outbox: every outbound chunk is a row, written in the transaction that produced it.

A row is `pending` until the delivery worker claims it (`sending`, committed before the
platform is called), then `sent` or, after permanent errors, too many tries or too long a
wait, `dead`. A row found `sending` at startup had an unknown outcome: it is resent once, marked
recovered, while fresh and within `max_attempts` tries.

With several instances on one database, a chunk is taken (`Outbox.take`) only when it is
its chat's oldest unsent chunk and nothing of that chat is being sent anywhere, so a chat's
chunks go out one at a time, in order, whichever instance sends them; `claimed_by` names the
sender, and a gone instance's `sending` chunks are recovered like a stopped process's.

Chunks that carry a job run's report (`job_run_id`) are announced once every one of them is
sent or dead (`SettledReport`), inside the transaction that settled the last one; cron
listens (`Outbox.subscribe`) and records the run's delivery status.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any

from sqlalchemy import (
    ColumnElement,
    RowMapping,
    Select,
    and_,
    exists,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.chunking import split_chunks
from gateway.contracts.ids import (
    AccountId,
    ChatId,
    InboxId,
    Platform,
    PlatformMessageId,
    SessionId,
    ThreadId,
    TurnId,
)
from gateway.contracts.messages import (
    Attachment,
    Button,
    OutboundMessage,
    SendLimits,
    TextFormat,
    utcnow,
)
from gateway.store import Store
from gateway.store.instances import alive
from gateway.store.sql import insert_ignore
from gateway.store.tables import outbox
from gateway.store.types import aware


class OutboxStatus(StrEnum):
    """Where a chunk is on its way out."""

    PENDING = "pending"
    SENDING = "sending"
    SENT = "sent"
    DEAD = "dead"
    DISCARDED = "discarded"
    """A dead letter the operator gave up on (kept for the record, never sent)."""


class OutboxKind(StrEnum):
    """Why a chunk exists."""

    REPLY = "reply"
    NOTICE = "notice"
    SEND = "send"
    REPORT = "report"


FINAL_RECEIPTS = frozenset({"delivered", "read", "failed", "undelivered"})
"""Delivery reports that end a sent chunk's story (`Outbox.delivery_report`)."""


@dataclass(frozen=True, slots=True)
class Target:
    """A chat to deliver to."""

    platform: str
    account: AccountId
    chat_id: ChatId
    thread_id: ThreadId | None = None

    @property
    def chat(self) -> tuple[str, str, str]:
        """What the per-chat rate limit is keyed by (threads of a chat share it)."""
        return (self.platform, self.account, self.chat_id)


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One stored outbound chunk."""

    id: int
    idempotency_key: str
    target: Target
    text: str
    format: TextFormat
    status: OutboxStatus
    attempts: int
    next_attempt_at: datetime
    created_at: datetime
    kind: OutboxKind
    recovered: bool = False
    chunk_index: int = 0
    session_id: SessionId | None = None
    turn_id: TurnId | None = None
    inbox_id: InboxId | None = None
    reply_to: PlatformMessageId | None = None
    edit_of: PlatformMessageId | None = None
    last_error: str | None = None
    sent_at: datetime | None = None
    platform_message_id: PlatformMessageId | None = None
    receipt: str | None = None
    """The platform's latest report on the sent chunk (`delivered`, `failed`, …), if any."""
    buttons: tuple[Button, ...] = ()
    attachment: Attachment | None = None
    """The file this chunk delivers (`send_file`), if any."""

    def message(self) -> OutboundMessage:
        """The chunk as the adapter receives it."""
        return OutboundMessage(
            platform=Platform(self.target.platform),
            account=self.target.account,
            chat_id=self.target.chat_id,
            thread_id=self.target.thread_id,
            text=self.text,
            idempotency_key=self.idempotency_key,
            format=self.format,
            reply_to=self.reply_to,
            recovered=self.recovered,
            buttons=self.buttons,
            attachments=() if self.attachment is None else (self.attachment,),
        )


@dataclass(frozen=True, slots=True)
class Chunk:
    """A chunk to write: `key` is its idempotency key (unique across the outbox)."""

    key: str
    target: Target
    text: str
    kind: OutboxKind = OutboxKind.NOTICE
    format: TextFormat = TextFormat.MARKDOWN
    chunk_index: int = 0
    session_id: SessionId | None = None
    turn_id: TurnId | None = None
    inbox_id: InboxId | None = None
    reply_to: PlatformMessageId | None = None
    edit_of: PlatformMessageId | None = None
    not_before: datetime | None = None
    """Not to be sent before this (an edit must respect the platform's edit rate)."""
    job_run_id: int | None = None
    """The scheduled job run whose report this chunk carries."""
    buttons: tuple[Button, ...] = ()
    """Buttons under the message (an approval's yes and no)."""
    attachment: Attachment | None = None
    """A file to deliver with `text` (its caption); one file per chunk."""


def reply_chunks(
    target: Target,
    text: str,
    limits: SendLimits,
    *,
    session_id: SessionId,
    turn_id: TurnId,
    inbox_id: InboxId | None = None,
    reply_to: PlatformMessageId | None = None,
    edit_of: PlatformMessageId | None = None,
    not_before: datetime | None = None,
) -> list[Chunk]:
    """A turn's answer cut to the platform's limit, keyed by (session, turn, chunk index).

    The first chunk replaces the streamed preview `edit_of` when there is one.
    """
    pieces = split_chunks(text, limits.max_chunk, utf16=limits.count_utf16) or ["(no answer)"]
    return [
        Chunk(
            key=f"s{session_id}:t{turn_id}:c{i}",
            target=target,
            text=piece,
            kind=OutboxKind.REPLY,
            chunk_index=i,
            session_id=session_id,
            turn_id=turn_id,
            inbox_id=inbox_id,
            reply_to=reply_to if i == 0 else None,
            edit_of=edit_of if i == 0 else None,
            not_before=not_before,
        )
        for i, piece in enumerate(pieces)
    ]


async def enqueue(conn: AsyncConnection, chunks: Sequence[Chunk]) -> list[int]:
    """Write chunks inside the caller's transaction; an existing key is left as it is."""
    now = utcnow()
    ids: list[int] = []
    for c in chunks:
        new_id = await insert_ignore(
            conn,
            outbox,
            {
                "idempotency_key": c.key,
                "session_id": c.session_id,
                "turn_id": c.turn_id,
                "chunk_index": c.chunk_index,
                "platform": c.target.platform,
                "account": c.target.account,
                "chat_id": c.target.chat_id,
                "thread_id": c.target.thread_id,
                "reply_to": c.reply_to,
                "text": c.text,
                "format": str(c.format),
                "status": str(OutboxStatus.PENDING),
                "attempts": 0,
                "next_attempt_at": max(now, c.not_before or now),
                "recovered": False,
                "created_at": now,
                "kind": str(c.kind),
                "edit_of": c.edit_of,
                "inbox_id": c.inbox_id,
                "job_run_id": c.job_run_id,
                "buttons": [[b.label, b.command] for b in c.buttons] or None,
                "attachment": None if c.attachment is None else attachment_json(c.attachment),
            },
        )
        if new_id is not None:
            ids.append(new_id)
    return ids


@dataclass(frozen=True, slots=True)
class SettledReport:
    """Every chunk of job run `run_id`'s report was sent or died."""

    run_id: int
    failures: tuple[str, ...] = ()
    """`platform:chat: last error` of each chunk that died, oldest first; empty: all sent."""


ReportListener = Callable[[AsyncConnection, SettledReport], Awaitable[None]]
"""Called inside the transaction that settled a report's last chunk; raising rolls it back."""


class Outbox:
    """Queries of the outbox table. Every method is its own transaction."""

    def __init__(self, store: Store, *, listeners: Sequence[ReportListener] = ()) -> None:
        self.store = store
        self._listeners = list(listeners)

    def subscribe(self, listener: ReportListener) -> None:
        """Call `listener` for each report whose chunks are all settled from now on."""
        self._listeners.append(listener)

    async def enqueue(self, chunks: Sequence[Chunk]) -> list[int]:
        """Write chunks in a transaction of their own; return the new rows' ids."""
        async with self.store.write() as conn:
            return await enqueue(conn, chunks)

    async def get(self, row_id: int) -> OutboxRow | None:
        """The row with that id, or None."""
        async with self.store.read() as conn:
            row = (await conn.execute(select(outbox).where(outbox.c.id == row_id))).mappings()
            found = row.first()
        return None if found is None else _row(found)

    async def sent_as(
        self, platform: str, account: str, platform_message_id: str
    ) -> OutboxRow | None:
        """The sent chunk the platform knows by that message id (the newest, when several
        chunks edited one message), or None: not one of Herald's messages."""
        async with self.store.read() as conn:
            found = (
                (
                    await conn.execute(
                        select(outbox)
                        .where(
                            outbox.c.platform == platform,
                            outbox.c.account == account,
                            outbox.c.platform_message_id == platform_message_id,
                        )
                        .order_by(outbox.c.id.desc())
                        .limit(1)
                    )
                )
                .mappings()
                .first()
            )
        return None if found is None else _row(found)

    @staticmethod
    def _due_chats_query(
        now: datetime, platforms: Sequence[str], limit: int, away: Sequence[tuple[str, str]]
    ) -> Select[Any]:
        head = (
            select(
                outbox.c.platform,
                outbox.c.account,
                outbox.c.chat_id,
                func.min(outbox.c.id).label("first_id"),
            )
            .where(outbox.c.status == str(OutboxStatus.PENDING))
            .where(outbox.c.platform.in_(list(platforms)), *_not_away(away))
            .where(~_sending_in_chat())
            .group_by(outbox.c.platform, outbox.c.account, outbox.c.chat_id)
            .subquery()
        )
        query = (
            select(head.c.platform, head.c.account, head.c.chat_id)
            .join(outbox, outbox.c.id == head.c.first_id)
            .where(outbox.c.next_attempt_at <= now)
            .order_by(head.c.first_id)
            .limit(limit)
        )
        return query

    async def due_chats(
        self,
        now: datetime,
        *,
        platforms: Sequence[str],
        limit: int,
        away: Sequence[tuple[str, str]] = (),
    ) -> list[tuple[str, str, str]]:
        """Chats whose oldest pending chunk is due and none of whose chunks is being sent,
        oldest first (at most `limit`); the chats of the `away` accounts (platform, account)
        left out."""
        query = self._due_chats_query(now, platforms, limit, away)
        rows = await self.store.unit(lambda conn: _all(conn, query), write=False)
        return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]

    async def look(
        self,
        now: datetime,
        *,
        platforms: Sequence[str],
        limit: int,
        away: Sequence[tuple[str, str]] = (),
    ) -> tuple[list[tuple[str, str, str]], datetime | None]:
        """`due_chats(now, …)`, and when the earliest pending chunk due after `now` becomes
        due (None: none), in one read."""
        due = self._due_chats_query(now, platforms, limit, away)
        later = select(func.min(outbox.c.next_attempt_at)).where(
            outbox.c.status == str(OutboxStatus.PENDING),
            outbox.c.platform.in_(list(platforms)),
            *_not_away(away),
            outbox.c.next_attempt_at > now,
            ~_sending_in_chat(),
        )

        async def read(conn: AsyncConnection) -> tuple[list[Any], Any]:
            return await _all(conn, due), await conn.scalar(later)

        rows, value = await self.store.unit(read, write=False)
        chats = [(str(r[0]), str(r[1]), str(r[2])) for r in rows]
        return chats, None if value is None else aware(value)

    async def next_due_at(
        self, *, platforms: Sequence[str], away: Sequence[tuple[str, str]] = ()
    ) -> datetime | None:
        """When the earliest pending chunk becomes due (None when nothing is pending), not
        counting chats with a chunk being sent (whoever sends it goes on with the chat) nor
        those of the `away` accounts (platform, account)."""
        query = select(func.min(outbox.c.next_attempt_at)).where(
            outbox.c.status == str(OutboxStatus.PENDING),
            outbox.c.platform.in_(list(platforms)),
            *_not_away(away),
            ~_sending_in_chat(),
        )
        value = await self.store.unit(lambda conn: conn.scalar(query), write=False)
        if value is None:
            return None
        return aware(value)

    async def take(
        self, chat: tuple[str, str, str], *, owner: str, now: datetime, interval: float
    ) -> OutboxRow | float | None:
        """Set the chat's next chunk `sending` for `owner` and return it (attempts counted),
        when it is the chat's oldest unsent chunk, it is due, nothing of the chat is being
        sent (by any instance), and `interval` seconds have passed since the chat's last
        send. A float: seconds to wait for that spacing. None: nothing to send now.

        On PostgreSQL the chunk is locked with SKIP LOCKED: of two instances looking at one
        chat at once, one takes it and the other leaves the chat alone.
        """
        of_chat = _of_chat(chat)
        unsent = outbox.c.status.in_([str(OutboxStatus.PENDING), str(OutboxStatus.SENDING)])
        query = select(outbox).where(*of_chat, unsent).order_by(outbox.c.id).limit(1)

        async def take(conn: AsyncConnection) -> OutboxRow | float | None:
            nonlocal query
            if conn.dialect.name == "postgresql":
                query = query.with_for_update(skip_locked=True)
            found = (await conn.execute(query)).mappings().first()
            if found is None:
                return None
            row = _row(found)
            if row.status is not OutboxStatus.PENDING or row.next_attempt_at > now:
                return None  # being sent (here or elsewhere), or waiting for its retry time
            older = await conn.scalar(
                select(outbox.c.id).where(*of_chat, unsent, outbox.c.id < row.id).limit(1)
            )
            if older is not None:
                return None  # an older chunk is locked by another instance taking it
            if interval > 0:
                last = await conn.scalar(
                    select(outbox.c.sent_at)
                    .where(*of_chat, outbox.c.status == str(OutboxStatus.SENT))
                    .order_by(outbox.c.id.desc())
                    .limit(1)
                )
                if last is not None:
                    wait = interval - (now - aware(last)).total_seconds()
                    if wait > 0:
                        return wait
            await conn.execute(
                update(outbox)
                .where(outbox.c.id == row.id)
                .values(
                    status=str(OutboxStatus.SENDING),
                    attempts=outbox.c.attempts + 1,
                    claimed_by=owner or None,
                )
            )
            return replace(row, status=OutboxStatus.SENDING, attempts=row.attempts + 1)

        return await self.store.unit(take)

    async def head(self, chat: tuple[str, str, str]) -> OutboxRow | None:
        """The chat's oldest pending chunk: nothing newer may be sent before it."""
        platform, account, chat_id = chat
        async with self.store.read() as conn:
            row = (
                (
                    await conn.execute(
                        select(outbox)
                        .where(
                            outbox.c.platform == platform,
                            outbox.c.account == account,
                            outbox.c.chat_id == chat_id,
                            outbox.c.status == str(OutboxStatus.PENDING),
                        )
                        .order_by(outbox.c.id)
                        .limit(1)
                    )
                )
                .mappings()
                .first()
            )
        return None if row is None else _row(row)

    async def unsent(self, chat: tuple[str, str, str]) -> bool:
        """Whether the chat has chunks not yet sent (pending or being sent)."""
        platform, account, chat_id = chat
        query = (
            select(outbox.c.id)
            .where(
                outbox.c.platform == platform,
                outbox.c.account == account,
                outbox.c.chat_id == chat_id,
                outbox.c.status.in_([str(OutboxStatus.PENDING), str(OutboxStatus.SENDING)]),
            )
            .limit(1)
        )
        found = await self.store.unit(lambda conn: conn.scalar(query), write=False)
        return found is not None

    async def claim(self, row_id: int, owner: str = "") -> bool:
        """pending → sending (attempts + 1) for `owner`, committed before the platform is
        called; False when the row is not pending."""
        async with self.store.write() as conn:
            result = await conn.execute(
                update(outbox)
                .where(outbox.c.id == row_id, outbox.c.status == str(OutboxStatus.PENDING))
                .values(
                    status=str(OutboxStatus.SENDING),
                    attempts=outbox.c.attempts + 1,
                    claimed_by=owner or None,
                )
            )
        return bool(result.rowcount)

    async def sent(self, row_id: int, platform_message_id: str | None, at: datetime) -> bool:
        """sending → sent, with the platform's id of the message; whether the chat has other
        chunks not yet sent (read in the same transaction)."""
        return await self._set(
            row_id,
            status=str(OutboxStatus.SENT),
            sent_at=at,
            platform_message_id=platform_message_id,
            last_error=None,
        )

    async def retry_at(
        self, row_id: int, when: datetime, error: str, *, attempt: bool = True
    ) -> None:
        """Back to pending, due at `when`; `attempt=False` does not count the try."""
        values: dict[str, Any] = {}
        if not attempt:
            values["attempts"] = outbox.c.attempts - 1
        await self._set(
            row_id,
            status=str(OutboxStatus.PENDING),
            next_attempt_at=when,
            last_error=error,
            **values,
        )

    async def without_edit(self, row_id: int, error: str) -> None:
        """Back to pending, due now, to be sent as a new message (the preview is gone)."""
        await self._set(
            row_id,
            status=str(OutboxStatus.PENDING),
            edit_of=None,
            next_attempt_at=utcnow(),
            last_error=error,
        )

    async def without_voice(self, row_id: int, error: str) -> None:
        """Back to pending, due now, as its text alone (the platform refused the voice note
        that carried it as a caption)."""
        await self._set(
            row_id,
            status=str(OutboxStatus.PENDING),
            attachment=None,
            next_attempt_at=utcnow(),
            last_error=error,
        )

    async def as_plain(self, row_id: int, text: str) -> None:
        """Back to pending as plain text, due now (the platform refused the markup)."""
        await self._set(
            row_id,
            status=str(OutboxStatus.PENDING),
            format=str(TextFormat.PLAIN),
            text=text,
            next_attempt_at=utcnow(),
            attempts=outbox.c.attempts - 1,
        )

    async def delivery_report(
        self,
        platform: str,
        account: str,
        platform_message_id: str,
        status: str,
        error: str | None = None,
    ) -> bool:
        """Record a platform's report on the sent chunk with that platform message id; a
        failure's `error` becomes its last error. A final report (`FINAL_RECEIPTS`) is not
        replaced by a later non-final one (reports may arrive out of order). False when no
        chunk has that id."""
        values: dict[str, Any] = {"receipt": status[:16]}
        if error:
            values["last_error"] = error
        async with self.store.write() as conn:
            matched = await conn.scalar(
                select(func.count())
                .select_from(outbox)
                .where(
                    outbox.c.platform == platform,
                    outbox.c.account == account,
                    outbox.c.platform_message_id == platform_message_id,
                )
            )
            query = update(outbox).where(
                outbox.c.platform == platform,
                outbox.c.account == account,
                outbox.c.platform_message_id == platform_message_id,
            )
            if status not in FINAL_RECEIPTS:
                query = query.where(
                    outbox.c.receipt.is_(None) | outbox.c.receipt.not_in(list(FINAL_RECEIPTS))
                )
            await conn.execute(query.values(**values))
        return bool(matched)

    async def dead(self, row_id: int, reason: str) -> None:
        """A dead letter: never sent automatically again (`herald deliveries retry`)."""
        await self._set(row_id, status=str(OutboxStatus.DEAD), last_error=reason)

    async def _set(self, row_id: int, **values: Any) -> bool:
        """Change the row; whether its chat has other chunks not yet sent."""

        async def change(conn: AsyncConnection) -> bool:
            await conn.execute(update(outbox).where(outbox.c.id == row_id).values(**values))
            row = (
                await conn.execute(
                    select(
                        outbox.c.job_run_id, outbox.c.platform, outbox.c.account, outbox.c.chat_id
                    ).where(outbox.c.id == row_id)
                )
            ).first()
            if row is None:
                return False
            run_id, platform, account, chat_id = row
            if run_id is not None and values.get("status") in (
                OutboxStatus.SENT,
                OutboxStatus.DEAD,
            ):
                await self._settle_report(conn, int(run_id))
            unsent = outbox.c.status.in_([str(OutboxStatus.PENDING), str(OutboxStatus.SENDING)])
            other = await conn.scalar(
                select(outbox.c.id)
                .where(*_of_chat((platform, account, chat_id)), unsent, outbox.c.id != row_id)
                .limit(1)
            )
            return other is not None

        return await self.store.unit(change)

    async def _settle_report(self, conn: AsyncConnection, run_id: int) -> None:
        """A chunk of job run `run_id`'s report was sent or died: once every chunk of the
        run is settled, announce it to the listeners."""
        rows = (
            await conn.execute(
                select(outbox.c.status, outbox.c.last_error, outbox.c.platform, outbox.c.chat_id)
                .where(outbox.c.job_run_id == run_id)
                .order_by(outbox.c.id)
            )
        ).all()
        failed = (str(OutboxStatus.DEAD), str(OutboxStatus.DISCARDED))
        failures = tuple(f"{r[2]}:{r[3]}: {r[1]}" for r in rows if r[0] in failed)
        if not failures and not all(r[0] == str(OutboxStatus.SENT) for r in rows):
            return
        for listener in self._listeners:
            await listener(conn, SettledReport(run_id, failures))

    async def recover(
        self,
        *,
        max_age: float,
        max_attempts: int,
        owner: str | None = None,
        lease_ttl: float | None = None,
        started: bool = True,
    ) -> tuple[int, int]:
        """Each chunk whose send outcome is unknown is resent once, marked recovered, while it
        is fresh and has tries left; otherwise it becomes dead. Returns (to resend, dead).

        One instance (`lease_ttl` None): every `sending` chunk, at startup. Several: only the
        chunks of instances that are gone (no heartbeat for `lease_ttl`), plus, when this
        instance has just `started`, those of its own earlier life (`owner`) and those that
        name no sender (written before instances were recorded).
        """
        now = utcnow()
        cutoff = now - timedelta(seconds=max_age)
        sending: ColumnElement[bool] = outbox.c.status == str(OutboxStatus.SENDING)
        if lease_ttl is not None:
            whose: ColumnElement[bool] = and_(
                outbox.c.claimed_by.is_not(None), ~alive(outbox.c.claimed_by, now, lease_ttl)
            )
            if started:
                whose = or_(whose, outbox.c.claimed_by.is_(None), outbox.c.claimed_by == owner)
            sending = and_(sending, whose)
        async with self.store.write() as conn:
            died = (
                await conn.execute(
                    update(outbox)
                    .where(
                        sending,
                        (outbox.c.created_at < cutoff) | (outbox.c.attempts >= max_attempts),
                    )
                    .values(
                        status=str(OutboxStatus.DEAD),
                        last_error="the outcome of the last send is unknown (the process stopped)",
                    )
                    .returning(outbox.c.job_run_id)
                )
            ).all()
            resend = await conn.execute(
                update(outbox)
                .where(sending)
                .values(
                    status=str(OutboxStatus.PENDING),
                    recovered=True,
                    next_attempt_at=now,
                    claimed_by=None,
                )
            )
            for run_id in sorted({int(r[0]) for r in died if r[0] is not None}):
                await self._settle_report(conn, run_id)
        return int(resend.rowcount or 0), len(died)

    async def list(
        self,
        *,
        status: OutboxStatus | None = None,
        session_id: SessionId | None = None,
        limit: int = 50,
    ) -> list[OutboxRow]:
        """Rows, newest first."""
        query = select(outbox).order_by(outbox.c.id.desc()).limit(limit)
        if status is not None:
            query = query.where(outbox.c.status == str(status))
        if session_id is not None:
            query = query.where(outbox.c.session_id == session_id)
        async with self.store.read() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [_row(r) for r in rows]

    async def retry(self, row_id: int) -> OutboxRow:
        """A dead letter back to pending, due now, with a fresh age and tries.

        Raises LookupError when there is no dead letter with that id.
        """
        now = utcnow()
        async with self.store.write() as conn:
            result = await conn.execute(
                update(outbox)
                .where(and_(outbox.c.id == row_id, outbox.c.status == str(OutboxStatus.DEAD)))
                .values(
                    status=str(OutboxStatus.PENDING),
                    attempts=0,
                    next_attempt_at=now,
                    created_at=now,
                    last_error=None,
                    recovered=False,
                )
            )
        if not result.rowcount:
            raise LookupError(f"there is no dead letter with id {row_id}")
        row = await self.get(row_id)
        assert row is not None
        return row

    async def discard(self, row_id: int) -> OutboxRow:
        """A dead letter becomes discarded: kept for the record, never retried.

        Raises LookupError when there is no dead letter with that id.
        """
        async with self.store.write() as conn:
            result = await conn.execute(
                update(outbox)
                .where(and_(outbox.c.id == row_id, outbox.c.status == str(OutboxStatus.DEAD)))
                .values(status=str(OutboxStatus.DISCARDED))
            )
        if not result.rowcount:
            raise LookupError(f"there is no dead letter with id {row_id}")
        row = await self.get(row_id)
        assert row is not None
        return row

    async def counts(self) -> dict[str, int]:
        """Rows per status."""
        async with self.store.read() as conn:
            rows = (
                await conn.execute(select(outbox.c.status, func.count()).group_by(outbox.c.status))
            ).all()
        return {str(r[0]): int(r[1]) for r in rows}


def _not_away(away: Sequence[tuple[str, str]]) -> list[ColumnElement[bool]]:
    """Conditions leaving out the rows of the `away` accounts (platform, account)."""
    if not away:
        return []
    return [~or_(*(and_(outbox.c.platform == p, outbox.c.account == a) for p, a in sorted(away)))]


def _of_chat(chat: tuple[str, str, str]) -> tuple[ColumnElement[bool], ...]:
    platform, account, chat_id = chat
    return (outbox.c.platform == platform, outbox.c.account == account, outbox.c.chat_id == chat_id)


def _sending_in_chat() -> ColumnElement[bool]:
    """SQL, correlated with `outbox`: a chunk of the same chat is being sent."""
    other = outbox.alias("sending")
    return exists(
        select(other.c.id).where(
            other.c.status == str(OutboxStatus.SENDING),
            other.c.platform == outbox.c.platform,
            other.c.account == outbox.c.account,
            other.c.chat_id == outbox.c.chat_id,
        )
    )


def _opt_id(value: Any) -> PlatformMessageId | None:
    return None if value is None else PlatformMessageId(str(value))


def attachment_json(a: Attachment) -> dict[str, Any]:
    out: dict[str, Any] = {
        "path": str(a.path),
        "mime_type": a.mime_type,
        "size": a.size,
        "filename": a.filename,
    }
    if a.blob is not None:
        out["blob"] = a.blob
    if a.voice:
        out["voice"] = True
    return out


def attachment_of(value: Any) -> Attachment | None:
    if not isinstance(value, dict):
        return None
    return Attachment(
        Path(str(value["path"])),
        str(value["mime_type"]),
        int(value["size"]),
        str(value["filename"]),
        blob=None if value.get("blob") is None else str(value["blob"]),
        voice=value.get("voice") is True,
    )


async def _all(conn: AsyncConnection, query: Select[Any]) -> list[Any]:
    return list((await conn.execute(query)).all())


def _row(r: RowMapping) -> OutboxRow:
    return OutboxRow(
        id=int(r["id"]),
        idempotency_key=str(r["idempotency_key"]),
        target=Target(
            platform=str(r["platform"]),
            account=AccountId(r["account"]),
            chat_id=ChatId(r["chat_id"]),
            thread_id=None if r["thread_id"] is None else ThreadId(r["thread_id"]),
        ),
        text=str(r["text"]),
        format=TextFormat(r["format"]),
        status=OutboxStatus(r["status"]),
        attempts=int(r["attempts"]),
        next_attempt_at=r["next_attempt_at"],
        created_at=r["created_at"],
        kind=OutboxKind(r["kind"]),
        recovered=bool(r["recovered"]),
        chunk_index=int(r["chunk_index"]),
        session_id=None if r["session_id"] is None else SessionId(r["session_id"]),
        turn_id=None if r["turn_id"] is None else TurnId(r["turn_id"]),
        inbox_id=None if r["inbox_id"] is None else InboxId(r["inbox_id"]),
        reply_to=None if r["reply_to"] is None else PlatformMessageId(r["reply_to"]),
        edit_of=None if r["edit_of"] is None else PlatformMessageId(r["edit_of"]),
        last_error=r["last_error"],
        sent_at=r["sent_at"],
        platform_message_id=(
            None
            if r["platform_message_id"] is None
            else PlatformMessageId(r["platform_message_id"])
        ),
        receipt=r["receipt"],
        buttons=tuple(Button(str(b[0]), str(b[1])) for b in r.get("buttons") or ()),
        attachment=attachment_of(r.get("attachment")),
    )
