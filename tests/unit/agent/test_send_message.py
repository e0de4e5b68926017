"""SendMessageTool with a fake ChannelSender."""

from __future__ import annotations

from typing import Any

import pytest

from agent_core.tools import ChannelSender, SendMessageTool, ToolContext, ToolError, ToolRegistry
from agent_core.tools.send_message import MAX_TEXT
from gateway.contracts.ids import UserId
from tests.unit.agent.fakes import FakeChannels, Sent, call

CTX = ToolContext(session=None, user_id=UserId("u_ada"))


def test_the_fake_is_a_channel_sender() -> None:
    sender: ChannelSender = FakeChannels()
    assert sender.targets() == ["home"]


async def test_sends_to_a_known_target() -> None:
    channels = FakeChannels(["home", "telegram:42"])

    result = await SendMessageTool(channels)({"target": " telegram:42 ", "text": "hi"}, CTX)

    assert result == "queued for telegram:42"
    assert channels.sent == [Sent("telegram:42", "hi", CTX)]


async def test_an_unknown_target_lists_the_known_ones() -> None:
    channels = FakeChannels(["home", "telegram:42"])

    with pytest.raises(ToolError) as raised:
        await SendMessageTool(channels)({"target": "slack:C1", "text": "hi"}, CTX)

    assert str(raised.value) == "unknown target 'slack:C1'; known targets: home, telegram:42"
    assert channels.sent == []


async def test_with_no_targets_every_target_is_unknown() -> None:
    channels = FakeChannels([])
    with pytest.raises(ToolError, match="known targets: none"):
        await SendMessageTool(channels)({"target": "home", "text": "hi"}, CTX)


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
async def test_an_empty_text_is_refused(text: str) -> None:
    channels = FakeChannels()
    with pytest.raises(ToolError, match="the text is empty"):
        await SendMessageTool(channels)({"target": "home", "text": text}, CTX)
    assert channels.sent == []


async def test_an_oversized_text_is_refused_and_the_largest_fits() -> None:
    channels = FakeChannels()
    tool = SendMessageTool(channels)

    with pytest.raises(ToolError, match=f"longer than {MAX_TEXT} characters"):
        await tool({"target": "home", "text": "x" * (MAX_TEXT + 1)}, CTX)
    assert channels.sent == []

    await tool({"target": "home", "text": "x" * MAX_TEXT}, CTX)
    assert len(channels.sent) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"text": "hi"}, "missing argument 'target'"),
        ({"target": "home"}, "missing argument 'text'"),
        ({"target": ["home"], "text": "hi"}, "'target' must be a string"),
        ({"target": "home", "text": 5}, "'text' must be a string"),
    ],
)
async def test_invalid_arguments_are_refused(args: dict[str, Any], message: str) -> None:
    channels = FakeChannels()
    with pytest.raises(ToolError, match=message):
        await SendMessageTool(channels)(args, CTX)
    assert channels.sent == []


async def test_a_refusal_of_the_sender_reaches_the_model() -> None:
    registry = ToolRegistry([SendMessageTool(FakeChannels(refuse="home is not set"))])

    result = await registry.call(call("c1", "send_message", {"target": "home", "text": "x"}), CTX)

    assert result == "error: home is not set"


def test_parameters_list_the_targets_known_now() -> None:
    channels = FakeChannels(["home"])
    tool = SendMessageTool(channels)

    assert tool.parameters["properties"]["target"]["description"] == "one of: home"
    channels.known.append("discord:7")
    assert tool.parameters["properties"]["target"]["description"] == "one of: home, discord:7"
    assert tool.parameters["required"] == ["target", "text"]
    [spec] = ToolRegistry([tool]).specs()
    assert spec["function"]["parameters"] == tool.parameters


def test_parameters_say_when_there_are_no_targets() -> None:
    tool = SendMessageTool(FakeChannels([]))
    assert tool.parameters["properties"]["target"]["description"] == "one of: (none)"
