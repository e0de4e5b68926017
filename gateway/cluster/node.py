"""This process as one instance among several: `Node` owns its membership, the leases it
wants, its lanes and its signal bus, and keeps them alive while it runs.

SQLite: one instance only (a lock file next to the database refuses a second); leases are
held locally and never expire. PostgreSQL: the heartbeat and lease renewals run every
`cluster.heartbeat_interval`; when the others have already counted this instance as gone
(it was paused or cut off for longer than the TTL), `gone` is set and the supervisor stops
the process so that it starts again clean.

Receivers spread over the instances: one holding two or more receiver leases (accounts'
pollers and connections, `adapter:<platform>:<account>`) while another live instance holds
none hands its newest one over, so that several accounts are received on several instances
and each fails over on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from sqlalchemy.engine import make_url

from gateway.backoff import FailureLog
from gateway.cluster.bus import LocalBus, PgBus, Signal, SignalAction
from gateway.cluster.lanes import Lanes, SoloLanes
from gateway.config import ClusterConfig
from gateway.contracts.errors import InstanceConflict
from gateway.contracts.messages import utcnow
from gateway.store import Store
from gateway.store.instances import Membership, Now, list_instances
from gateway.store.lanes import SqlLanes
from gateway.store.leases import Lease, Leases

logger = logging.getLogger(__name__)

RECEIVER_LEASE = "adapter:"
"""The prefix of the leases of accounts' receivers (one instance at a time each)."""


class Node:
    """An async context manager: registers on entry and from then on keeps the heartbeat,
    the leases and the signal listener going (its own tasks); on exit it stops them,
    releases its leases and signs off."""

    def __init__(
        self,
        store: Store,
        instance_id: str,
        config: ClusterConfig,
        database_url: str,
        *,
        now: Now = utcnow,
    ) -> None:
        self.store = store
        self.id = instance_id
        self.config = config
        self.solo = store.dialect == "sqlite"
        ttl = config.lease_ttl
        self.membership = Membership(
            store, instance_id, ttl, now=now, forget_stopped=config.forget_stopped_after
        )
        self.leases = Leases(store, instance_id, ttl, now=now)
        self.lanes: Lanes = SoloLanes() if self.solo else SqlLanes(store, instance_id, ttl, now=now)
        self.bus = LocalBus(instance_id) if self.solo else PgBus(database_url, instance_id)
        self.gone = asyncio.Event()
        """Set when another live process has taken this instance's id: stop, restart."""
        self._tasks: asyncio.TaskGroup | None = None
        self._running: list[asyncio.Task[None]] = []
        self._wanted: dict[str, Lease] = {}
        self._outbox = asyncio.Event()
        self._beats = FailureLog(logger, "heartbeat")
        self._database_url = database_url
        self._lock: IO[bytes] | None = None
        self._now = now
        self._taken: dict[str, float] = {}
        """When each receiver lease held was taken (monotonic): the newest is handed over."""
        self._resting: dict[str, float] = {}
        """Receiver leases handed over, left to the others until this monotonic time."""
        self._handed: set[str] = set()
        """Receiver leases handed over once: never again (no endless hand-over when the
        instance without receivers does not want them)."""

    def lease(self, name: str) -> Lease:
        """The lease `name`, which this instance will try to hold while it runs."""
        if name not in self._wanted:
            lease = Lease(name, self.config.lease_ttl)
            if self.solo:
                lease.granted(0, math.inf)  # nobody to share with: held for good
            self._wanted[name] = lease
        return self._wanted[name]

    def announce_outbox(self) -> None:
        """New chunks were committed here: wake the delivery workers of the other instances
        (the one holding a platform's receiver may be the only one that can send)."""
        if not self.solo:
            self._outbox.set()

    async def forget(self, name: str) -> None:
        """Stop wanting the lease `name` and release it, so that another instance may run
        what it guards (this one gave up on it, e.g. its adapter failed to authenticate)."""
        lease = self._wanted.pop(name, None)
        if lease is None or self.solo:
            return
        await self._let_go(lease)

    async def _let_go(self, lease: Lease) -> None:
        if lease.token is not None:
            try:
                await self.leases.release(lease.name, lease.token)
            except Exception as err:  # it expires on its own
                logger.warning("could not release lease %s: %s", lease.name, err)
        lease.lost()

    def holds(self) -> list[str]:
        """The names of the leases held now."""
        return sorted(n for n, lease in self._wanted.items() if lease.held())

    async def __aenter__(self) -> Self:
        if self.solo:
            self._lock = _lock_sqlite(self._database_url)
        try:
            await self.membership.register()
        except BaseException:
            self._unlock()
            raise
        logger.info(
            "instance %s registered (%s)", self.id, "single instance" if self.solo else "cluster"
        )
        # Beat from the start: a slow startup must not look like a dead instance.
        self._tasks = asyncio.TaskGroup()
        await self._tasks.__aenter__()
        self._running = [self._tasks.create_task(self._keep_alive(), name="heartbeat")]
        if not self.solo:
            self._running.append(self._tasks.create_task(self.bus.run(), name="signals"))
            self._running.append(self._tasks.create_task(self._announce(), name="announcer"))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._tasks is not None:
            group, self._tasks = self._tasks, None
            for task in self._running:
                task.cancel()
            await group.__aexit__(None, None, None)
        try:
            if not self.solo:
                for lease in list(self._wanted.values()):
                    if lease.token is not None:
                        with contextlib.suppress(Exception):
                            await self.leases.release(lease.name, lease.token)
                        lease.lost()
            if not self.gone.is_set():
                await self.membership.leave()
        except Exception as err:  # the others take over after the TTL anyway
            logger.warning("could not sign this instance off: %s", err)
        finally:
            self._unlock()

    async def _announce(self) -> None:
        while True:
            await self._outbox.wait()
            self._outbox.clear()
            try:
                async with self.store.write() as conn:
                    await self.bus.publish(conn, Signal(SignalAction.OUTBOX))
            except Exception as err:  # the others look on their own timer anyway
                logger.debug("could not announce new chunks: %s", err)
            await asyncio.sleep(0.02)  # coalesce a burst of commits into one signal

    async def _keep_alive(self) -> None:
        interval = self.config.effective_heartbeat
        while True:
            began = time.monotonic()
            try:
                if not await self.membership.beat(self.holds()) and not await self._rejoin():
                    return
                if not self.solo:
                    # A copy: leases are added (startup) and forgotten (drain) meanwhile.
                    for lease in list(self._wanted.values()):
                        if self._wanted.get(lease.name) is not lease:
                            continue
                        await self._keep(lease, began)
                        if self._wanted.get(lease.name) is not lease:
                            await self._let_go(lease)  # forgotten while being renewed
                    await self._share()
            except Exception as err:  # the database may be away; leases lapse on their own
                self._beats.failed(err, expected=True)
            else:
                self._beats.recovered()
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - began)))

    async def _rejoin(self) -> bool:
        """The others counted this instance as gone (no heartbeat for the TTL: a pause, or
        the database was away). Register again and go on: everything it held was fenced,
        so what was taken over meanwhile fails its token checks and is let go. False when
        another live process has taken the id: this one must stop."""
        logger.warning(
            "instance %s was counted as gone (no heartbeat for %.0fs); registering again",
            self.id,
            self.config.lease_ttl,
        )
        try:
            await self.membership.register()
        except InstanceConflict as err:
            logger.error("%s; stopping", err)
            for lease in self._wanted.values():
                lease.lost()
            self.gone.set()
            return False
        return True

    async def _keep(self, lease: Lease, began: float) -> None:
        token = lease.token
        if token is not None:
            # The token read before the renewal: a `forget` meanwhile clears lease.token,
            # and the renewed row must still be released with this one.
            if await self.leases.renew(lease.name, token):
                lease.granted(token, began)
                return
            logger.warning("lease %s was taken over by another instance", lease.name)
            lease.lost()
        if time.monotonic() < self._resting.get(lease.name, 0.0):
            lease.tried.set()  # handed over: left to the others for now
            return
        token = await self.leases.acquire(lease.name)
        if token is not None:
            logger.info("holding lease %s (token %d)", lease.name, token)
            lease.granted(token, began)
            self._taken[lease.name] = time.monotonic()
        else:
            lease.tried.set()  # another instance holds it: stand by

    async def _share(self) -> None:
        """Hand the newest receiver lease over when this instance holds two or more and
        another live instance holds none (it takes it at its next beat)."""
        mine = [
            lease
            for lease in self._wanted.values()
            if lease.held() and lease.name.startswith(RECEIVER_LEASE)
        ]
        if len(mine) < 2:
            return
        async with self.store.read() as conn:
            everyone = await list_instances(conn)
        now, ttl = self._now(), self.config.lease_ttl
        idle = [
            info.id
            for info in everyone
            if info.id != self.id
            and info.alive(now, ttl)
            and not any(name.startswith(RECEIVER_LEASE) for name in info.holds)
        ]
        newest = max(mine, key=lambda lease: self._taken.get(lease.name, 0.0))
        if not idle or newest.name in self._handed:
            return
        logger.info("handing lease %s over to one of %s", newest.name, ", ".join(sorted(idle)))
        self._handed.add(newest.name)
        self._resting[newest.name] = time.monotonic() + ttl
        await self._let_go(newest)

    def _unlock(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None


async def run_under(lease: Lease, work: Callable[[], Awaitable[None]]) -> None:
    """Run `work` whenever `lease` is held; cancel it when the lease is lost. Returns when
    `work` returns by itself (it gave up for good)."""
    while True:
        await lease.wait_held()
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(_call(work), name=f"under {lease.name}")
            watch = tg.create_task(lease.wait_lost(), name=f"watch {lease.name}")
            await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
            ended = task.done()
            task.cancel()
            watch.cancel()
        if ended:
            return
        logger.warning("lease %s lost: stopped what ran under it", lease.name)


async def _call(work: Callable[[], Awaitable[None]]) -> None:
    await work()


def _lock_sqlite(database_url: str) -> IO[bytes] | None:
    """An exclusive lock next to the SQLite file; InstanceConflict if another holds it."""
    database = make_url(database_url).database
    if not database or database == ":memory:":
        return None
    path = Path(database).with_name(Path(database).name + ".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("ab")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise InstanceConflict(
            f"another Herald instance is already running on the SQLite database {database}. "
            "SQLite serves one instance: stop the other one, or move to PostgreSQL "
            "(database_url: postgresql+asyncpg://…) to run several (README, Scaling out)"
        ) from None
    with contextlib.suppress(OSError):
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n".encode())
        handle.flush()
    return handle
