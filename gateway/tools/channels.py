"""`send_message` through the outbox: the gateway's `ChannelSender`."""

from __future__ import annotations

import secrets
from collections.abc import Callable

from agent_core.tools.base import ToolContext
from gateway.channels import Channels
from gateway.chunking import split_chunks
from gateway.store import Store
from gateway.store.outbox import Chunk, enqueue
from gateway.tools.places import Places, describe


class OutboxChannels:
    """Sends a tool's message to the chats `Places` allows, as outbox chunks (delivered,
    retried and rate-limited like every reply)."""

    def __init__(
        self,
        store: Store,
        places: Places,
        channels: Channels,
        on_outbox: Callable[[], None] = lambda: None,
    ) -> None:
        self.store = store
        self.places = places
        self.channels = channels
        self.on_outbox = on_outbox

    def targets(self) -> list[str]:
        """The targets the model may name."""
        return self.places.names()

    async def send(self, target: str, text: str, ctx: ToolContext) -> str:
        """Queue `text` for every chat `target` names; a confirmation. ToolError when the
        target is unknown or not allowed."""
        chats = await self.places.resolve(target, ctx)
        batch = secrets.token_hex(6)
        chunks: list[Chunk] = []
        for n, chat in enumerate(chats):
            limits = self.channels.limits(chat.platform, chat.account)
            pieces = split_chunks(text, limits.max_chunk, utf16=limits.count_utf16)
            chunks.extend(
                Chunk(
                    f"send:{batch}:{n}:{i}",
                    chat,
                    piece,
                    chunk_index=i,
                    session_id=None if ctx.session is None else ctx.session.id,
                )
                for i, piece in enumerate(pieces)
            )
        async with self.store.write() as conn:
            await enqueue(conn, chunks)
        self.on_outbox()
        return f"queued for delivery to {', '.join(describe(c) for c in chats)}"
