"""The `memory` tool: add, replace or remove entries of USER.md or MEMORY.md."""

from __future__ import annotations

import logging
from typing import Any

from agent_core.memory import MemoryEditError, MemoryFiles, MemoryScope
from agent_core.tools.base import ToolContext, ToolError, str_arg

logger = logging.getLogger(__name__)


class MemoryTool:
    """Edits the memory files of the session's scope (its person, or its group chat).
    Changes show in the next session."""

    name = "memory"
    description = (
        "Save durable facts. target 'user' is USER.md (who the person is, their preferences); "
        "target 'memory' is MEMORY.md (your notes on ongoing work). action 'add' appends "
        "`content`; 'replace' swaps the entry containing `old_text` for `content`; 'remove' "
        "deletes the entry containing `old_text`. Files are size-capped."
    )
    schema: dict[str, Any] = {  # noqa: RUF012 - the schema is read-only data
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["add", "replace", "remove"]},
            "target": {"type": "string", "enum": ["user", "memory"]},
            "content": {"type": "string", "description": "the new entry (add, replace)"},
            "old_text": {"type": "string", "description": "part of the entry to change"},
        },
        "required": ["action", "target"],
    }

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments."""
        return self.schema

    def __init__(self, files: MemoryFiles) -> None:
        self.files = files

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> str:
        """Apply one edit; ToolError when it is refused (full, not found, ambiguous)."""
        action = str_arg(args, "action")
        try:
            scope = MemoryScope(str_arg(args, "target"))
        except ValueError as err:
            raise ToolError("target must be 'user' or 'memory'") from err
        # Only the scope of the session the call runs in: its person's, or its group's (a
        # person's own session in a group too). A group's edits are never mirrored.
        group = ctx.session is not None and ctx.session.group
        key = None if ctx.session is None else ctx.session.key
        owner = self.files.owner(key, None if group else ctx.user_id)
        mirror = not group
        try:
            if action == "add":
                return await self.files.add(scope, owner, str_arg(args, "content"), mirror=mirror)
            if action == "replace":
                return await self.files.replace(
                    scope,
                    owner,
                    str_arg(args, "old_text"),
                    str_arg(args, "content"),
                    mirror=mirror,
                )
            if action == "remove":
                return await self.files.remove(
                    scope, owner, str_arg(args, "old_text"), mirror=mirror
                )
        except MemoryEditError as err:
            raise ToolError(str(err)) from err
        except ToolError:
            raise
        except Exception as err:  # where memory is kept failed: nothing was saved
            logger.warning("memory edit failed: %s", err)
            raise ToolError(
                "memory could not be saved just now (its storage did not answer); nothing "
                "was changed: try again later, or tell the person it was not saved"
            ) from err
        raise ToolError("action must be 'add', 'replace' or 'remove'")
