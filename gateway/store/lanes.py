"""Session lanes in SQL (`SqlLanes`): the `lanes` table, for instances sharing PostgreSQL.

Claiming a lane takes the session key: free, or held by an instance that is not alive (or
by an earlier life of this one). The claim recovers what a dead owner left: its running
turn becomes interrupted and the messages it had taken wait again. The owner's writes for
the session check the claim's fencing token in their own transaction, so a paused owner
that wakes after a takeover cannot store (or send) anything.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ColumnElement, and_, func, or_, select, union, update
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.cluster.lanes import Claim, LaneState
from gateway.contracts.errors import LeaseLost
from gateway.contracts.ids import SessionKey, TurnId
from gateway.contracts.messages import utcnow
from gateway.store.instances import Now, alive
from gateway.store.sql import insert_or_skip
from gateway.store.store import Store
from gateway.store.tables import inbox, lanes, sessions, turns

FREE = ""
"""The owner of a released lane. The row stays, so its fencing token keeps growing: a
process that held an earlier claim can never pass `check` again."""


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


async def lanes_by_owner(conn: AsyncConnection) -> dict[str, int]:
    """How many lanes each owner holds (`""`: released lanes)."""
    rows = (await conn.execute(select(lanes.c.owner, func.count()).group_by(lanes.c.owner))).all()
    return {str(owner): int(count) for owner, count in rows}
