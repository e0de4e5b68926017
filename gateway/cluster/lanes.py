"""Session lanes across instances: at most one instance runs a session's turns.

Claiming a lane takes the session key in the `lanes` table: free, or held by an instance
that is not alive (or by an earlier life of this one). The claim recovers what a dead owner
left: its running turn becomes interrupted and the messages it had taken wait again. The
owner's writes for the session check the claim's fencing token in their own transaction,
so a paused owner that wakes after a takeover cannot store (or send) anything.

On SQLite there is one instance: `SoloLanes` keeps lanes in memory only.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from sqlalchemy import ColumnElement, and_, or_, select, union, update
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.cluster.membership import Now, alive
from gateway.contracts.errors import LeaseLost
from gateway.contracts.ids import SessionKey, TurnId
from gateway.contracts.messages import utcnow
from gateway.store import Store
from gateway.store.sql import insert_or_skip
from gateway.store.tables import inbox, lanes, sessions, turns

FREE = ""
"""The owner of a released lane. The row stays, so its fencing token keeps growing: a
process that held an earlier claim can never pass `check` again."""


@dataclass(frozen=True, slots=True)
class Claim:
    """This instance runs the session's turns until it releases the claim."""

    key: SessionKey
    token: int


@dataclass(frozen=True, slots=True)
class LaneState:
    """Who runs a session now, as another instance sees it."""

    owner: str | None
    """A live instance holding the lane, or None when it is free (or its owner is gone)."""
    running: bool
    """Whether that instance is running a turn of the session now."""
    turn_id: TurnId | None = None
    """That turn."""


class Lanes(Protocol):
    """Where a session's turns may run."""

    @property
    def clustered(self) -> bool:
        """Whether other instances may share the database (lanes are claimed in SQL)."""
        ...

    async def claim(self, key: SessionKey) -> Claim | None:
        """Take the lane (recovering a dead owner's leftovers); None while a live instance
        holds it."""
        ...

    async def release(self, claim: Claim) -> None:
        """Give the lane up (nothing of the session is running or waiting here)."""
        ...

    async def check(self, conn: AsyncConnection, claim: Claim, turn_id: TurnId | None) -> None:
        """In the caller's transaction: raise LeaseLost unless the claim still holds, and
        record `turn_id` as the session's running turn (None: no turn running)."""
        ...

    async def state(self, conn: AsyncConnection, key: SessionKey) -> LaneState:
        """Who holds the lane, read in the caller's transaction."""
        ...

    async def request_cancel(
        self, conn: AsyncConnection, key: SessionKey, turn_id: TurnId, reason: str
    ) -> None:
        """In the caller's transaction: ask whoever runs turn `turn_id` of `key` to cancel it.
        Durable, so the owner finds it even if the signal that goes with it is lost."""
        ...

    async def cancel_requested(self, claim: Claim) -> str | None:
        """Why the turn running under `claim` was asked to cancel, if it was."""
        ...

    async def orphans(self, limit: int = 200, *, started: bool = False) -> list[SessionKey]:
        """Sessions with work no live instance is doing: waiting or cut-off messages, or a
        lane whose owner is gone (this instance's own too, from an earlier life, when it has
        just `started`)."""
        ...


class SoloLanes:
    """One instance: every claim succeeds, nothing is written."""

    @property
    def clustered(self) -> bool:
        """False: this process is the only instance."""
        return False

    async def claim(self, key: SessionKey) -> Claim | None:
        """Always granted."""
        return Claim(key, 0)

    async def release(self, claim: Claim) -> None:
        """Nothing to do."""

    async def check(self, conn: AsyncConnection, claim: Claim, turn_id: TurnId | None) -> None:
        """Always holds."""

    async def state(self, conn: AsyncConnection, key: SessionKey) -> LaneState:
        """No other instance."""
        return LaneState(None, False)

    async def request_cancel(
        self, conn: AsyncConnection, key: SessionKey, turn_id: TurnId, reason: str
    ) -> None:
        """Never needed: the turn runs here and is cancelled directly."""

    async def cancel_requested(self, claim: Claim) -> str | None:
        """Never asked."""
        return None

    async def orphans(self, limit: int = 200, *, started: bool = False) -> list[SessionKey]:
        """Startup recovery finds them instead (`Inbox.recover`)."""
        return []


class SqlLanes:
    """Lanes in the `lanes` table, owned by instance `owner`."""

    def __init__(self, store: Store, owner: str, ttl: float, *, now: Now = utcnow) -> None:
        self.store = store
        self.owner = owner
        self.ttl = ttl
        self.now = now

    @property
    def clustered(self) -> bool:
        """True: instances sharing the database take turns through the `lanes` table."""
        return True

    async def claim(self, key: SessionKey) -> Claim | None:
        """See `Lanes.claim`."""
        now = self.now()
        async with self.store.write() as conn:
            inserted = await insert_or_skip(
                conn, lanes, {"key": key, "owner": self.owner, "token": 1, "claimed_at": now}
            )
            if inserted:
                token = 1
            else:
                row = (
                    await conn.execute(
                        update(lanes)
                        .where(
                            lanes.c.key == key,
                            or_(lanes.c.owner == self.owner, ~alive(lanes.c.owner, now, self.ttl)),
                        )
                        .values(
                            owner=self.owner, token=lanes.c.token + 1, turn_id=None, claimed_at=now
                        )
                        .returning(lanes.c.token)
                    )
                ).first()
                if row is None:
                    return None
                token = int(row[0])
            await _recover(conn, key, now, self.ttl)
        return Claim(key, token)

    async def release(self, claim: Claim) -> None:
        """See `Lanes.release`."""
        async with self.store.write() as conn:
            await conn.execute(
                update(lanes)
                .where(
                    lanes.c.key == claim.key,
                    lanes.c.owner == self.owner,
                    lanes.c.token == claim.token,
                )
                .values(owner=FREE, turn_id=None)
            )

    async def check(self, conn: AsyncConnection, claim: Claim, turn_id: TurnId | None) -> None:
        """See `Lanes.check`. The update locks the row until the caller commits."""
        result = await conn.execute(
            update(lanes)
            .where(
                lanes.c.key == claim.key,
                lanes.c.owner == self.owner,
                lanes.c.token == claim.token,
            )
            .values(turn_id=turn_id, cancel=None)
        )
        if not result.rowcount:
            raise LeaseLost(f"session {claim.key} was taken over by another instance")

    async def state(self, conn: AsyncConnection, key: SessionKey) -> LaneState:
        """See `Lanes.state`."""
        now = self.now()
        row = (
            await conn.execute(
                select(lanes.c.owner, lanes.c.turn_id).where(
                    lanes.c.key == key, alive(lanes.c.owner, now, self.ttl)
                )
            )
        ).first()
        if row is None:
            return LaneState(None, False)
        turn_id = None if row[1] is None else TurnId(int(row[1]))
        return LaneState(str(row[0]), turn_id is not None, turn_id)

    async def request_cancel(
        self, conn: AsyncConnection, key: SessionKey, turn_id: TurnId, reason: str
    ) -> None:
        """See `Lanes.request_cancel`."""
        await conn.execute(
            update(lanes)
            .where(lanes.c.key == key, lanes.c.turn_id == turn_id)
            .values(cancel=reason[:200] or "cancelled")
        )

    async def cancel_requested(self, claim: Claim) -> str | None:
        """See `Lanes.cancel_requested`."""
        async with self.store.read() as conn:
            value = await conn.scalar(
                select(lanes.c.cancel).where(
                    lanes.c.key == claim.key,
                    lanes.c.owner == self.owner,
                    lanes.c.token == claim.token,
                )
            )
        return None if value is None else str(value)

    async def orphans(self, limit: int = 200, *, started: bool = False) -> list[SessionKey]:
        """See `Lanes.orphans`."""
        now = self.now()
        held = select(lanes.c.key).where(
            lanes.c.key == inbox.c.session_key,
            lanes.c.owner != self.owner,
            alive(lanes.c.owner, now, self.ttl),
        )
        waiting = (
            select(inbox.c.session_key)
            .where(
                or_(
                    inbox.c.status == "pending",
                    and_(inbox.c.status == "running", _given_back(now, self.ttl)),
                ),
                ~held.exists(),
            )
            .distinct()
        )
        others = and_(lanes.c.owner != FREE, ~alive(lanes.c.owner, now, self.ttl))
        dead = select(lanes.c.key).where(
            or_(lanes.c.owner == self.owner, others) if started else others
        )
        async with self.store.read() as conn:
            rows = (await conn.execute(union(waiting, dead).limit(limit))).all()
        return [SessionKey(str(r[0])) for r in rows]


async def _recover(conn: AsyncConnection, key: SessionKey, now: datetime, ttl: float) -> None:
    """A fresh claim: what an earlier owner left running is cut off. A command row is given
    back only when the instance running it is gone (commands run where they arrive)."""
    await conn.execute(
        update(turns)
        .where(
            turns.c.status == "running",
            turns.c.session_id.in_(select(sessions.c.id).where(sessions.c.key == key)),
        )
        .values(status="interrupted", finished_at=utcnow(), error="its instance stopped")
    )
    await conn.execute(
        update(inbox)
        .where(inbox.c.session_key == key, inbox.c.status == "running", _given_back(now, ttl))
        .values(status="pending", steer=False, claimed_by=None)
    )
    await conn.execute(
        update(inbox)
        .where(inbox.c.session_key == key, inbox.c.status == "pending", inbox.c.steer.is_(True))
        .values(steer=False)
    )


def _given_back(now: datetime, ttl: float) -> ColumnElement[bool]:
    """SQL: a `running` inbox row that a new claim gives back: a message of a turn (the
    lane's earlier owner ran it), or a command whose instance is gone."""
    return or_(
        inbox.c.kind != "command",
        inbox.c.claimed_by.is_(None),
        ~alive(inbox.c.claimed_by, now, ttl),
    )
