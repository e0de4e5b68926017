"""Fixtures shared by every test: databases for the store, an opened `Store`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import pytest
from sqlalchemy import NullPool
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import create_async_engine

from gateway.store import Store
from tests.services import require_service

if TYPE_CHECKING:
    from tests.fakes.s3 import MotoS3

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


def _herald_children() -> set[int]:
    """The `herald run` processes this test worker started (its children) still running."""
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes().split(b"\0") if ppid == os.getpid() else []
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if b"run" in command and any(part.endswith(b"/herald") for part in command):
            found.add(int(entry.name))
    return found


@pytest.fixture(autouse=True)
def no_daemon_outlives_its_test() -> Iterator[None]:
    """Kill a `herald run` that a test started and left running: a test cut off by its
    timeout never reaches its own cleanup, and a leftover daemon would slow every later test."""
    before = _herald_children()
    yield
    for pid in _herald_children() - before:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


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

    def copy_database(self, name: str, template: str) -> None:
        """Make `name` a fresh copy of `template` (dropped first if it exists)."""
        _run_in_thread(
            lambda: self.execute(
                f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)',
                f'CREATE DATABASE "{name}" TEMPLATE "{template}"',
            )
        )

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


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database migrated once per worker: each `store` starts as a copy of it."""
    path = tmp_path_factory.mktemp("template") / "herald.db"

    async def migrate() -> None:
        async with Store.open(f"sqlite+aiosqlite:///{path}"):
            pass

    _run_in_thread(migrate)
    return path


@pytest.fixture(scope="session")
def pg_template(pg_server: PgServer) -> Iterator[str]:
    """A PostgreSQL database migrated once per worker: each `store` starts as a copy of it."""
    name = pg_server.create_database()

    async def migrate() -> None:
        async with Store.open(pg_server.url(name)):
            pass

    try:
        _run_in_thread(migrate)
        yield name
    finally:
        pg_server.drop_database(name)


@pytest.fixture
def migrated_url(store_url: str, request: pytest.FixtureRequest) -> str:
    """`store_url`, its database made a copy of one migrated once per worker (migrating
    takes a fifth of a second per test; copying a few milliseconds)."""
    if store_url.startswith("sqlite"):
        path = Path(store_url.split(":///", 1)[1])
        if not path.exists():
            shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
    else:
        server: PgServer = request.getfixturevalue("pg_server")
        database: str = request.getfixturevalue("pg_database")
        server.copy_database(database, request.getfixturevalue("pg_template"))
    return store_url


@pytest.fixture
async def store(migrated_url: str) -> AsyncIterator[Store]:
    """A migrated `Store` on a fresh database of each backend (the one `store_url` names);
    opening it still runs the migrations, with none left to do."""
    async with Store.open(migrated_url) as opened:
        yield opened


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    """moto's standalone S3 server on 127.0.0.1, one per test worker (a bucket per test)."""
    from tests.fakes.s3 import moto_server

    with moto_server() as server:
        yield server
