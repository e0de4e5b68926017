"""Creating the database engine and applying migrations."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Self

import aiosqlite
from aiosqlite.context import Result
from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import PoolResetState, StaticPool

logger = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).with_name("migrations")
SQLITE_BUSY_TIMEOUT_MS = 10_000
SQLITE_POOL_SIZE = 4
"""Connections to a SQLite database. Writes take turns in the process (`Store.write`), so
more would only add threads."""


def create_engine(url: str, *, pool_size: int = 5) -> AsyncEngine:
    """An async engine for `url`. SQLite gets WAL, a busy timeout and explicit BEGINs.

    On SQLite, transactions opened on a connection with the execution option
    `herald_write=True` begin with `BEGIN IMMEDIATE`, so two writers queue on the busy
    timeout instead of failing when a read transaction tries to upgrade. Its connections
    (`SQLITE_POOL_SIZE` of them, each with its own thread) stay open: none is opened or
    closed per transaction.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ":memory:"
        if database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)

        async def connect() -> aiosqlite.Connection:
            def connector() -> sqlite3.Connection:
                # The connection is used from its own thread and, for steps that never
                # touch the disk, from the event loop's; never from both at once.
                return sqlite3.connect(
                    database, timeout=SQLITE_BUSY_TIMEOUT_MS / 1000, check_same_thread=False
                )

            return await _Connection(connector, 64)

        # One connection is the whole of an in-memory database.
        pool: dict[str, Any] = (
            {"poolclass": StaticPool}
            if database == ":memory:"
            else {"pool_size": SQLITE_POOL_SIZE, "max_overflow": 0}
        )
        engine = create_async_engine(url, async_creator=connect, pool_reset_on_return=None, **pool)
        _sqlite_pragmas(engine)
        return engine
    return create_async_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True)


def _sqlite_pragmas(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from the driver; `_on_begin` issues BEGIN itself.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Connection) -> None:
        write = conn.get_execution_options().get("herald_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    @event.listens_for(engine.sync_engine.pool, "reset")
    def _on_reset(dbapi_connection: Any, _record: Any, state: PoolResetState) -> None:
        # Instead of the pool's unconditional ROLLBACK on return (one more trip to the
        # connection's thread per transaction): roll back only what is still open.
        if state.asyncio_safe and dbapi_connection.driver_connection.in_transaction:
            dbapi_connection.rollback()


class _Cursor(aiosqlite.Cursor):
    """One trip to the connection's thread per statement: the rows come back with it.

    aiosqlite makes a trip for creating the cursor, executing, fetching and closing; each
    trip wakes a thread and then the event loop. Creating and closing a cursor and handing
    out rows already read touch no disk, so they run here.
    """

    _rows: list[Any] | None = None

    async def execute(self, sql: str, parameters: Iterable[Any] | None = None) -> Self:
        """Execute, and read every row of a result in the same trip."""
        fetch = self._execute_and_fetch
        self._rows = await self._execute(fetch, sql, parameters or ())  # type: ignore[no-untyped-call]
        return self

    async def executemany(self, sql: str, parameters: Iterable[Iterable[Any]]) -> Self:
        """Execute once per parameter set (no rows to read)."""
        self._rows = None
        await super().executemany(sql, parameters)
        return self

    def _execute_and_fetch(self, sql: str, parameters: Any) -> list[Any] | None:
        cursor = self._cursor.execute(sql, parameters)
        return None if cursor.description is None else cursor.fetchall()

    async def fetchone(self) -> Any:
        """The next row read, or None."""
        if self._rows is None:
            return await super().fetchone()
        return self._rows.pop(0) if self._rows else None

    async def fetchmany(self, size: int | None = None) -> list[Any]:
        """Up to `size` (default `arraysize`) of the rows read."""
        if self._rows is None:
            return list(await super().fetchmany(size))
        count = self.arraysize if size is None else size
        taken, self._rows = self._rows[:count], self._rows[count:]
        return taken

    async def fetchall(self) -> list[Any]:
        """The rows read and not yet taken."""
        if self._rows is None:
            return list(await super().fetchall())
        taken, self._rows = self._rows, []
        return taken

    async def close(self) -> None:
        """Close the cursor (no disk work: done here)."""
        self._rows = None
        self._cursor.close()


class _Connection(aiosqlite.Connection):
    """An aiosqlite connection whose cursors are `_Cursor`s, created without a trip."""

    def cursor(self) -> Result[aiosqlite.Cursor]:
        """A new cursor (awaitable, or an async context manager that closes it)."""
        return Result(self._new_cursor())

    async def _new_cursor(self) -> aiosqlite.Cursor:
        return _Cursor(self, self._conn.cursor())


def alembic_config() -> AlembicConfig:
    """Alembic's configuration, built in code (there is no alembic.ini)."""
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def _upgrade(connection: Connection, revision: str) -> None:
    cfg = alembic_config()
    cfg.attributes["connection"] = connection
    command.upgrade(cfg, revision)


def _current(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    """Apply migrations up to `revision`; a no-op when the schema is already there."""
    async with engine.connect() as plain:
        conn = await plain.execution_options(herald_write=True)
        async with conn.begin():
            await conn.run_sync(_upgrade, revision)


async def current_revision(engine: AsyncEngine) -> str | None:
    """The schema revision the database is at (None before the first migration)."""
    async with engine.connect() as conn:
        return await conn.run_sync(_current)


def head_revision() -> str | None:
    """The newest revision this code ships."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()
