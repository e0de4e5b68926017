"""The tool protocol and the registry that runs tool calls for the loop."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from gateway.contracts.history import SessionInfo, ToolCall
from gateway.contracts.ids import UserId

if TYPE_CHECKING:
    from agent_core.media.turn import TurnMedia

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
    sender: str | None = None
    """`platform:id` of the person whose message the turn answers (None: a job, the API)."""
    turn_id: int | None = None
    """The turn the call belongs to (approvals are recorded with it)."""
    media: TurnMedia | None = None
    """The turn's pictures to show and files to send (chat turns only)."""
    others: frozenset[str] = field(default_factory=frozenset)
    """`platform:id` of everyone else whose words are in the turn (collected or steered
    messages of other people): the turn has no right that one of them lacks."""
    group: bool = False
    """Whether the turn answers a chat several people share (a group or channel): there,
    what a person made is changed only by its maker or an operator."""
    allowed: frozenset[str] | None = None
    """The only tools the turn may use (a trigger's run: what its definition allows);
    None: every tool its person may use."""

    def joined_by(self, sender: str | None, *, operator: bool) -> ToolContext:
        """This context once `sender`'s words joined the turn (a steered message): operator
        rights stay only when they operate Herald too, and they count among `others`."""
        others = self.others
        if sender is not None and sender != self.sender:
            others = others | {sender}
        return replace(self, operator=self.operator and operator, others=others)


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


class ToolSource(Protocol):
    """Tools that change at run time or depend on who asks (MCP servers' tools)."""

    async def tools_for(self, ctx: ToolContext) -> Sequence[Tool]:
        """The tools the person acting in `ctx` may use now; a forbidden tool is left out."""
        ...


class ToolRegistry:
    """The tools of one agent, by name, plus sources whose tools are chosen per turn.

    Every result passes `redact` before the loop sees it: what a tool returns (an error
    quoting a configured token, say) is stored, shown and synced only without the secrets.
    """

    def __init__(
        self,
        tools: Iterable[Tool] = (),
        sources: Iterable[ToolSource] = (),
        *,
        redact: Callable[[str], str] = lambda text: text,
    ) -> None:
        self._tools = {t.name: t for t in tools}
        self._sources = tuple(sources)
        self.redact = redact

    async def for_turn(self, ctx: ToolContext) -> ToolRegistry:
        """The registry of one turn: the fixed tools and those the sources allow for `ctx`
        (a built-in tool's name wins over a source's). A source that fails adds nothing (the
        turn goes on without its tools). With `ctx.allowed`, only the tools named there."""
        if not self._sources and ctx.allowed is None:
            return self
        tools = dict(self._tools)
        for source in self._sources:
            try:
                offered = await source.tools_for(ctx)
            except Exception:
                logger.exception("a tool source failed; this turn goes on without its tools")
                continue
            for tool in offered:
                tools.setdefault(tool.name, tool)
        if ctx.allowed is not None:
            tools = {n: t for n, t in tools.items() if n in ctx.allowed}
        return ToolRegistry(tools.values(), redact=self.redact)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def only(self, *names: str) -> ToolRegistry:
        """A registry with just the named tools."""
        return ToolRegistry((t for n, t in self._tools.items() if n in names), redact=self.redact)

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
        """Run one call and return its result text, redacted. Never raises, except on
        cancellation."""
        return self.redact(await self._call(call, ctx))

    async def _call(self, call: ToolCall, ctx: ToolContext) -> str:
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
