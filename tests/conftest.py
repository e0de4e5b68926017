"""Fixtures shared by every test: databases for the store, an opened `Store`."""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
from sqlalchemy import NullPool
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import create_async_engine

from gateway.store import Store
from tests.services import require_service

T = TypeVar("T")

PG_HOST = "127.0.0.1"
PG_PORT = 5432
PG_USER = "postgres"
PG_ADMIN_DATABASE = "test"
PG_SERVICE = f"PostgreSQL on {PG_HOST}:{PG_PORT}"
PG_CONNECT_TIMEOUT = 5.0


def _run_in_thread(make: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to completion on a private event loop in a worker thread.

    Sync fixtures must not call `asyncio.run` on the main thread: it would replace the
    thread's current event loop, which pytest-asyncio owns.
    """

    async def main() -> T:
        return await make()

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="pg-admin") as pool:
        return pool.submit(asyncio.run, main()).result()


@dataclass(frozen=True, slots=True)
class PgServer:
    """The test machine's PostgreSQL server, reached through its `test` database."""

    host: str = PG_HOST
    port: int = PG_PORT
    user: str = PG_USER

    def url(self, database: str) -> str:
        """The SQLAlchemy URL of `database` on this server."""
        return f"postgresql+asyncpg://{self.user}@{self.host}:{self.port}/{database}"

    async def execute(self, *statements: str, database: str = PG_ADMIN_DATABASE) -> None:
        """Run `statements` in `database`, each in autocommit (CREATE DATABASE needs that)."""
        engine = create_async_engine(
            self.url(database),
            poolclass=NullPool,
            isolation_level="AUTOCOMMIT",
            connect_args={"timeout": PG_CONNECT_TIMEOUT},
        )
        try:
            async with engine.connect() as conn:
                for statement in statements:
                    await conn.exec_driver_sql(statement)
        finally:
            await engine.dispose()

    def create_database(self) -> str:
        """Create an empty, uniquely named database and return its name."""
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        name = f"herald_t_{worker}_{secrets.token_hex(4)}"
        # template0 is never connected to, so concurrent CREATEs from xdist workers cannot
        # trip over "source database is being accessed by other users".
        _run_in_thread(
            lambda: self.execute(f"CREATE DATABASE \"{name}\" TEMPLATE template0 ENCODING 'UTF8'")
        )
        return name

    def drop_database(self, name: str) -> None:
        """Drop `name`; FORCE terminates any connection a test left open."""
        _run_in_thread(lambda: self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    def empty_database(self, name: str) -> None:
        """Make `name` as empty as a new database: no connections, no tables, no revision."""
        _run_in_thread(
            lambda: self.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()",
                "DROP SCHEMA public CASCADE",
                "CREATE SCHEMA public",
                database=name,
            )
        )


@pytest.fixture(scope="session")
def pg_server() -> PgServer:
    """The PostgreSQL server, checked once per worker; skips (or fails) when unreachable."""
    server = PgServer()
    try:
        _run_in_thread(lambda: server.execute("SELECT 1"))
    except (OSError, TimeoutError, SQLAlchemyError) as err:
        problem = f"{type(err).__name__}: {err}"
    else:
        return server
    # Outside the except block, so the report is not a chained traceback.
    require_service(PG_SERVICE, problem)


@pytest.fixture(scope="session")
def pg_database(pg_server: PgServer) -> Iterator[str]:
    """This worker's own PostgreSQL database, created once and dropped at the end."""
    name = pg_server.create_database()
    try:
        yield name
    finally:
        pg_server.drop_database(name)


@pytest.fixture
def pg_url(pg_server: PgServer, pg_database: str) -> str:
    """The URL of an empty PostgreSQL database (no schema, no revision) for one test.

    Each xdist worker owns one database and empties it before every test: as fresh as a new
    database, at about half the cost of CREATE + DROP DATABASE per test.
    """
    pg_server.empty_database(pg_database)
    return pg_server.url(pg_database)


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty database, once per store backend."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'herald.db'}"
    url = request.getfixturevalue("pg_url")
    assert isinstance(url, str)
    return url


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    """A migrated `Store` on a fresh database of each backend."""
    async with Store.open(store_url) as opened:
        yield opened
