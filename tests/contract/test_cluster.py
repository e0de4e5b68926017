"""The cluster's building blocks on every store: instances, leases with fencing tokens and
the node. Lanes: `test_lanes.py`; the signal bus: `test_bus.py`."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update

from gateway.cluster.node import Node
from gateway.config import ClusterConfig
from gateway.contracts.errors import InstanceConflict, LeaseLost
from gateway.contracts.messages import utcnow
from gateway.store import Store
from gateway.store.instances import Membership
from gateway.store.leases import SAFETY, Lease, Leases
from gateway.store.tables import instances
from tests.fakes.clock import FakeClock

pytestmark = pytest.mark.timeout(60)

TTL = 10.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(utcnow())


def later(clock: FakeClock, seconds: float) -> None:
    clock.set(clock.now() + timedelta(seconds=seconds))


# leases ---------------------------------------------------------------------------------------


async def test_a_lease_has_one_holder_until_it_expires_then_the_token_grows(
    store: Store, clock: FakeClock
) -> None:
    a = Leases(store, "a", TTL, now=clock.now)
    b = Leases(store, "b", TTL, now=clock.now)
    assert await a.acquire("cron") == 1
    assert await b.acquire("cron") is None
    later(clock, TTL - 1)
    assert await a.renew("cron", 1)
    later(clock, TTL - 1)
    assert await b.acquire("cron") is None, "renewed: still a's"
    later(clock, 2)
    assert await b.acquire("cron") == 2
    assert await a.acquire("cron") is None


async def test_a_paused_owner_that_wakes_after_losing_its_lease_cannot_act(
    store: Store, clock: FakeClock
) -> None:
    paused = Leases(store, "paused", TTL, now=clock.now)
    other = Leases(store, "other", TTL, now=clock.now)
    token = await paused.acquire("adapter:telegram:default")
    assert token is not None
    later(clock, TTL + 1)  # the holder is paused past its expiry
    taken = await other.acquire("adapter:telegram:default")
    assert taken == token + 1
    # It wakes up: its renewal is refused and a write fenced by its token fails.
    assert not await paused.renew("adapter:telegram:default", token)
    with pytest.raises(LeaseLost):
        async with store.write() as conn:
            await paused.check(conn, "adapter:telegram:default", token)
    async with store.write() as conn:
        await other.check(conn, "adapter:telegram:default", taken)


async def test_an_expired_lease_is_refused_by_check_even_before_anyone_takes_it(
    store: Store, clock: FakeClock
) -> None:
    leases = Leases(store, "a", TTL, now=clock.now)
    token = await leases.acquire("cron")
    assert token is not None
    later(clock, TTL + 1)
    with pytest.raises(LeaseLost):
        async with store.write() as conn:
            await leases.check(conn, "cron", token)


async def test_release_lets_another_take_it_at_once_with_a_new_token(
    store: Store, clock: FakeClock
) -> None:
    a = Leases(store, "a", TTL, now=clock.now)
    b = Leases(store, "b", TTL, now=clock.now)
    assert await a.acquire("cron") == 1
    await a.release("cron", 1)
    later(clock, 0.001)
    assert await b.acquire("cron") == 2
    # Taking its own lease back after a restart also moves the token on.
    await b.release("cron", 2)
    later(clock, 0.001)
    assert await b.acquire("cron") == 3


async def test_a_lease_of_an_instance_known_to_be_gone_is_taken_at_once(
    store: Store, clock: FakeClock
) -> None:
    killed = Membership(store, "killed", TTL, now=clock.now)
    killed.pid = 2**22 + 4321  # a process that no longer exists on this host
    await killed.register()
    assert await Leases(store, "killed", TTL, now=clock.now).acquire("cron") == 1
    # Restarted under a new id (the default id has the pid in it): the dead one is buried.
    await Membership(store, "restarted", TTL, now=clock.now).register()
    assert await Leases(store, "restarted", TTL, now=clock.now).acquire("cron") == 2


async def test_a_live_instance_of_this_host_is_not_buried(store: Store, clock: FakeClock) -> None:
    await Membership(store, "first", TTL, now=clock.now).register()  # this very process
    assert await Leases(store, "first", TTL, now=clock.now).acquire("cron") == 1
    await Membership(store, "second", TTL, now=clock.now).register()
    assert await Leases(store, "second", TTL, now=clock.now).acquire("cron") is None


async def test_the_local_view_stops_trusting_a_lease_that_was_not_renewed_in_time() -> None:
    lease = Lease("cron", ttl=2.0)
    assert not lease.held()
    lease.granted(7, time.monotonic())
    assert lease.held()
    assert await lease.wait_held() == 7
    # A renewal that began long ago (the process was paused since) is not trusted.
    lease.granted(7, time.monotonic() - 2.0 * SAFETY)
    assert not lease.held()
    async with asyncio.timeout(5):
        await lease.wait_lost()


async def test_wait_lost_returns_when_the_deadline_passes_without_renewal() -> None:
    lease = Lease("cron", ttl=0.5)
    lease.granted(1, time.monotonic())
    async with asyncio.timeout(5):
        await lease.wait_lost()
    assert not lease.held()


# instances ------------------------------------------------------------------------------------


async def test_an_instance_id_cannot_run_twice(store: Store, clock: FakeClock) -> None:
    first = Membership(store, "herald-a", TTL, now=clock.now)
    await first.register()
    second = Membership(store, "herald-a", TTL, now=clock.now)
    second.host = "another-machine"
    with pytest.raises(InstanceConflict, match="already running"):
        await second.register()
    # Once the first is gone (no heartbeat for the TTL), its id may start again.
    later(clock, TTL + 1)
    assert await second.register() == 2
    assert not await first.beat([]), "the old life learns it was counted as gone"
    assert await second.beat(["cron"])


async def test_a_restart_on_the_same_host_replaces_a_dead_process_at_once(
    store: Store, clock: FakeClock
) -> None:
    gone = Membership(store, "herald-a", TTL, now=clock.now)
    gone.pid = 2**22 + 12345  # no such process
    await gone.register()
    again = Membership(store, "herald-a", TTL, now=clock.now)
    assert await again.register() == 2


async def test_an_instance_gone_for_a_week_is_forgotten_at_the_next_start(
    store: Store, clock: FakeClock
) -> None:
    await _instance(store, clock, "old")
    later(clock, 8 * 24 * 3600)
    await _instance(store, clock, "new")
    async with store.read() as conn:
        assert set((await conn.scalars(select(instances.c.id))).all()) == {"new"}


async def test_leave_marks_the_instance_stopped(store: Store, clock: FakeClock) -> None:
    member = Membership(store, "herald-a", TTL, now=clock.now)
    await member.register()
    await member.leave()
    async with store.read() as conn:
        stopped = await conn.scalar(select(instances.c.stopped_at))
    assert stopped is not None
    assert not await member.beat([])


async def _instance(store: Store, clock: FakeClock, name: str) -> Membership:
    member = Membership(store, name, TTL, now=clock.now)
    member.host = f"host-{name}"
    await member.register()
    return member


# the node -------------------------------------------------------------------------------------


async def test_sqlite_refuses_a_second_instance(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'herald.db'}"
    async with Store.open(url) as store:
        async with Node(store, "one", ClusterConfig(), url):
            with pytest.raises(InstanceConflict, match="SQLite serves one instance"):
                async with Node(store, "two", ClusterConfig(), url):
                    pass
        async with Node(store, "two", ClusterConfig(), url) as node:
            assert node.lease("cron").held(), "alone: every lease is held for good"


@pytest.mark.postgres
async def test_a_lease_moves_to_a_standby_instance_when_its_holder_stops(pg_url: str) -> None:
    config = ClusterConfig(lease_ttl=1.5, heartbeat_interval=0.2)
    async with Store.open(pg_url) as store:
        first = Node(store, "first", config, pg_url)
        held_first = first.lease("cron")
        await first.__aenter__()
        async with asyncio.timeout(10):
            await held_first.wait_held()
        async with Node(store, "second", config, pg_url) as second:
            held_second = second.lease("cron")
            async with asyncio.timeout(10):
                await held_second.tried.wait()
            assert not held_second.held(), "the first holds it: the second stands by"
            await first.__aexit__(None, None, None)  # a clean stop releases the lease
            async with asyncio.timeout(10):
                await held_second.wait_held()
            assert held_second.token == 2


@pytest.mark.postgres
async def test_an_instance_counted_as_gone_registers_again_and_goes_on(pg_url: str) -> None:
    clock = FakeClock(utcnow())
    config = ClusterConfig(lease_ttl=2.0, heartbeat_interval=0.1)
    async with (
        Store.open(pg_url) as store,
        Node(store, "paused", config, pg_url, now=clock.now) as node,
    ):
        cron = node.lease("cron")
        async with asyncio.timeout(10):
            await cron.wait_held()
        assert node.membership.incarnation == 1
        later(clock, 60)  # as if it had been paused for a minute
        async with asyncio.timeout(10):
            while node.membership.incarnation < 2:
                await asyncio.sleep(0.02)
        assert not node.gone.is_set()
        async with asyncio.timeout(10):
            await cron.wait_held()


@pytest.mark.postgres
async def test_an_instance_whose_id_another_live_process_took_stops(pg_url: str) -> None:
    config = ClusterConfig(lease_ttl=2.0, heartbeat_interval=0.1)
    async with Store.open(pg_url) as store, Node(store, "twice", config, pg_url) as node:
        async with store.write() as conn:  # another machine starts under the same id
            await conn.execute(
                update(instances)
                .where(instances.c.id == "twice")
                .values(host="another-host", incarnation=instances.c.incarnation + 1)
            )
        async with asyncio.timeout(10):
            await node.gone.wait()


@pytest.mark.postgres
async def test_a_forgotten_lease_passes_to_another_instance_at_once(pg_url: str) -> None:
    config = ClusterConfig(lease_ttl=30.0, heartbeat_interval=0.1)
    async with Store.open(pg_url) as store, Node(store, "quitter", config, pg_url) as quitter:
        lease = quitter.lease("adapter:telegram:default")
        async with asyncio.timeout(10):
            await lease.wait_held()
        async with Node(store, "heir", config, pg_url) as heir:
            inherited = heir.lease("adapter:telegram:default")
            async with asyncio.timeout(10):
                await inherited.tried.wait()
            assert not inherited.held()
            await quitter.forget("adapter:telegram:default")
            assert not lease.held()
            async with asyncio.timeout(10):
                await inherited.wait_held()
            assert "adapter:telegram:default" not in quitter.holds()


async def test_a_stopped_instance_is_forgotten_after_forget_stopped(
    store: Store, clock: FakeClock
) -> None:
    day = 86_400.0
    for name in ("old", "recent"):
        member = Membership(store, name, TTL, now=clock.now, forget_stopped=day)
        await member.register()
        await member.leave()
        later(clock, day / 2 + 1)
    # "old" stopped a day and 2 s ago, "recent" half a day ago: only "old" goes.
    await Membership(store, "next", TTL, now=clock.now, forget_stopped=day).register()

    async with store.read() as conn:
        ids = set((await conn.scalars(select(instances.c.id))).all())
    assert ids == {"recent", "next"}
