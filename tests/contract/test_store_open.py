"""`Store.open` on both backends: `create=False` never creates a database, and a database
that a newer Herald migrated is refused with what to do, before anything is written."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from gateway.contracts.errors import SetupError
from gateway.metrics import Metrics
from gateway.store import Store
from gateway.store import engine as engine_mod
from gateway.store.stats import StoreStats

pytestmark = pytest.mark.timeout(60)

FUTURE = "9999_from_the_future"


async def test_create_false_refuses_a_database_without_herald(store_url: str) -> None:
    with pytest.raises(SetupError, match="nothing was ever stored there"):
        async with Store.open(store_url, create=False):
            pass

    # Still nothing there: the default open migrates from the very first revision.
    async with Store.open(store_url) as store:
        assert await engine_mod.current_revision(store.engine) == engine_mod.head_revision()


async def test_create_false_opens_an_existing_database(store_url: str) -> None:
    async with Store.open(store_url):
        pass

    async with Store.open(store_url, create=False) as store:
        assert await engine_mod.current_revision(store.engine) == engine_mod.head_revision()


async def stamp_future(store_url: str) -> None:
    """Leave the database as a newer Herald would: at a revision this code does not ship."""
    async with Store.open(store_url) as store, store.engine.begin() as conn:
        await conn.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": FUTURE})


async def test_a_database_newer_than_the_code_is_refused(store_url: str) -> None:
    await stamp_future(store_url)

    with pytest.raises(SetupError) as caught:
        async with Store.open(store_url):
            pass

    message = str(caught.value)
    assert message.startswith("this database (")
    assert f"was upgraded by a newer Herald (revision {FUTURE}; " in message
    assert message.endswith("upgrade Herald or restore a backup")


async def test_without_migrating_a_newer_database_opens_and_is_unknown(store_url: str) -> None:
    await stamp_future(store_url)

    async with Store.open(store_url, migrate=False) as store:
        current = await engine_mod.current_revision(store.engine)

    assert current == FUTURE
    assert not engine_mod.known_revision(FUTURE)


async def test_the_store_counts_its_statements_transactions_and_handoffs(store_url: str) -> None:
    async with Store.open(store_url) as store:
        before = dataclasses.replace(store.stats)
        async with store.read() as conn:
            await conn.execute(text("SELECT 1"))
            await conn.execute(text("SELECT 2"))
        stats = store.stats
        assert stats.transactions - before.transactions == 1
        # Two statements (and on SQLite the BEGIN Herald sends itself).
        sent = stats.statements - before.statements
        assert sent == (3 if store.dialect == "sqlite" else 2)
        # At least a trip per statement (SQLite's BEGIN travels with the first) and one to
        # end the transaction.
        assert stats.handoffs - before.handoffs >= 2 + 1

        metrics = Metrics()
        metrics.watch_store(store.stats)
        shown = metrics.render().decode()
        assert f"herald_store_statements_total {float(stats.statements)}" in shown
        assert f"herald_store_transactions_total {float(stats.transactions)}" in shown
        assert "herald_store_handoffs_total " in shown
        assert "herald_store_pings_total " in shown


async def _terminate_others(url: str) -> None:
    """Close every other server connection to the database, as a server restart would."""
    admin = create_async_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            await conn.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
    finally:
        await admin.dispose()


@pytest.mark.postgres
@pytest.mark.parametrize("idle", [0.0, 3600.0])
async def test_postgres_pings_only_a_connection_that_sat_idle(pg_url: str, idle: float) -> None:
    """The pool's liveness check is PostgreSQL's (SQLite has no connection to lose)."""
    store_url = pg_url
    async with Store.open(store_url):
        pass  # migrated
    stats = StoreStats()
    engine = engine_mod.create_engine(store_url, stats=stats, ping_idle=idle)
    try:
        for _ in range(3):
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
        # A new connection is never pinged; a reused one only past the idle time.
        assert stats.pings == (2 if idle == 0.0 else 0)
        await _terminate_others(store_url)
        if idle == 0.0:
            # Pinged, found closed and replaced before use: the statement never sees it.
            async with engine.connect() as conn:
                assert await conn.scalar(text("SELECT 1")) == 1
        else:
            # Used a moment ago, not pinged: the statement fails as a disconnect, which
            # empties the pool, and the next transaction gets a new connection.
            with pytest.raises(DBAPIError) as caught:
                async with engine.connect() as conn:
                    await conn.execute(text("SELECT 1"))
            assert caught.value.connection_invalidated
            async with engine.connect() as conn:
                assert await conn.scalar(text("SELECT 1")) == 1
    finally:
        await engine.dispose()


@pytest.mark.postgres
async def test_instances_starting_together_on_an_empty_database_all_open(pg_url: str) -> None:
    """Several instances started at once on an empty PostgreSQL database (compose, a fleet)
    migrate one after the other: none fails on a table another one is creating."""

    async def open_one() -> str | None:
        async with Store.open(pg_url) as store:
            return await engine_mod.current_revision(store.engine)

    revisions = await asyncio.gather(*(open_one() for _ in range(4)))
    assert revisions == [engine_mod.head_revision()] * 4
