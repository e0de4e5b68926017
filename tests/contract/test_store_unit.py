"""`Store.unit`: a transaction given as a function, on SQLite run whole on the connection's
thread in one trip. Each test runs on SQLite and on PostgreSQL through `store`."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest
from sqlalchemy import func, insert, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.contracts.messages import utcnow
from gateway.store import Store
from gateway.store import engine as engine_mod
from gateway.store.tables import users

pytestmark = pytest.mark.timeout(30)


async def add_user(conn: AsyncConnection, user_id: str) -> None:
    await conn.execute(insert(users).values(id=user_id, display_name="", created_at=utcnow()))


async def user_ids(store: Store) -> list[str]:
    async with store.read() as conn:
        return list((await conn.scalars(select(users.c.id).order_by(users.c.id))).all())


async def blocking_sql(store: Store) -> tuple[threading.Event, threading.Event]:
    """`SELECT herald_test_block()` on any pooled SQLite connection sets the first event and
    waits (on the connection's thread) for the second: a test's hook into that thread. Each
    connection is held at once while the function is added, so that each is opened."""
    inside, release = threading.Event(), threading.Event()

    def block() -> int:
        inside.set()
        release.wait(10)
        return 1

    async with contextlib.AsyncExitStack() as stack:
        for _ in range(engine_mod.SQLITE_POOL_SIZE):
            conn = await stack.enter_async_context(store.engine.connect())
            driver = (await conn.get_raw_connection()).driver_connection
            assert isinstance(driver, engine_mod.SqliteConnection)
            await driver.create_function("herald_test_block", 0, block)
    return inside, release


async def test_a_unit_commits_and_returns_its_result(store: Store) -> None:
    async def work(conn: AsyncConnection) -> int:
        await add_user(conn, "u1")
        await add_user(conn, "u2")
        return int(await conn.scalar(select(func.count()).select_from(users)) or 0)

    before = store.stats.handoffs
    assert await store.unit(work) == 2
    assert (
        await store.unit(lambda conn: conn.scalar(select(func.min(users.c.id))), write=False)
        == "u1"
    )
    if store.dialect == "sqlite":
        # BEGIN, three statements and COMMIT, then a read: one trip to the thread each.
        assert store.stats.handoffs - before == 2
    assert await user_ids(store) == ["u1", "u2"]


async def test_a_unit_that_raises_is_rolled_back(store: Store) -> None:
    async def work(conn: AsyncConnection) -> None:
        await add_user(conn, "u1")
        raise LookupError("changed my mind")

    with pytest.raises(LookupError, match="changed my mind"):
        await store.unit(work)
    assert await user_ids(store) == []
    await store.unit(lambda conn: add_user(conn, "u2"))  # the connection is usable again
    assert await user_ids(store) == ["u2"]


async def test_a_sqlite_unit_that_awaits_anything_else_is_refused_and_rolled_back(
    store: Store,
) -> None:
    if store.dialect != "sqlite":
        pytest.skip("PostgreSQL runs a unit on the event loop: it may await anything")

    async def work(conn: AsyncConnection) -> None:
        await add_user(conn, "u1")
        await asyncio.sleep(0)  # not the database

    with pytest.raises(RuntimeError, match="awaited something other than the database"):
        await store.unit(work)
    assert await user_ids(store) == []
    await store.unit(lambda conn: add_user(conn, "u2"))
    assert await user_ids(store) == ["u2"]


@pytest.mark.parametrize("cancels", [1, 2], ids=["cancelled", "cancelled-twice"])
async def test_a_unit_cancelled_while_it_runs_ends_before_the_cancel_is_raised(
    store: Store, cancels: int
) -> None:
    """Twice: as a shutdown cancelling what was already being cancelled. The connection stays
    out of the pool until the unit ends on its thread."""
    if store.dialect != "sqlite":
        pytest.skip("on PostgreSQL a cancelled unit is rolled back as any transaction")
    inside, release = await blocking_sql(store)

    async def work(conn: AsyncConnection) -> None:
        await add_user(conn, "u1")
        await conn.execute(text("SELECT herald_test_block()"))
        await add_user(conn, "u2")

    task = asyncio.create_task(store.unit(work))
    await asyncio.to_thread(inside.wait, 10)
    for _ in range(cancels):
        task.cancel()
        await asyncio.sleep(0)
    assert not task.done()  # waiting for the unit to end on its thread
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    # It ran to its end (committed): cancelling never leaves a half-done transaction open.
    assert await user_ids(store) == ["u1", "u2"]
    await store.unit(lambda conn: add_user(conn, "u3"))
    assert await user_ids(store) == ["u1", "u2", "u3"]


async def test_a_write_unit_cancelled_while_waiting_for_its_turn_never_runs(store: Store) -> None:
    if store.dialect != "sqlite":
        pytest.skip("PostgreSQL's writers do not take turns in the process")
    ran = asyncio.Event()

    async def work(conn: AsyncConnection) -> None:
        ran.set()
        await add_user(conn, "late")

    async with store.write() as conn:
        await add_user(conn, "first")
        task = asyncio.create_task(store.unit(work))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert not ran.is_set()
    assert await user_ids(store) == ["first"]


async def test_units_of_many_tasks_at_once_all_commit(store: Store) -> None:
    async def one(i: int) -> None:
        await store.unit(lambda conn: add_user(conn, f"u{i:02}"))

    await asyncio.gather(*(one(i) for i in range(20)))
    assert await user_ids(store) == [f"u{i:02}" for i in range(20)]
