"""The `session_search` tool: full-text search over the user's past conversations."""

from __future__ import annotations

from typing import Any

from agent_core.tools.base import ToolContext, ToolError
from gateway.contracts.history import ChatMessage, Role, TranscriptStore

MAX_LIMIT = 10
EXCERPT_CHARS = 300


class SessionSearchTool:
    """Searches only the sessions of the user the current session belongs to, answered by
    the current session's profile."""

    name = "session_search"
    description = (
        "Search earlier conversations with this person. With `query` (keywords), returns "
        "matching messages with a snippet and the surrounding turns. Without `query`, lists "
        "the most recent sessions."
    )
    schema: dict[str, Any] = {  # noqa: RUF012 - the schema is read-only data
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "keywords to look for"},
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
        },
    }

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments."""
        return self.schema

    def __init__(self, store: TranscriptStore) -> None:
        self.store = store

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> str:
        """Search results or the recent-session list, as text for the model."""
        limit = args.get("limit", 5)
        if not isinstance(limit, int) or isinstance(limit, bool):
            raise ToolError("limit must be an integer")
        limit = max(1, min(MAX_LIMIT, limit))
        if ctx.user_id is None:
            # Without a known person, "all users" is never the right scope: that would leak.
            return "Past conversations are searchable only in a session of a known person."
        if ctx.session is not None and ctx.session.group:
            # One person's own session in a group: the others there read the answer.
            return (
                "Past conversations are not searched in a group chat: what a person said "
                "elsewhere is not for the others here. Ask them in a direct chat."
            )
        # Only what this profile was told: the privacy rules hold between profiles too.
        profile = None if ctx.session is None else ctx.session.profile
        query = args.get("query")
        if query is not None and not isinstance(query, str):
            raise ToolError("query must be a string")
        if not query or not query.strip():
            sessions = await self.store.recent_sessions(
                user_id=ctx.user_id, limit=limit, profile=profile
            )
            if not sessions:
                return "No earlier sessions."
            return "\n".join(
                f"- {s.key} (last active {s.updated_at:%Y-%m-%d %H:%M} UTC, "
                f"{s.message_count} messages)"
                for s in sessions
            )
        hits = await self.store.search_messages(
            query, user_id=ctx.user_id, limit=limit, profile=profile
        )
        if not hits:
            return f"No messages match {query!r}."
        blocks = []
        for hit in hits:
            around = await self.store.messages_around(hit.message_id, before=2, after=2)
            lines = [
                f"## {hit.session_key} at {hit.created_at:%Y-%m-%d %H:%M} UTC",
                f"match ({hit.role}): {hit.snippet}",
                *(_line(m) for m in around if m.role in (Role.USER, Role.ASSISTANT)),
            ]
            blocks.append("\n".join(lines))
        return "\n\n".join(blocks)


def _line(message: ChatMessage) -> str:
    text = " ".join(message.content.split())
    if len(text) > EXCERPT_CHARS:
        text = text[:EXCERPT_CHARS] + "…"
    return f"{message.role}: {text}"
