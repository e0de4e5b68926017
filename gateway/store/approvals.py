"""The SQL of tool approvals: a tool call waiting for a person's yes is one row.

Every function works in the caller's transaction. Statuses: `pending` (asked, waiting),
`approved` / `denied` (decided by `decided_by`), `timed_out` (no answer in time), `cancelled`
(the turn was stopped while it waited), `used` (approved and run).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import RowMapping, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.store.tables import outbox, tool_approvals
from gateway.store.types import aware


class ApprovalStatus(StrEnum):
    """Where an approval is."""

    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    USED = "used"


OPEN = (ApprovalStatus.PENDING, ApprovalStatus.APPROVED)
"""A call in one of these may still be answered by its row (after a restart too)."""


@dataclass(frozen=True, slots=True)
class ApprovalRow:
    """One approval."""

    id: int
    session_key: str
    turn_id: int | None
    call_key: str
    tool: str
    arguments: str
    requester: str | None
    status: ApprovalStatus
    asked: int
    created_at: datetime
    expires_at: datetime
    decided_at: datetime | None
    decided_by: str | None


def _row(r: RowMapping) -> ApprovalRow:
    return ApprovalRow(
        id=int(r["id"]),
        session_key=r["session_key"],
        turn_id=r["turn_id"],
        call_key=r["call_key"],
        tool=r["tool"],
        arguments=r["arguments"],
        requester=r["requester"],
        status=ApprovalStatus(r["status"]),
        asked=int(r["asked"]),
        created_at=aware(r["created_at"]),
        expires_at=aware(r["expires_at"]),
        decided_at=None if r["decided_at"] is None else aware(r["decided_at"]),
        decided_by=r["decided_by"],
    )


async def insert_approval(conn: AsyncConnection, values: dict[str, Any]) -> int:
    """Record a pending approval; its id."""
    result = await conn.execute(
        insert(tool_approvals)
        .values(status=str(ApprovalStatus.PENDING), asked=1, **values)
        .returning(tool_approvals.c.id)
    )
    return int(result.scalar_one())


async def open_approval(conn: AsyncConnection, call_key: str) -> ApprovalRow | None:
    """The newest pending or approved (not yet run) approval of this call, or None."""
    row = (
        (
            await conn.execute(
                select(tool_approvals)
                .where(
                    tool_approvals.c.call_key == call_key,
                    tool_approvals.c.status.in_([str(s) for s in OPEN]),
                )
                .order_by(tool_approvals.c.id.desc())
                .limit(1)
            )
        )
        .mappings()
        .first()
    )
    return None if row is None else _row(row)


async def get_approval(conn: AsyncConnection, approval_id: int) -> ApprovalRow | None:
    """The approval with that id, or None."""
    row = (
        (await conn.execute(select(tool_approvals).where(tool_approvals.c.id == approval_id)))
        .mappings()
        .first()
    )
    return None if row is None else _row(row)


async def pending_approvals(conn: AsyncConnection, session_key: str) -> list[ApprovalRow]:
    """The session's pending approvals, oldest first."""
    rows = (
        (
            await conn.execute(
                select(tool_approvals)
                .where(
                    tool_approvals.c.session_key == session_key,
                    tool_approvals.c.status == str(ApprovalStatus.PENDING),
                )
                .order_by(tool_approvals.c.id)
            )
        )
        .mappings()
        .all()
    )
    return [_row(r) for r in rows]


async def recent_approvals(conn: AsyncConnection, limit: int = 50) -> list[ApprovalRow]:
    """The newest approvals of every session, pending or decided, newest first."""
    rows = (
        (
            await conn.execute(
                select(tool_approvals).order_by(tool_approvals.c.id.desc()).limit(limit)
            )
        )
        .mappings()
        .all()
    )
    return [_row(r) for r in rows]


async def ask_again(
    conn: AsyncConnection, approval_id: int, *, turn_id: int | None, expires_at: datetime
) -> None:
    """The call came again (a restarted turn): count the question, move the expiry."""
    await conn.execute(
        update(tool_approvals)
        .where(tool_approvals.c.id == approval_id)
        .values(asked=tool_approvals.c.asked + 1, turn_id=turn_id, expires_at=expires_at)
    )


async def decide_approval(
    conn: AsyncConnection,
    approval_id: int,
    status: ApprovalStatus,
    *,
    by: str | None,
    now: datetime,
) -> bool:
    """Decide a pending approval; False when it was not pending any more."""
    result = await conn.execute(
        update(tool_approvals)
        .where(
            tool_approvals.c.id == approval_id,
            tool_approvals.c.status == str(ApprovalStatus.PENDING),
        )
        .values(status=str(status), decided_by=by, decided_at=now)
    )
    return result.rowcount == 1


async def close_approval(
    conn: AsyncConnection, approval_id: int, status: ApprovalStatus, now: datetime
) -> None:
    """End an open approval: `used` after an approved call ran, `cancelled` when its turn
    stopped while it waited (a decided row keeps who decided it)."""
    await conn.execute(
        update(tool_approvals)
        .where(
            tool_approvals.c.id == approval_id,
            tool_approvals.c.status.in_([str(s) for s in OPEN]),
        )
        .values(status=str(status))
    )
    await conn.execute(
        update(tool_approvals)
        .where(tool_approvals.c.id == approval_id, tool_approvals.c.decided_at.is_(None))
        .values(decided_at=now)
    )


async def unsent_parts(conn: AsyncConnection, approval_id: int, asked: int) -> int:
    """How many messages of a question asked over several (`approval:<id>:<asked>[:<n>]`),
    the last one aside, have not been sent yet (pending, or dead)."""
    base = f"approval:{approval_id}:{asked}"
    rows = (
        await conn.execute(
            select(outbox.c.idempotency_key, outbox.c.status).where(
                or_(
                    outbox.c.idempotency_key == base,
                    outbox.c.idempotency_key.like(base + ":%"),
                )
            )
        )
    ).all()
    if len(rows) < 2:  # one message: the person answering has seen it
        return 0

    def index(key: str) -> int:
        tail = key[len(base) :].lstrip(":")
        return int(tail) if tail.isdigit() else 0

    ordered = sorted(rows, key=lambda r: index(r.idempotency_key))
    return sum(1 for r in ordered[:-1] if r.status != "sent")
