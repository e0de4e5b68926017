"""Small SQL helpers that differ between SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection


async def insert_ignore(
    conn: AsyncConnection, table: Table, values: Mapping[str, Any]
) -> int | None:
    """Insert one row unless it breaks a unique constraint; its id, or None if it existed.

    Unlike catching IntegrityError, this leaves a PostgreSQL transaction usable.
    """
    if conn.dialect.name == "postgresql":
        stmt: Any = postgresql.insert(table).values(**values).on_conflict_do_nothing()
    else:
        stmt = sqlite.insert(table).values(**values).on_conflict_do_nothing()
    result = await conn.execute(stmt.returning(table.c.id))
    row = result.first()
    return None if row is None else int(row[0])


async def insert_ignore_many(
    conn: AsyncConnection, table: Table, rows: Sequence[Mapping[str, Any]]
) -> list[int | None]:
    """`insert_ignore` for each row, in order."""
    return [await insert_ignore(conn, table, r) for r in rows]


async def insert_or_skip(conn: AsyncConnection, table: Table, values: Mapping[str, Any]) -> bool:
    """Insert one row unless it breaks a unique constraint; True when it was inserted."""
    if conn.dialect.name == "postgresql":
        stmt: Any = postgresql.insert(table).values(**values).on_conflict_do_nothing()
    else:
        stmt = sqlite.insert(table).values(**values).on_conflict_do_nothing()
    result = await conn.execute(stmt)
    return bool(result.rowcount)
