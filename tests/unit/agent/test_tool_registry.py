"""ToolRegistry: dispatch of the model's tool calls, error texts, and the OpenAI specs."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from agent_core.tools import ToolContext, ToolError, ToolRegistry
from agent_core.tools.base import str_arg
from gateway.contracts.ids import UserId
from tests.unit.agent.fakes import EchoTool, RaisingTool, call

CTX = ToolContext(session=None, user_id=UserId("u_ada"))


async def test_a_call_runs_the_named_tool_with_decoded_arguments() -> None:
    echo = EchoTool()
    registry = ToolRegistry([echo, EchoTool("other")])

    result = await registry.call(call("c1", "echo", {"b": 2, "a": "x"}), CTX)

    assert result == '{"a": "x", "b": 2}'
    assert echo.calls == [({"a": "x", "b": 2}, CTX)]


async def test_empty_arguments_mean_an_empty_object() -> None:
    echo = EchoTool()
    assert await ToolRegistry([echo]).call(call("c1", "echo", ""), CTX) == "{}"
    assert echo.calls == [({}, CTX)]


async def test_an_unknown_tool_is_reported_to_the_model() -> None:
    registry = ToolRegistry([EchoTool()])
    result = await registry.call(call("c1", "rm_rf", {}), CTX)
    assert result == "error: there is no tool named 'rm_rf'"


@pytest.mark.parametrize("arguments", ['{"a": ', "not json", "{'a': 1}"])
async def test_invalid_json_arguments_are_reported(arguments: str) -> None:
    echo = EchoTool()
    result = await ToolRegistry([echo]).call(call("c1", "echo", arguments), CTX)

    assert result.startswith("error: the arguments are not valid JSON (")
    assert result.endswith("); send a JSON object")
    assert echo.calls == []


@pytest.mark.parametrize("arguments", ["[1, 2]", '"text"', "3", "null", "true"])
async def test_arguments_that_are_not_an_object_are_reported(arguments: str) -> None:
    echo = EchoTool()
    result = await ToolRegistry([echo]).call(call("c1", "echo", arguments), CTX)

    assert result == "error: the arguments must be a JSON object"
    assert echo.calls == []


async def test_a_tool_error_is_shown_to_the_model() -> None:
    registry = ToolRegistry([RaisingTool(ToolError("the file is full; remove an entry"))])
    result = await registry.call(call("c1", "broken"), CTX)
    assert result == "error: the file is full; remove an entry"


async def test_an_unexpected_exception_gives_a_generic_error_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = ToolRegistry([RaisingTool(RuntimeError("password=hunter2 in the DSN"))])

    with caplog.at_level(logging.ERROR, logger="agent_core.tools.base"):
        result = await registry.call(call("c1", "broken"), CTX)

    assert result == "error: the broken tool failed unexpectedly"
    assert "hunter2" not in result
    [record] = caplog.records
    assert record.getMessage() == "tool broken failed"
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], RuntimeError)


async def test_an_internal_value_error_of_a_tool_is_logged_not_shown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = ToolRegistry([RaisingTool(ValueError("invalid literal for int(): 'x' at row 7"))])

    with caplog.at_level(logging.ERROR, logger="agent_core.tools.base"):
        result = await registry.call(call("c1", "broken"), CTX)

    assert result == "error: the broken tool failed unexpectedly"
    assert len(caplog.records) == 1


async def test_deeply_nested_arguments_are_reported_not_raised() -> None:
    registry = ToolRegistry([EchoTool()])
    result = await registry.call(call("c1", "echo", "[" * 100_000), CTX)
    assert result.startswith("error: ")


async def test_cancellation_of_a_tool_propagates() -> None:
    registry = ToolRegistry([RaisingTool(asyncio.CancelledError())])
    with pytest.raises(asyncio.CancelledError):
        await registry.call(call("c1", "broken"), CTX)


def test_specs_are_openai_function_tools_in_registration_order() -> None:
    echo = EchoTool()
    registry = ToolRegistry([echo, RaisingTool(ToolError("x"))])

    assert registry.specs() == [
        {
            "type": "function",
            "function": {
                "name": "echo",
                "description": "Echo the arguments back.",
                "parameters": {"type": "object", "properties": {}},
            },
        },
        {
            "type": "function",
            "function": {
                "name": "broken",
                "description": "Always fails.",
                "parameters": {"type": "object", "properties": {}},
            },
        },
    ]


def test_an_empty_registry_has_no_specs() -> None:
    assert ToolRegistry().specs() == []


def test_only_keeps_the_named_tools() -> None:
    registry = ToolRegistry([EchoTool("a"), EchoTool("b"), EchoTool("c")])

    narrowed = registry.only("c", "a", "missing")

    assert [s["function"]["name"] for s in narrowed.specs()] == ["a", "c"]
    assert "b" not in narrowed
    assert "b" in registry
    assert 42 not in registry


def test_str_arg_reads_required_and_optional_strings() -> None:
    args: dict[str, Any] = {"a": "x", "n": 3}
    assert str_arg(args, "a") == "x"
    assert str_arg(args, "missing", required=False, default="d") == "d"
    with pytest.raises(ToolError, match="missing argument 'missing'"):
        str_arg(args, "missing")
    with pytest.raises(ToolError, match="argument 'n' must be a string"):
        str_arg(args, "n")


class _Source:
    """A tool source offering `tools`, or failing."""

    def __init__(self, tools: list[EchoTool], *, fail: bool = False) -> None:
        self.tools = tools
        self.fail = fail

    async def tools_for(self, ctx: ToolContext) -> list[EchoTool]:
        if self.fail:
            raise RuntimeError("the database is away")
        return self.tools


async def test_a_turn_gets_the_sources_tools_and_a_failing_source_adds_none() -> None:
    registry = ToolRegistry(
        [EchoTool("echo")],
        [_Source([EchoTool("echo"), EchoTool("extra")]), _Source([], fail=True)],
    )

    turn = await registry.for_turn(CTX)

    assert [s["function"]["name"] for s in turn.specs()] == ["echo", "extra"]
    assert "extra" not in registry
    assert await ToolRegistry([EchoTool()]).for_turn(CTX) is not None
