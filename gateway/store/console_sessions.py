"""The console's logins in SQL: a row per login, deleted at logout, ignored once expired.

The console's session cookie is signed, but a signature cannot be taken back: the row is
what makes a logout final, for every instance sharing the database.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, insert, select

from gateway.contracts.messages import utcnow
from gateway.store import Store
from gateway.store.tables import console_sessions


class ConsoleSessions:
    """The `console_sessions` table."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def open(self, key: str, expires_at: datetime) -> None:
        """Record the login `key` until `expires_at`; forget the logins that expired."""
        now = utcnow()
        async with self.store.write() as conn:
            await conn.execute(delete(console_sessions).where(console_sessions.c.expires_at < now))
            await conn.execute(
                insert(console_sessions).values(id=key, created_at=now, expires_at=expires_at)
            )

    async def is_open(self, key: str) -> bool:
        """Whether the login `key` was recorded, not logged out, and has not expired."""
        async with self.store.read() as conn:
            found = await conn.scalar(
                select(console_sessions.c.id).where(
                    console_sessions.c.id == key, console_sessions.c.expires_at >= utcnow()
                )
            )
        return found is not None

    async def close(self, key: str) -> bool:
        """End the login `key`; whether it was open."""
        async with self.store.write() as conn:
            result = await conn.execute(
                delete(console_sessions).where(console_sessions.c.id == key)
            )
        return bool(result.rowcount)
