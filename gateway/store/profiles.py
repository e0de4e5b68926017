"""The bindings `herald profiles bind` stores (`profile_bindings`): every instance reads
them, beside the config's. A key left out is stored as "" and matches anything."""

from __future__ import annotations

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.contracts.messages import utcnow
from gateway.profiles import Binding
from gateway.store import Store
from gateway.store.sql import insert_or_skip
from gateway.store.tables import profile_bindings

_KEYS = ("platform", "account", "chat", "thread")


def _where(rule: Binding) -> dict[str, str]:
    return {k: v or "" for k, v in zip(_KEYS, rule.where, strict=True)}


class StoredBindings:
    """The `profile_bindings` table."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def list(self) -> list[Binding]:
        """Every stored binding, oldest first (source `cli`)."""

        async def work(conn: AsyncConnection) -> list[Binding]:
            rows = (
                await conn.execute(select(profile_bindings).order_by(profile_bindings.c.id))
            ).mappings()
            return [
                Binding(
                    str(r["profile"]),
                    r["platform"] or None,
                    r["account"] or None,
                    r["chat"] or None,
                    r["thread"] or None,
                    source="cli",
                )
                for r in rows
            ]

        return await self.store.unit(work, write=False)

    async def bind(self, rule: Binding) -> bool:
        """Store `rule` (replacing the profile of a stored binding of the same chats);
        whether it is new."""
        where = _where(rule)

        async def work(conn: AsyncConnection) -> bool:
            values = {**where, "profile": rule.profile, "created_at": utcnow()}
            if await insert_or_skip(conn, profile_bindings, values):
                return True
            await conn.execute(
                update(profile_bindings)
                .where(*(profile_bindings.c[k] == v for k, v in where.items()))
                .values(profile=rule.profile)
            )
            return False

        return await self.store.unit(work)

    async def unbind(self, rule: Binding) -> bool:
        """Delete the stored binding of exactly these chats; whether there was one."""
        where = _where(rule)

        async def work(conn: AsyncConnection) -> bool:
            result = await conn.execute(
                delete(profile_bindings).where(
                    *(profile_bindings.c[k] == v for k, v in where.items())
                )
            )
            return bool(result.rowcount)

        return await self.store.unit(work)
