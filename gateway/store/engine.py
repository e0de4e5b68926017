"""Creating the database engine and applying migrations."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import pwd
import sqlite3
import threading
import time
from collections.abc import Coroutine, Iterable
from pathlib import Path
from typing import Any, Self, TypeVar

import aiosqlite
from aiosqlite.context import Result
from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, event, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import PoolResetState, StaticPool

from gateway.contracts.errors import DatabaseUnavailable, HeraldError, SetupError
from gateway.store.stats import StoreStats, watch

logger = logging.getLogger(__name__)
T = TypeVar("T")
AWAITED_ELSEWHERE = (
    "a unit of work awaited something other than the database (a bug: see Store.unit)"
)

MIGRATIONS = Path(__file__).with_name("migrations")
SQLITE_BUSY_TIMEOUT_MS = 10_000
SQLITE_POOL_SIZE = 4
"""Connections to a SQLite database. Writes take turns in the process (`Store.write`), so
more would only add threads."""


def create_engine(
    url: str,
    *,
    pool_size: int = 5,
    stats: StoreStats | None = None,
    ping_idle: float | None = None,
) -> AsyncEngine:
    """An async engine for `url`. SQLite gets WAL, a busy timeout and explicit BEGINs.

    With `stats`, its statements, transactions and hand-offs to the driver are counted
    there. On PostgreSQL, a pooled connection idle for `ping_idle` seconds (default
    `PING_IDLE_SECONDS`) is checked before use.

    On SQLite, transactions opened on a connection with the execution option
    `herald_write=True` begin with `BEGIN IMMEDIATE`, so two writers queue on the busy
    timeout instead of failing when a read transaction tries to upgrade; the BEGIN goes to
    the connection's thread with the transaction's first statement, not on a trip of its
    own. Its connections (`SQLITE_POOL_SIZE` of them, each with its own thread) stay open:
    none is opened or closed per transaction.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ":memory:"
        if database != ":memory:":
            # Private like the state directory the daemon makes (the database holds chats).
            Path(database).parent.mkdir(parents=True, exist_ok=True, mode=0o700)

        async def connect() -> aiosqlite.Connection:
            def connector() -> sqlite3.Connection:
                # The connection is used from its own thread and, for steps that never
                # touch the disk, from the event loop's; never from both at once.
                return sqlite3.connect(
                    database, timeout=SQLITE_BUSY_TIMEOUT_MS / 1000, check_same_thread=False
                )

            connection = SqliteConnection(connector, 64)
            connection.stats = stats
            return await connection

        # One connection is the whole of an in-memory database.
        pool: dict[str, Any] = (
            {"poolclass": StaticPool}
            if database == ":memory:"
            else {"pool_size": SQLITE_POOL_SIZE, "max_overflow": 0}
        )
        engine = create_async_engine(url, async_creator=connect, pool_reset_on_return=None, **pool)
        _sqlite_pragmas(engine)
    else:
        engine = create_async_engine(url, pool_size=pool_size, max_overflow=pool_size)
        _ping_when_idle(engine, stats, PING_IDLE_SECONDS if ping_idle is None else ping_idle)
    if stats is not None:
        watch(engine, stats)
    return engine


PING_IDLE_SECONDS = 2.0
"""A pooled PostgreSQL connection unused this long is pinged before it is handed out."""


def _ping_when_idle(engine: AsyncEngine, stats: StoreStats | None, idle: float) -> None:
    """Check a pooled connection before use only when it sat `idle` seconds or more.

    Instead of `pool_pre_ping`'s round trip on every checkout: a connection back from a
    transaction a moment ago was alive then. One that sat idle may have been closed by the
    server (a restart, `pg_terminate_backend`, an idle timeout); it is replaced here. A
    connection lost in between fails its statement as a disconnect, which invalidates the
    whole pool, so the next checkout gets a fresh connection.
    """
    pool = engine.sync_engine.pool
    dialect = engine.sync_engine.dialect

    @event.listens_for(pool, "checkin")
    def _on_checkin(_dbapi: Any, record: Any) -> None:
        if record is not None:
            record.info["herald_used"] = time.monotonic()

    @event.listens_for(pool, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        used = record.info.get("herald_used")
        if used is None or time.monotonic() - used < idle:
            return  # new for this checkout, or used a moment ago
        if stats is not None:
            stats.pings += 1
        try:
            dialect.do_ping(dbapi_connection)
        except Exception as err:
            # The pool replaces the connection and tries the checkout again.
            raise DisconnectionError(f"the connection failed while idle: {err}") from err


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
        # Not a trip of its own: the connection's thread sends BEGIN just before the
        # transaction's first statement, in that statement's trip.
        write = conn.get_execution_options().get("herald_write", False)
        driver = conn.connection.driver_connection
        assert isinstance(driver, SqliteConnection)
        driver.pending_begin = "BEGIN IMMEDIATE" if write else "BEGIN"

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
        await self._execute(self._execute_many, sql, parameters)  # type: ignore[no-untyped-call]
        return self

    def _begin_pending(self) -> None:
        # On the connection's thread: the BEGIN of the transaction this statement opens.
        connection = self._conn
        assert isinstance(connection, SqliteConnection)
        begin, connection.pending_begin = connection.pending_begin, None
        if begin is not None:
            self._cursor.execute(begin)
            if connection.stats is not None:
                connection.stats.statements += 1

    def _execute_and_fetch(self, sql: str, parameters: Any) -> list[Any] | None:
        self._begin_pending()
        cursor = self._cursor.execute(sql, parameters)
        return None if cursor.description is None else cursor.fetchall()

    def _execute_many(self, sql: str, parameters: Any) -> None:
        self._begin_pending()
        self._cursor.executemany(sql, parameters)

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


class SqliteConnection(aiosqlite.Connection):
    """An aiosqlite connection whose cursors are `_Cursor`s, created without a trip; each
    trip to its thread is counted in `stats`."""

    stats: StoreStats | None = None
    pending_begin: str | None = None
    """The BEGIN that the next statement sends first (set when a transaction begins)."""
    inline = False
    """Set on the connection's thread while `run_whole` drives a unit of work there: each
    call runs at once, in that thread, instead of being queued to it."""

    async def _execute(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self.inline and threading.get_ident() == self._thread.ident:
            return fn(*args, **kwargs)  # inside `run_whole`, on the connection's own thread
        if self.stats is not None:
            self.stats.handoffs += 1
        return await super()._execute(fn, *args, **kwargs)  # type: ignore[no-untyped-call]

    async def run_whole(self, unit: Coroutine[Any, Any, T]) -> T:
        """Run `unit` (a coroutine that awaits nothing but this connection) on this
        connection's thread: its statements, BEGIN and COMMIT in one trip there.

        A `unit` that awaits anything else is closed there (its transaction rolled back) and
        RuntimeError is raised. Cancelled while it runs, the unit still finishes (committed
        or not) before CancelledError is raised; cancelled before it starts, it never runs.
        """
        dropped = threading.Event()
        if not self._running or not self._connection:
            unit.close()
            raise ValueError("Connection closed")
        # As aiosqlite's own trips are queued, without a task of its own.
        trip: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._tx.put_nowait((trip, functools.partial(self._drive, unit, dropped)))
        if self.stats is not None:
            self.stats.handoffs += 1
        try:
            return await asyncio.shield(trip)
        except asyncio.CancelledError:
            dropped.set()  # not started yet: it never will be
            # Started: it runs to its end on the thread, and its connection stays out of the
            # pool until then, however many times this task is cancelled meanwhile.
            while not trip.done():
                with contextlib.suppress(BaseException):
                    await asyncio.shield(trip)
            raise

    def _drive(self, unit: Coroutine[Any, Any, T], dropped: threading.Event) -> T:
        if dropped.is_set():
            unit.close()
            raise asyncio.CancelledError
        self.inline = True
        try:
            try:
                unit.send(None)
            except StopIteration as done:
                result: T = done.value
                return result
            except RuntimeError as err:
                if "event loop" not in str(err):
                    raise
                # It asked for the loop (a sleep, a lock, a task): rolled back as it unwound.
                raise RuntimeError(AWAITED_ELSEWHERE) from err
            unit.close()  # it waited for something else: rolled back where it stood
            raise RuntimeError(AWAITED_ELSEWHERE)
        finally:
            self.inline = False

    # The pending BEGIN is dropped on the connection's thread, in the order of its trips: a
    # statement still on its way there when its task was cancelled sends it, and the
    # ROLLBACK queued behind it then ends that transaction.
    async def commit(self) -> None:
        """Commit the transaction (one that ran no statement never began: nothing to end)."""
        await self._execute(self._end, self._conn.commit)

    async def rollback(self) -> None:
        """Roll back the transaction, if one began."""
        await self._execute(self._end, self._conn.rollback)

    def _end(self, end: Any) -> None:
        self.pending_begin = None
        end()

    def cursor(self) -> Result[aiosqlite.Cursor]:
        """A new cursor (awaitable, or an async context manager that closes it)."""
        return Result(self._new_cursor())

    async def _new_cursor(self) -> aiosqlite.Cursor:
        return _Cursor(self, self._conn.cursor())


MIGRATE_LOCK = "herald-migrate"
"""The name of the PostgreSQL advisory lock an upgrade holds for its transaction."""


def alembic_config() -> AlembicConfig:
    """Alembic's configuration, built in code (there is no alembic.ini)."""
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def _upgrade(connection: Connection, revision: str) -> None:
    cfg = alembic_config()
    _check_known(connection, ScriptDirectory.from_config(cfg))
    cfg.attributes["connection"] = connection
    command.upgrade(cfg, revision)


def _check_known(connection: Connection, script: ScriptDirectory) -> None:
    """SetupError when the database is at a revision this code does not ship."""
    current = _current(connection)
    if current is None or known_revision(current):
        return
    where = connection.engine.url.render_as_string(hide_password=True)
    raise SetupError(
        f"this database ({where}) was upgraded by a newer Herald (revision {current}; "
        f"this Herald knows up to {script.get_current_head()}); "
        "upgrade Herald or restore a backup"
    )


def _current(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    """Apply migrations up to `revision`; a no-op when the schema is already there.

    Raises SetupError when the database was migrated by a newer Herald.
    """
    async with engine.connect() as plain:
        conn = await plain.execution_options(herald_write=True)
        async with conn.begin():
            if conn.dialect.name == "postgresql":
                # Instances starting together on one database migrate one after the other
                # (the lock is the transaction's); the later ones then find the schema done.
                await conn.execute(select(func.pg_advisory_xact_lock(func.hashtext(MIGRATE_LOCK))))
            await conn.run_sync(_upgrade, revision)


async def current_revision(engine: AsyncEngine) -> str | None:
    """The schema revision the database is at (None before the first migration)."""
    async with engine.connect() as conn:
        return await conn.run_sync(_current)


def head_revision() -> str | None:
    """The newest revision this code ships."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def known_revision(revision: str) -> bool:
    """Whether this code ships `revision` (False: a newer Herald migrated the database)."""
    script = ScriptDirectory.from_config(alembic_config())
    return revision in {r.revision for r in script.walk_revisions()}


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite database URL; None for PostgreSQL and in-memory SQLite."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


async def open_engine(
    url: str, *, migrate: bool = True, create: bool = True, stats: StoreStats | None = None
) -> AsyncEngine:
    """A connected engine for `url`, migrated unless `migrate` is False.

    With `create` False, a database that does not exist yet (no SQLite file, or no Herald
    schema in it) raises SetupError instead of being created. A database that cannot be
    opened raises SetupError (fix the path, the permissions or `database_url`) or, for a
    PostgreSQL server that does not answer, DatabaseUnavailable.
    """
    path = sqlite_file(url)
    try:
        if path is not None:
            if not create and not path.exists():
                raise _missing(path)
            await asyncio.to_thread(_probe_sqlite, path)
        engine = create_engine(url, stats=stats)
    except (OSError, sqlite3.Error) as err:
        raise open_failure(url, err) from err
    try:
        try:
            current = await current_revision(engine)
        except (OSError, DBAPIError, sqlite3.Error) as err:
            raise open_failure(url, err) from err
        if not create and current is None and path is not None:
            raise _missing(path)
        if not create and current is None:
            raise SetupError(
                f"no Herald schema in {_shown(url)}: nothing was ever stored there; check "
                "database_url, or start Herald once to create it"
            )
        if migrate:
            await upgrade(engine)
    except BaseException:
        await engine.dispose()
        raise
    return engine


def _missing(path: Path) -> SetupError:
    return SetupError(
        f"no Herald database at {path}: nothing was ever stored there. Check state_dir "
        "(HERALD_HOME) and --config point at the daemon's state, or start Herald there once"
    )


def _probe_sqlite(path: Path) -> None:
    """Open the file once, so that failing to is an error here rather than in a pool thread."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    connection = sqlite3.connect(path, timeout=SQLITE_BUSY_TIMEOUT_MS / 1000)
    try:
        connection.execute("PRAGMA user_version").fetchone()
    finally:
        connection.close()


def _shown(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def _user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"


def open_failure(url: str, err: BaseException) -> HeraldError:
    """The error that tells an operator why the database at `url` cannot be opened."""
    reason = str(getattr(err, "orig", None) or err)
    if isinstance(err, OSError) and err.strerror:
        reason = f"{err.strerror}: {err.filename}" if err.filename else err.strerror
    path = sqlite_file(url)
    if path is not None:
        return SetupError(
            f"cannot open the SQLite database {path}: {reason}; make {path.parent} a "
            f"directory that {_user()} can write, or set state_dir (HERALD_HOME) elsewhere"
        )
    if isinstance(err, OSError):
        return DatabaseUnavailable(
            f"the database server of {_shown(url)} does not answer: {reason}; "
            "start it, or fix database_url"
        )
    return SetupError(
        f"the database server of {_shown(url)} refused the connection: {reason}; "
        "fix database_url (user, password, database name)"
    )
