"""Leases: work that must run on one instance at a time, with a fencing token.

A lease row names its owner (an instance id), a token that grows with every change of
owner, and an expiry. The holder renews it well before it expires; another instance may take
it only once it has expired. Writes made under a lease check it in the same transaction
(`check`), so a holder that was paused past its expiry and then wakes cannot act: its
token is stale.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.contracts.errors import LeaseLost
from gateway.contracts.messages import utcnow
from gateway.store import Store
from gateway.store.instances import Now, gone
from gateway.store.sql import insert_or_skip
from gateway.store.tables import leases

SAFETY = 0.8
"""A holder stops acting once this share of the TTL has passed since its last successful
renewal began (the rest absorbs clock skew between machines and slow commits)."""


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """One lease row."""

    name: str
    owner: str
    token: int
    expires_at: datetime


class Leases:
    """The lease table as seen by one owner (an instance id)."""

    def __init__(self, store: Store, owner: str, ttl: float, *, now: Now = utcnow) -> None:
        self.store = store
        self.owner = owner
        self.ttl = ttl
        self.now = now

    async def acquire(self, name: str) -> int | None:
        """Take `name` when it is free, expired, held by an instance known to be gone, or
        left by an earlier life of this owner; return the new fencing token, or None while
        another live owner holds it."""
        now = self.now()
        until = now + timedelta(seconds=self.ttl)
        async with self.store.write() as conn:
            row = (
                await conn.execute(
                    select(leases.c.owner, leases.c.token, leases.c.expires_at).where(
                        leases.c.name == name
                    )
                )
            ).first()
            if row is None:
                values = {"name": name, "owner": self.owner, "token": 1, "expires_at": until}
                inserted = await insert_or_skip(conn, leases, values)
                return 1 if inserted else None
            owner, token, expires_at = str(row[0]), int(row[1]), row[2]
            if owner != self.owner and expires_at > now:
                holder_gone = await conn.scalar(
                    select(gone(leases.c.owner, now, self.ttl)).where(leases.c.name == name)
                )
                if not holder_gone:
                    return None  # held, and its holder is alive
            result = await conn.execute(
                update(leases)
                .where(leases.c.name == name, leases.c.token == token)
                .values(owner=self.owner, token=token + 1, expires_at=until)
            )
        return token + 1 if result.rowcount else None

    async def renew(self, name: str, token: int) -> bool:
        """Extend a lease this owner holds with `token`; False when it was taken over."""
        until = self.now() + timedelta(seconds=self.ttl)
        async with self.store.write() as conn:
            result = await conn.execute(
                update(leases)
                .where(leases.c.name == name, leases.c.owner == self.owner, leases.c.token == token)
                .values(expires_at=until)
            )
        return bool(result.rowcount)

    async def release(self, name: str, token: int) -> None:
        """Give the lease up now (it expires; the token stays, so fencing still holds)."""
        async with self.store.write() as conn:
            await conn.execute(
                update(leases)
                .where(leases.c.name == name, leases.c.owner == self.owner, leases.c.token == token)
                .values(expires_at=self.now())
            )

    async def check(self, conn: AsyncConnection, name: str, token: int) -> None:
        """In the caller's transaction: raise LeaseLost unless this owner still holds `name`
        with `token`. On PostgreSQL the row stays locked until the transaction ends, so a
        takeover cannot slip in between the check and the commit."""
        query = select(leases.c.owner, leases.c.token, leases.c.expires_at).where(
            leases.c.name == name
        )
        if conn.dialect.name == "postgresql":
            query = query.with_for_update()
        row = (await conn.execute(query)).first()
        if row is None or str(row[0]) != self.owner or int(row[1]) != token:
            raise LeaseLost(f"lease {name} is held by another instance now")
        if row[2] <= self.now():
            raise LeaseLost(f"lease {name} expired before it was renewed")


async def list_leases(conn: AsyncConnection) -> list[LeaseInfo]:
    """Every lease, by name."""
    rows = (await conn.execute(select(leases).order_by(leases.c.name))).mappings().all()
    return [
        LeaseInfo(str(r["name"]), str(r["owner"]), int(r["token"]), r["expires_at"]) for r in rows
    ]


class Lease:
    """One lease this instance wants, as the keeper (`Node`) maintains it.

    `held()` is the local view: true from a successful acquire or renewal until `SAFETY` of
    the TTL has passed without another, so a paused process stops trusting it on waking,
    before anyone else may take it.
    """

    def __init__(self, name: str, ttl: float) -> None:
        self.name = name
        self.ttl = ttl
        self.token: int | None = None
        self._deadline = 0.0
        self._changed = asyncio.Event()
        self.tried = asyncio.Event()
        """Set once the keeper has tried to acquire it: `held()` then tells whether this
        instance runs it or stands by."""

    def held(self) -> bool:
        """Whether this instance may act under the lease now."""
        return self.token is not None and time.monotonic() < self._deadline

    def granted(self, token: int, began: float) -> None:
        """The keeper acquired or renewed it with a request sent at monotonic `began`."""
        self.token = token
        self._deadline = began + self.ttl * SAFETY
        self._changed.set()
        self.tried.set()

    def lost(self) -> None:
        """The keeper found it taken (or held by another), or released it."""
        self.token = None
        self._changed.set()
        self.tried.set()

    async def wait_held(self) -> int:
        """Wait until the lease is held; return its token."""
        while True:
            self._changed.clear()
            if self.held():
                assert self.token is not None
                return self.token
            await self._changed.wait()

    async def wait_lost(self) -> None:
        """Wait until the lease is not held any more (taken, released, or not renewed in
        time)."""
        while self.held():
            self._changed.clear()
            try:
                async with asyncio.timeout(max(0.0, self._deadline - time.monotonic())):
                    await self._changed.wait()
            except TimeoutError:
                pass
