"""The SQL of access: pairing requests and the grants approved codes leave behind.

Every function works in the caller's transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping, delete, exists, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.contracts.messages import utcnow
from gateway.store.sql import insert_ignore
from gateway.store.tables import grants, pairings
from gateway.store.types import aware


@dataclass(frozen=True, slots=True)
class Pairing:
    """One pairing request."""

    id: int
    code: str
    platform: str
    account: str
    external_id: str
    chat_id: str
    display_name: str
    status: str
    created_at: datetime
    expires_at: datetime


async def is_granted(
    conn: AsyncConnection, platform: str, external_id: str, account: str | None = None
) -> bool:
    """Whether `platform:external_id` holds a grant; with `account`, one that reaches that
    account: given by the operator outright (every account of the platform), or by
    approving a pairing code asked for on that account."""
    query = select(grants.c.id).where(
        grants.c.platform == platform, grants.c.external_id == external_id
    )
    if account is not None:
        approved_here = exists().where(
            pairings.c.platform == platform,
            pairings.c.external_id == external_id,
            pairings.c.account == account,
            pairings.c.status == "approved",
        )
        query = query.where(or_(~grants.c.via.like("pairing %"), approved_here))
    granted = await conn.scalar(query)
    return granted is not None


async def grant(conn: AsyncConnection, platform: str, external_id: str, *, via: str) -> None:
    """Allow `platform:external_id` (idempotent)."""
    await insert_ignore(
        conn,
        grants,
        {"platform": platform, "external_id": external_id, "granted_at": utcnow(), "via": via},
    )


async def delete_grants(conn: AsyncConnection, platform: str, external_id: str) -> int:
    """Withdraw the grants of `platform:external_id`; how many there were."""
    result = await conn.execute(
        delete(grants).where(grants.c.platform == platform, grants.c.external_id == external_id)
    )
    return int(result.rowcount or 0)


async def lock_pairings(conn: AsyncConnection, platform: str) -> None:
    """Until the transaction ends, no other one may create a pairing of `platform` (on
    PostgreSQL; SQLite's single writer already serialises them)."""
    if conn.dialect.name == "postgresql":
        await conn.execute(
            select(func.pg_advisory_xact_lock(func.hashtext(f"herald-pairing:{platform}")))
        )


async def expire_pairings(conn: AsyncConnection, now: datetime) -> None:
    """Mark the pending requests that expired by `now` as expired."""
    await conn.execute(
        update(pairings)
        .where(pairings.c.status == "pending", pairings.c.expires_at <= now)
        .values(status="expired", decided_at=now)
    )


async def pending_code(
    conn: AsyncConnection, platform: str, external_id: str, account: str | None = None
) -> str | None:
    """The code of the sender's pending request (with `account`: on that account), or None."""
    query = select(pairings.c.code).where(
        pairings.c.platform == platform,
        pairings.c.external_id == external_id,
        pairings.c.status == "pending",
    )
    if account is not None:
        query = query.where(pairings.c.account == account)
    code = await conn.scalar(query.limit(1))
    return None if code is None else str(code)


async def count_pending(conn: AsyncConnection, platform: str, account: str | None = None) -> int:
    """How many requests of `platform` (with `account`: asked on that account) are pending."""
    query = (
        select(func.count())
        .select_from(pairings)
        .where(pairings.c.platform == platform, pairings.c.status == "pending")
    )
    if account is not None:
        query = query.where(pairings.c.account == account)
    waiting = await conn.scalar(query)
    return int(waiting or 0)


async def insert_pairing(conn: AsyncConnection, values: dict[str, Any]) -> bool:
    """Record a pending request; False when its code is taken (draw another)."""
    return await insert_ignore(conn, pairings, values) is not None


async def list_pairings(conn: AsyncConnection, *, all_: bool = False) -> list[Pairing]:
    """Pending, unexpired requests (every request with `all_`), newest first."""
    query = select(pairings).order_by(pairings.c.id.desc())
    if not all_:
        query = query.where(pairings.c.status == "pending", pairings.c.expires_at > utcnow())
    return [_pairing(r) for r in (await conn.execute(query)).mappings().all()]


async def pairing_by_code(conn: AsyncConnection, code: str) -> Pairing | None:
    """The request with that code (in any status), or None."""
    row = (await conn.execute(select(pairings).where(pairings.c.code == code))).mappings().first()
    return None if row is None else _pairing(row)


async def decide_pairing(
    conn: AsyncConnection, pairing_id: int, status: str, now: datetime
) -> None:
    """Set a request's status (`expired`, `approved`), decided at `now`."""
    await conn.execute(
        update(pairings).where(pairings.c.id == pairing_id).values(status=status, decided_at=now)
    )


async def revoke_pairings(
    conn: AsyncConnection, platform: str, external_id: str, now: datetime
) -> int:
    """Revoke the sender's pending and approved requests; how many there were."""
    result = await conn.execute(
        update(pairings)
        .where(
            pairings.c.platform == platform,
            pairings.c.external_id == external_id,
            pairings.c.status.in_(["pending", "approved"]),
        )
        .values(status="revoked", decided_at=now)
    )
    return int(result.rowcount or 0)


def _pairing(r: RowMapping) -> Pairing:
    return Pairing(
        id=int(r["id"]),
        code=str(r["code"]),
        platform=str(r["platform"]),
        account=str(r["account"]),
        external_id=str(r["external_id"]),
        chat_id=str(r["chat_id"]),
        display_name=str(r["display_name"]),
        status=str(r["status"]),
        created_at=aware(r["created_at"]),
        expires_at=aware(r["expires_at"]),
    )
