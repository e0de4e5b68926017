"""The tool protocol and the registry that runs tool calls for the loop."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.contracts.history import SessionInfo, ToolCall
from gateway.contracts.ids import UserId

logger = logging.getLogger(__name__)


class ToolError(Exception):
    """A tool refused or failed; the message is shown to the model so it can adjust."""


@dataclass(frozen=True, slots=True)
class ToolContext:
    """Who a tool call acts for."""

    session: SessionInfo | None
    user_id: UserId | None
    operator: bool = False
    """Whether the person acting operates Herald (may reach chats other than this one)."""


class Tool(Protocol):
    """A function the model may call. `parameters` is a JSON schema of the arguments."""

    name: str
    description: str

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments."""
        ...

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> str:
        """Run the tool; return text for the model. Raise ToolError to report a refusal."""
        ...


class ToolRegistry:
    """The tools of one agent, by name."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools = {t.name: t for t in tools}

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def only(self, *names: str) -> ToolRegistry:
        """A registry with just the named tools."""
        return ToolRegistry(t for n, t in self._tools.items() if n in names)

    def specs(self) -> list[dict[str, Any]]:
        """The tools in the OpenAI `tools` request shape."""
        return [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                },
            }
            for t in self._tools.values()
        ]

    async def call(self, call: ToolCall, ctx: ToolContext) -> str:
        """Run one call and return its result text. Never raises, except on cancellation."""
        tool = self._tools.get(call.name)
        if tool is None:
            return f"error: there is no tool named {call.name!r}"
        try:
            args = json.loads(call.arguments or "{}")
        except json.JSONDecodeError as err:
            return f"error: the arguments are not valid JSON ({err.msg}); send a JSON object"
        except RecursionError:
            return "error: the arguments are nested too deeply; send a flat JSON object"
        if not isinstance(args, dict):
            return "error: the arguments must be a JSON object"
        try:
            return await tool(args, ctx)
        except ToolError as err:
            return f"error: {err}"
        except Exception:
            logger.exception("tool %s failed", call.name)
            return f"error: the {call.name} tool failed unexpectedly"


def str_arg(args: dict[str, Any], name: str, *, required: bool = True, default: str = "") -> str:
    """A string argument, or ToolError naming it."""
    value = args.get(name)
    if value is None:
        if required:
            raise ToolError(f"missing argument {name!r}")
        return default
    if not isinstance(value, str):
        raise ToolError(f"argument {name!r} must be a string")
    return value
