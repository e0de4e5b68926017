"""Who acts in a tool context, as MCP allowlists name people (`platform:id`)."""

from __future__ import annotations

from agent_core.tools.base import ToolContext
from gateway.store import Store


class StorePeople:
    """The sender of the message being answered, and every identity linked to the
    session's user (for a scheduled run: the job's owner)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def identities(self, ctx: ToolContext) -> frozenset[str]:
        """`platform:id` of the person acting."""
        found: set[str] = set()
        if ctx.sender:
            found.add(ctx.sender)
        if ctx.user_id is not None:
            found.update(f"{p}:{i}" for p, i in await self.store.identities_of(ctx.user_id))
        return frozenset(found)
