"""The external memory provider's sync queue: rows written in a turn's own transaction, sent
in `id` order per person, deleted once sent, kept as dead past `memory.sync_max_age`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import ColumnElement, RowMapping, and_, delete, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.contracts.ids import SessionId, TurnId, UserId
from gateway.contracts.messages import utcnow
from gateway.store.tables import memory_syncs
from gateway.store.types import aware


class SyncKind(StrEnum):
    """What a queued sync carries."""

    TURN = "turn"
    """`payload`: {"messages": [{"speaker": "person"|"agent", "content": …}, …]}."""
    MEMORY_WRITE = "memory_write"
    """`payload`: {"target": "user"|"memory", "action": …, "content": …}."""
    SESSION_END = "session_end"
    """`payload`: {}."""


@dataclass(frozen=True, slots=True)
class SyncRow:
    """One queued (or dead) sync."""

    id: int
    person: UserId
    kind: SyncKind
    session_key: str
    session_id: SessionId | None
    turn_id: TurnId | None
    payload: dict[str, Any]
    created_at: datetime
    attempts: int
    next_attempt_at: datetime
    last_error: str | None
    dead_at: datetime | None
    sending_at: datetime | None = None

    @property
    def resent(self) -> bool:
        """Whether an earlier try may have reached the provider (it failed, or the process
        died while it was in flight)."""
        return self.attempts > 0 or self.sending_at is not None


@dataclass(frozen=True, slots=True)
class SyncCounts:
    """The queue at a glance."""

    queued: int
    dead: int
    oldest_queued: datetime | None


async def enqueue(
    conn: AsyncConnection,
    person: UserId,
    kind: SyncKind,
    payload: dict[str, Any],
    *,
    session_key: str,
    session_id: SessionId | None = None,
    turn_id: TurnId | None = None,
) -> int:
    """In the caller's transaction: queue one sync of `person`; its id."""
    now = utcnow()
    result = await conn.execute(
        insert(memory_syncs)
        .values(
            person=person,
            kind=str(kind),
            session_key=session_key,
            session_id=session_id,
            turn_id=turn_id,
            payload=payload,
            created_at=now,
            attempts=0,
            next_attempt_at=now,
        )
        .returning(memory_syncs.c.id)
    )
    return int(result.scalar_one())


async def heads(conn: AsyncConnection, now: datetime, limit: int = 64) -> list[SyncRow]:
    """Each person's oldest live sync that is due at `now` (at most `limit`, oldest first).

    Only a person's head is ever sent, so their syncs reach the provider in order; a person
    whose head waits (backoff) holds back only their own syncs.
    """
    first = (
        select(func.min(memory_syncs.c.id).label("id"))
        .where(memory_syncs.c.dead_at.is_(None))
        .group_by(memory_syncs.c.person)
        .subquery()
    )
    rows = await conn.execute(
        select(memory_syncs)
        .join(first, memory_syncs.c.id == first.c.id)
        .where(memory_syncs.c.next_attempt_at <= now)
        .order_by(memory_syncs.c.id)
        .limit(limit)
    )
    return [_row(r) for r in rows.mappings()]


async def next_due(conn: AsyncConnection) -> datetime | None:
    """When the earliest live sync is due (None: the queue is empty)."""
    value = await conn.scalar(
        select(func.min(memory_syncs.c.next_attempt_at)).where(memory_syncs.c.dead_at.is_(None))
    )
    return None if value is None else aware(value)


async def sending(conn: AsyncConnection, sync_id: int) -> None:
    """A try of the sync starts now."""
    await conn.execute(
        update(memory_syncs).where(memory_syncs.c.id == sync_id).values(sending_at=utcnow())
    )


async def sent(conn: AsyncConnection, sync_id: int) -> None:
    """Forget a sync the provider took."""
    await conn.execute(delete(memory_syncs).where(memory_syncs.c.id == sync_id))


async def retry(conn: AsyncConnection, sync_id: int, error: str, at: datetime) -> None:
    """A try failed with `error`; try again at `at`."""
    await conn.execute(
        update(memory_syncs)
        .where(memory_syncs.c.id == sync_id)
        .values(attempts=memory_syncs.c.attempts + 1, last_error=error[:2000], next_attempt_at=at)
    )


async def give_up(conn: AsyncConnection, sync_id: int, error: str) -> None:
    """Keep a sync as dead: it is never sent again (the person's next one goes on)."""
    await conn.execute(
        update(memory_syncs)
        .where(memory_syncs.c.id == sync_id)
        .values(attempts=memory_syncs.c.attempts + 1, last_error=error[:2000], dead_at=utcnow())
    )


async def reassign(conn: AsyncConnection, source: UserId, into: UserId) -> None:
    """In the caller's transaction: `source`'s syncs become `into`'s (identities linked)."""
    await conn.execute(
        update(memory_syncs).where(memory_syncs.c.person == source).values(person=into)
    )


async def counts(conn: AsyncConnection) -> SyncCounts:
    """How many syncs wait, how many are dead, and since when the oldest waits."""
    live = memory_syncs.c.dead_at.is_(None)
    row = (
        await conn.execute(
            select(
                func.count().filter(live),
                func.count().filter(memory_syncs.c.dead_at.is_not(None)),
                func.min(memory_syncs.c.created_at).filter(live),
            )
        )
    ).one()
    return SyncCounts(int(row[0]), int(row[1]), None if row[2] is None else aware(row[2]))


async def dead(conn: AsyncConnection, limit: int = 50) -> list[SyncRow]:
    """The most recently dead syncs, newest first."""
    rows = await conn.execute(
        select(memory_syncs)
        .where(memory_syncs.c.dead_at.is_not(None))
        .order_by(memory_syncs.c.id.desc())
        .limit(limit)
    )
    return [_row(r) for r in rows.mappings()]


async def queued(conn: AsyncConnection, person: UserId | None = None) -> list[SyncRow]:
    """Live syncs (of `person`, or everyone's), in the order they are sent."""
    where: ColumnElement[bool] = memory_syncs.c.dead_at.is_(None)
    if person is not None:
        where = and_(where, memory_syncs.c.person == person)
    rows = await conn.execute(select(memory_syncs).where(where).order_by(memory_syncs.c.id))
    return [_row(r) for r in rows.mappings()]


def expired(row: SyncRow, max_age: float, now: datetime) -> bool:
    """Whether `row` is older than `max_age` seconds (it is then given up)."""
    return now - row.created_at > timedelta(seconds=max_age)


def _row(r: RowMapping) -> SyncRow:
    return SyncRow(
        id=int(r["id"]),
        person=UserId(r["person"]),
        kind=SyncKind(r["kind"]),
        session_key=str(r["session_key"]),
        session_id=None if r["session_id"] is None else SessionId(r["session_id"]),
        turn_id=None if r["turn_id"] is None else TurnId(r["turn_id"]),
        payload=dict(r["payload"] or {}),
        created_at=r["created_at"],
        attempts=int(r["attempts"]),
        next_attempt_at=r["next_attempt_at"],
        last_error=r["last_error"],
        dead_at=r["dead_at"],
        sending_at=r["sending_at"],
    )
