"""The agent's files in SQL (`memory_docs`): SOUL.md, and USER.md / MEMORY.md per memory
scope. Implements `agent_core.memory.MemoryDocs`: every instance reads the same files, and an
edit is one transaction that locks its row (PostgreSQL `FOR UPDATE`; SQLite has one writer),
so edits from several instances never lose each other."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.contracts.messages import utcnow
from gateway.store import Store
from gateway.store.sql import insert_or_skip
from gateway.store.tables import memory_docs


class SqlMemoryDocs:
    """`MemoryDocs` over a `Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def get(self, owner: str, name: str) -> str:
        """The document's text, "" when it does not exist."""

        async def work(conn: AsyncConnection) -> str | None:
            return await conn.scalar(
                select(memory_docs.c.text).where(
                    memory_docs.c.owner == owner, memory_docs.c.name == name
                )
            )

        return await self.store.unit(work, write=False) or ""

    async def edit(self, owner: str, name: str, change: Callable[[str], str]) -> str:
        """Replace the text by `change(text)` in one transaction holding the row; when
        `change` raises, nothing is written and the error propagates."""
        refused: list[Exception] = []

        async def work(conn: AsyncConnection) -> str:
            now = utcnow()
            await insert_or_skip(
                conn,
                memory_docs,
                {"owner": owner, "name": name, "text": "", "version": 0, "updated_at": now},
            )
            row = (
                await conn.execute(
                    select(memory_docs.c.text, memory_docs.c.version)
                    .where(memory_docs.c.owner == owner, memory_docs.c.name == name)
                    .with_for_update()
                )
            ).one()
            try:
                text = change(row.text)
            except Exception as err:  # the edit was refused: write nothing, say why outside
                refused.append(err)
                return str(row.text)
            await conn.execute(
                update(memory_docs)
                .where(memory_docs.c.owner == owner, memory_docs.c.name == name)
                .values(text=text, version=row.version + 1, updated_at=now)
            )
            return text

        text = await self.store.unit(work)
        if refused:
            raise refused[0]
        return text

    async def drop(self, owner: str) -> None:
        """Delete every document of `owner`."""

        async def work(conn: AsyncConnection) -> None:
            await conn.execute(delete(memory_docs).where(memory_docs.c.owner == owner))

        await self.store.unit(work)

    async def owners(self) -> list[str]:
        """Every scope with a document (SOUL.md's owner "" excluded)."""

        async def work(conn: AsyncConnection) -> list[str]:
            rows = await conn.scalars(
                select(memory_docs.c.owner).where(memory_docs.c.owner != "").distinct()
            )
            return sorted(rows)

        return await self.store.unit(work, write=False)
