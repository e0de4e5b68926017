"""A database whose disk fills up and frees again on demand, for a `Store` a test owns.

While `full`, every write statement fails as the database itself fails it: on SQLite with the
error SQLite raises on a full disk (`database or disk is full`, SQLITE_FULL; raised before the
statement reaches SQLite, since a real full disk cannot be made portably without root); on
PostgreSQL the transaction is made read-only first, so the server itself refuses the write
(`cannot execute UPDATE in a read-only transaction`, SQLSTATE 25006). Reads keep working, as
they do on a full disk.
"""

from __future__ import annotations

import re
import sqlite3
from types import TracebackType
from typing import Any, Self

from sqlalchemy import event

from gateway.store import Store

WRITE = re.compile(r"^\s*(INSERT|UPDATE|DELETE)\b", re.IGNORECASE)


class FullDisk:
    """Install on `store`'s engine for a `with` block; flip `full` to fill or free the disk."""

    def __init__(self, store: Store, *, full: bool = False) -> None:
        self.store = store
        self.full = full
        self.refused: list[str] = []
        """The write statements refused so far (what the retry loops tried), in order."""

    def __enter__(self) -> Self:
        event.listen(self.store.engine.sync_engine, "before_cursor_execute", self._before)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        event.remove(self.store.engine.sync_engine, "before_cursor_execute", self._before)

    def _before(  # noqa: PLR0917 - SQLAlchemy's event signature
        self,
        conn: Any,
        cursor: Any,
        statement: str,
        parameters: Any,
        context: Any,
        executemany: bool,
    ) -> None:
        if not self.full or not WRITE.match(statement):
            return
        self.refused.append(statement)
        if conn.dialect.name == "sqlite":
            err = sqlite3.OperationalError("database or disk is full")
            err.sqlite_errorcode = sqlite3.SQLITE_FULL
            err.sqlite_errorname = "SQLITE_FULL"
            raise err
        cursor.execute("SET TRANSACTION READ ONLY")
