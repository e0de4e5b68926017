"""Instances: who is running, registered with a heartbeat in the `instances` table.

An instance is alive while its heartbeat is younger than `cluster.lease_ttl` and it has not
stopped. Everything an instance owns (lanes, leases, chunks being sent) is judged by that:
when it is not alive, the others take its work over.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, delete, exists, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway import __version__
from gateway.contracts.errors import InstanceConflict
from gateway.contracts.messages import utcnow
from gateway.store import Store
from gateway.store.sql import insert_or_skip
from gateway.store.tables import instances

Now = Callable[[], datetime]

FORGOTTEN = timedelta(days=7)
"""How long the row of an instance that stopped beating is kept (for `herald instances`)."""
FORGET_STOPPED = 86_400.0
"""Seconds the row of an instance that stopped cleanly is kept (`cluster.forget_stopped_after`):
with the default id (`<host>-<pid>`) every restart leaves one."""


def alive(owner: ColumnElement[Any], now: datetime, ttl: float) -> ColumnElement[bool]:
    """SQL: the instance named by `owner` is alive at `now`."""
    return exists(
        select(instances.c.id).where(
            instances.c.id == owner,
            instances.c.stopped_at.is_(None),
            instances.c.heartbeat_at > now - timedelta(seconds=ttl),
        )
    )


def stopped_or_silent(now: datetime, ttl: float) -> ColumnElement[bool]:
    """SQL on an `instances` row: that instance stopped, or has not beaten for `ttl`."""
    return or_(
        instances.c.stopped_at.is_not(None),
        instances.c.heartbeat_at <= now - timedelta(seconds=ttl),
    )


def gone(owner: ColumnElement[Any], now: datetime, ttl: float) -> ColumnElement[bool]:
    """SQL: the instance named by `owner` is registered and known to be gone (stopped, or no
    heartbeat for `ttl`). An owner that never registered is not known to be gone."""
    return exists(
        select(instances.c.id).where(instances.c.id == owner, stopped_or_silent(now, ttl))
    )


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """One registered instance as `herald instances` shows it."""

    id: str
    host: str
    pid: int
    version: str
    incarnation: int
    started_at: datetime
    heartbeat_at: datetime
    stopped_at: datetime | None
    holds: tuple[str, ...]

    def alive(self, now: datetime, ttl: float) -> bool:
        """Whether the others count it as running."""
        return self.stopped_at is None and (now - self.heartbeat_at).total_seconds() < ttl

    def state(self, now: datetime, ttl: float) -> str:
        """alive, stopped (a clean shutdown) or lost (its heartbeat stopped)."""
        if self.stopped_at is not None:
            return "stopped"
        return "alive" if self.alive(now, ttl) else "lost"


class Membership:
    """This instance's row: registered on start, beaten while running, stopped on exit."""

    def __init__(
        self,
        store: Store,
        instance_id: str,
        ttl: float,
        *,
        now: Now = utcnow,
        forget_stopped: float = FORGET_STOPPED,
    ) -> None:
        self.store = store
        self.id = instance_id
        self.ttl = ttl
        self.now = now
        self.forget_stopped = forget_stopped
        self.incarnation = 0
        self.host = socket.gethostname()
        self.pid = os.getpid()

    async def register(self) -> int:
        """Record this start; return its incarnation. Raises InstanceConflict when another
        live process already runs under this id (a dead one on this host is replaced)."""
        now = self.now()
        async with self.store.write() as conn:
            found = (
                (await conn.execute(select(instances).where(instances.c.id == self.id)))
                .mappings()
                .first()
            )
            if found is None:
                inserted = await insert_or_skip(
                    conn,
                    instances,
                    {
                        "id": self.id,
                        "host": self.host,
                        "pid": self.pid,
                        "version": __version__,
                        "incarnation": 1,
                        "started_at": now,
                        "heartbeat_at": now,
                        "stopped_at": None,
                        "holds": [],
                    },
                )
                if not inserted:
                    raise InstanceConflict(f"instance {self.id!r} was started twice at once")
                self.incarnation = 1
                await self._bury_local(conn, now)
                await self._forget_old(conn, now)
                return self.incarnation
            info = _info(found)
            if info.alive(now, self.ttl) and not self._ours_and_dead(info):
                age = (now - info.heartbeat_at).total_seconds()
                raise InstanceConflict(
                    f"instance {self.id!r} is already running (pid {info.pid} on {info.host}, "
                    f"heartbeat {age:.0f}s ago); give each instance its own instance_id"
                )
            self.incarnation = info.incarnation + 1
            await conn.execute(
                update(instances)
                .where(instances.c.id == self.id)
                .values(
                    host=self.host,
                    pid=self.pid,
                    version=__version__,
                    incarnation=self.incarnation,
                    started_at=now,
                    heartbeat_at=now,
                    stopped_at=None,
                    holds=[],
                )
            )
            await self._bury_local(conn, now)
            await self._forget_old(conn, now)
        return self.incarnation

    async def _forget_old(self, conn: AsyncConnection, now: datetime) -> None:
        """Drop the rows of instances stopped for `forget_stopped` seconds, and of those
        silent for a week (a default id is new at every start)."""
        await conn.execute(
            delete(instances).where(
                or_(
                    instances.c.heartbeat_at < now - FORGOTTEN,
                    instances.c.stopped_at < now - timedelta(seconds=self.forget_stopped),
                ),
                instances.c.id != self.id,
            )
        )

    async def _bury_local(self, conn: AsyncConnection, now: datetime) -> None:
        """Mark stopped the instances of this host whose process no longer exists (killed
        and restarted under a new id): the others need not wait out their TTL."""
        rows = (
            await conn.execute(
                select(instances.c.id, instances.c.pid).where(
                    instances.c.host == self.host,
                    instances.c.id != self.id,
                    instances.c.stopped_at.is_(None),
                    instances.c.heartbeat_at > now - timedelta(seconds=self.ttl),
                )
            )
        ).all()
        dead = [str(r[0]) for r in rows if not _process_exists(int(r[1]))]
        if dead:
            await conn.execute(
                update(instances).where(instances.c.id.in_(dead)).values(stopped_at=now)
            )

    def _ours_and_dead(self, info: InstanceInfo) -> bool:
        """A previous process under this id on this host that no longer exists."""
        if info.host != self.host:
            return False
        return info.pid == self.pid or not _process_exists(info.pid)

    async def beat(self, holds: Sequence[str]) -> bool:
        """Renew the heartbeat; False when this instance was already counted as gone (its
        heartbeat had expired, on a shared database, or another start took the id)."""
        now = self.now()
        current = [
            instances.c.id == self.id,
            instances.c.incarnation == self.incarnation,
            instances.c.stopped_at.is_(None),
        ]
        if self.store.dialect != "sqlite":  # alone, nobody takes anything over
            current.append(instances.c.heartbeat_at > now - timedelta(seconds=self.ttl))
        async with self.store.write() as conn:
            result = await conn.execute(
                update(instances).where(*current).values(heartbeat_at=now, holds=sorted(holds))
            )
        return bool(result.rowcount)

    async def leave(self) -> None:
        """Mark this instance stopped: the others take over what is left at once."""
        async with self.store.write() as conn:
            await conn.execute(
                update(instances)
                .where(instances.c.id == self.id, instances.c.incarnation == self.incarnation)
                .values(stopped_at=self.now(), holds=[])
            )


def _process_exists(pid: int) -> bool:
    """Whether a process with that id runs on this machine (instances on one host are
    expected to share a PID namespace, or to have distinct host names)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def list_instances(conn: AsyncConnection) -> list[InstanceInfo]:
    """Every registered instance, most recent heartbeat first."""
    rows = (
        (await conn.execute(select(instances).order_by(instances.c.heartbeat_at.desc())))
        .mappings()
        .all()
    )
    return [_info(r) for r in rows]


def _info(row: Any) -> InstanceInfo:
    return InstanceInfo(
        id=str(row["id"]),
        host=str(row["host"]),
        pid=int(row["pid"]),
        version=str(row["version"]),
        incarnation=int(row["incarnation"]),
        started_at=row["started_at"],
        heartbeat_at=row["heartbeat_at"],
        stopped_at=row["stopped_at"],
        holds=tuple(str(h) for h in (row["holds"] or ())),
    )
