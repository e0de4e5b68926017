"""Creating the database engine and applying migrations."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

logger = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).with_name("migrations")
SQLITE_BUSY_TIMEOUT_MS = 10_000


def create_engine(url: str, *, pool_size: int = 5) -> AsyncEngine:
    """An async engine for `url`. SQLite gets WAL, a busy timeout and explicit BEGINs.

    On SQLite, transactions opened on a connection with the execution option
    `herald_write=True` begin with `BEGIN IMMEDIATE`, so two writers queue on the busy
    timeout instead of failing when a read transaction tries to upgrade.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
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
