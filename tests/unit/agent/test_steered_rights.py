"""The rights of a turn are decided again when steered words join it: tools called afterwards
see the narrowed context, and tools offered per person (MCP allowlists) are chosen again."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from agent_core.loop import Steered, TurnProgress, run_tool_loop
from agent_core.mcp.config import MCPServerConfig
from agent_core.mcp.tools import may_use
from agent_core.tools import ToolContext, ToolRegistry
from agent_core.tools.base import Tool
from gateway.contracts.history import ChatMessage, Role
from tests.unit.agent.fakes import ScriptedProvider, answer, call, use_tools

pytestmark = pytest.mark.timeout(10)

ANN = "telegram:1"
BOB = "telegram:2"


class Rights:
    """A tool that reports who it acts for."""

    name = "rights"
    description = "Who acts."

    def __init__(self) -> None:
        self.seen: list[ToolContext] = []

    @property
    def parameters(self) -> dict[str, Any]:
        """No arguments."""
        return {"type": "object", "properties": {}}

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> str:
        self.seen.append(ctx)
        return f"operator={ctx.operator}"


class AnnOnly:
    """A tool source like an MCP server with `users: [ANN]`."""

    def __init__(self, tool: Tool) -> None:
        self.tool = tool
        self.config = MCPServerConfig.model_validate({"command": "x", "users": [ANN]})

    async def tools_for(self, ctx: ToolContext) -> Sequence[Tool]:
        identities = frozenset({ctx.sender} if ctx.sender else ())
        return [self.tool] if may_use(self.config, ctx, identities) else []


class OnceSteer:
    """Bob's words, waiting at the first boundary."""

    def __init__(self, *waiting: Steered) -> None:
        self.waiting = list(waiting)

    async def take(self) -> list[Steered]:
        taken, self.waiting = self.waiting, []
        return taken


async def test_a_non_operators_steered_words_narrow_the_rest_of_the_turn() -> None:
    rights = Rights()
    secret = Rights()
    secret.name = "secret"
    base = ToolRegistry([rights], [AnnOnly(secret)])
    ctx = ToolContext(session=None, user_id=None, operator=True, sender=ANN, group=True)
    provider = ScriptedProvider(
        use_tools(call("c1", "rights"), call("c2", "secret")),
        use_tools(call("c3", "rights"), call("c4", "secret")),
        answer("done"),
    )
    progress = TurnProgress()
    await run_tool_loop(
        provider,
        (ChatMessage(Role.USER, "[Ann] go"),),
        await base.for_turn(ctx),
        ctx,
        progress,
        max_iterations=4,
        steer=OnceSteer(Steered("[Bob] use the secret tool", BOB, operator=False)),
        tools_for=base.for_turn,
    )
    first, second, last = provider.calls
    assert first.tool_names == ["rights", "secret"]
    assert last.tool_names == second.tool_names == ["rights"]  # Bob is not on the list
    assert [c.operator for c in rights.seen] == [True, False]
    assert rights.seen[1].others == frozenset({BOB})
    assert len(secret.seen) == 1  # the call made after Bob's words found no such tool
    assert progress.messages[-1].content == "done"
    steered = [m.content for m in progress.messages if m.role is Role.USER]
    assert steered == ["[Bob] use the secret tool"]


async def test_an_operators_own_steered_words_keep_the_turns_rights() -> None:
    rights = Rights()
    ctx = ToolContext(session=None, user_id=None, operator=True, sender=ANN)
    provider = ScriptedProvider(
        use_tools(call("c1", "rights")), use_tools(call("c2", "rights")), answer("done")
    )
    await run_tool_loop(
        provider,
        (ChatMessage(Role.USER, "go"),),
        ToolRegistry([rights]),
        ctx,
        TurnProgress(),
        max_iterations=4,
        steer=OnceSteer(Steered("and faster", ANN, operator=True)),
    )
    assert [c.operator for c in rights.seen] == [True, True]
    assert rights.seen[1].others == frozenset()
