"""The real OpenAIProvider (and the real openai SDK) against the fake OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from pydantic import SecretStr

from agent_core.config import LLMConfig
from agent_core.llm import OpenAIProvider, Usage
from gateway.contracts.errors import LLMRejected, LLMUnavailable
from gateway.contracts.history import ChatMessage, Role, ToolCall
from tests.fakes.llm import FakeLLM, Reply

CONVERSATION = (
    ChatMessage(Role.SYSTEM, "You are Herald."),
    ChatMessage(Role.USER, "What time is it?"),
)
CLOCK_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "clock",
        "description": "The current time in a time zone.",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
    },
}
FAST_RETRY = 0.05
"""Retry-After the fake sends so that the SDK's retries stay quick."""


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as fake:
        yield fake


def llm_config(base_url: str, **overrides: Any) -> LLMConfig:
    settings: dict[str, Any] = {
        "base_url": base_url,
        "api_key": SecretStr("sk-test"),
        "model": "fake-model",
        "connect_timeout": 5.0,
        "request_timeout": 10.0,
        "max_retries": 2,
    }
    settings.update(overrides)
    return LLMConfig(**settings)


@asynccontextmanager
async def openai_provider(base_url: str, **overrides: Any) -> AsyncIterator[OpenAIProvider]:
    provider = OpenAIProvider(llm_config(base_url, **overrides))
    try:
        yield provider
    finally:
        await provider.aclose()


class Tokens:
    """An `on_token` callback that records what it was given."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self.first = asyncio.Event()

    async def __call__(self, token: str) -> None:
        self.received.append(token)
        self.first.set()


async def test_non_streaming_text(llm: FakeLLM) -> None:
    llm.script(Reply(text="It is noon.", usage=(21, 4)))
    async with openai_provider(llm.base_url) as provider:
        result = await provider.complete(CONVERSATION)
    assert result.content == "It is noon."
    assert result.tool_calls == ()
    assert result.usage == Usage(prompt_tokens=21, completion_tokens=4)
    assert result.finish_reason == "stop"
    assert llm.requests[0].get("stream") in (None, False)


async def test_streaming_text_goes_to_on_token(llm: FakeLLM) -> None:
    llm.script(Reply(text="It is noon in Paris.", usage=(30, 6)))
    tokens = Tokens()
    async with openai_provider(llm.base_url) as provider:
        result = await provider.complete(CONVERSATION, on_token=tokens)
    assert tokens.received == ["It ", "is ", "noon ", "in ", "Paris."]
    assert "".join(tokens.received) == result.content == "It is noon in Paris."
    assert result.usage == Usage(prompt_tokens=30, completion_tokens=6)
    assert result.finish_reason == "stop"
    request = llm.requests[0]
    assert request["stream"] is True
    assert request["stream_options"] == {"include_usage": True}


async def test_streaming_in_fixed_chunks(llm: FakeLLM) -> None:
    llm.script(Reply(text="abcdef", chunks=3))
    tokens = Tokens()
    async with openai_provider(llm.base_url) as provider:
        result = await provider.complete(CONVERSATION, on_token=tokens)
    assert tokens.received == ["ab", "cd", "ef"]
    assert result.content == "abcdef"
    assert result.usage is not None  # estimated by the fake, still taken from the stream


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_tool_calls_are_parsed(llm: FakeLLM, stream: bool) -> None:
    llm.script(
        Reply(
            text="Let me look." if stream else "",
            tool_calls=[("clock", {"tz": "Europe/Paris"}), ("clock", {"tz": "UTC"})],
        )
    )
    tokens = Tokens()
    async with openai_provider(llm.base_url) as provider:
        result = await provider.complete(
            CONVERSATION, tools=[CLOCK_TOOL], on_token=tokens if stream else None
        )
    assert result.tool_calls == (
        ToolCall(id="call_1", name="clock", arguments=json.dumps({"tz": "Europe/Paris"})),
        ToolCall(id="call_2", name="clock", arguments=json.dumps({"tz": "UTC"})),
    )
    assert result.finish_reason == "tool_calls"
    assert result.content == "".join(tokens.received)
    assert json.loads(result.tool_calls[0].arguments) == {"tz": "Europe/Paris"}


async def test_request_carries_messages_and_tools_only_when_given(llm: FakeLLM) -> None:
    async with openai_provider(llm.base_url) as provider:
        await provider.complete(CONVERSATION)
        await provider.complete(CONVERSATION, tools=[CLOCK_TOOL])
    without_tools, with_tools = llm.requests
    assert without_tools["model"] == "fake-model"
    assert without_tools["messages"] == [
        {"role": "system", "content": "You are Herald."},
        {"role": "user", "content": "What time is it?"},
    ]
    assert "tools" not in without_tools
    assert "temperature" not in without_tools
    assert with_tools["tools"] == [CLOCK_TOOL]
    assert llm.headers[0]["authorization"] == "Bearer sk-test"


async def test_default_responder_and_temperature(llm: FakeLLM) -> None:
    async with openai_provider(llm.base_url, temperature=0.3) as provider:
        result = await provider.complete(CONVERSATION)
    assert result.content == "You said: What time is it?"
    assert llm.requests[0]["temperature"] == 0.3


async def test_assistant_tool_round_trip_is_sent_in_openai_shape(llm: FakeLLM) -> None:
    call = ToolCall(id="call_9", name="clock", arguments='{"tz": "UTC"}')
    messages = (
        *CONVERSATION,
        ChatMessage(Role.ASSISTANT, "", tool_calls=(call,)),
        ChatMessage(Role.TOOL, "12:00", tool_call_id="call_9"),
    )
    async with openai_provider(llm.base_url) as provider:
        await provider.complete(messages, tools=[CLOCK_TOOL])
    sent = llm.requests[0]["messages"]
    assert sent[2]["tool_calls"] == [call.to_openai()]
    assert sent[3] == {"role": "tool", "content": "12:00", "tool_call_id": "call_9"}


async def test_429_with_retry_after_is_retried_by_the_sdk(llm: FakeLLM) -> None:
    llm.script(Reply(status=429, retry_after=FAST_RETRY), Reply(text="ok"))
    async with openai_provider(llm.base_url) as provider:
        result = await provider.complete(CONVERSATION)
    assert result.content == "ok"
    assert len(llm.requests) == 2
    assert llm.headers[1]["x-stainless-retry-count"] == "1"


async def test_500_then_success(llm: FakeLLM) -> None:
    llm.script(Reply(status=500, retry_after=FAST_RETRY), Reply(text="recovered"))
    tokens = Tokens()
    async with openai_provider(llm.base_url) as provider:
        result = await provider.complete(CONVERSATION, on_token=tokens)
    assert result.content == "recovered"
    assert len(llm.requests) == 2


async def test_persistent_500_is_unavailable(llm: FakeLLM) -> None:
    llm.responder = lambda body: Reply(status=500, retry_after=FAST_RETRY)
    async with openai_provider(llm.base_url, max_retries=2) as provider:
        with pytest.raises(LLMUnavailable, match="retry later") as caught:
            await provider.complete(CONVERSATION)
    assert len(llm.requests) == 3  # the first try and max_retries retries
    assert "500" in str(caught.value)


async def test_persistent_429_says_when_to_retry(llm: FakeLLM) -> None:
    llm.responder = lambda body: Reply(status=429, retry_after=FAST_RETRY)
    async with openai_provider(llm.base_url, max_retries=1) as provider:
        with pytest.raises(LLMUnavailable, match=r"retry after 0\.05s"):
            await provider.complete(CONVERSATION)
    assert len(llm.requests) == 2


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_client_errors_are_rejected_without_retry(llm: FakeLLM, status: int) -> None:
    llm.script(Reply(status=status))
    async with openai_provider(llm.base_url) as provider:
        with pytest.raises(LLMRejected, match="check the llm configuration") as caught:
            await provider.complete(CONVERSATION)
    assert str(status) in str(caught.value)
    assert len(llm.requests) == 1


async def test_401_names_the_key(llm: FakeLLM) -> None:
    llm.script(Reply(status=401))
    async with openai_provider(llm.base_url) as provider:
        with pytest.raises(LLMRejected, match="API key was refused"):
            await provider.complete(CONVERSATION, on_token=Tokens())


async def test_hanging_endpoint_times_out_as_unavailable(llm: FakeLLM) -> None:
    llm.script(Reply(hang=True))
    async with openai_provider(llm.base_url, request_timeout=0.2, max_retries=0) as provider:
        with pytest.raises(LLMUnavailable, match="timed out"):
            await provider.complete(CONVERSATION)
    assert len(llm.requests) == 1


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A base URL whose port is bound but not listening, so connections are refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


async def test_unreachable_endpoint_is_unavailable(refused_url: str) -> None:
    async with openai_provider(refused_url, max_retries=0) as provider:
        with pytest.raises(LLMUnavailable, match="cannot reach"):
            await provider.complete(CONVERSATION)
        with pytest.raises(LLMUnavailable, match="cannot reach"):
            await provider.check()


async def test_cancelling_mid_stream_propagates_and_the_server_survives(llm: FakeLLM) -> None:
    llm.script(Reply(text="one two three four", chunk_delay=30))
    tokens = Tokens()
    async with openai_provider(llm.base_url) as provider:
        turn = asyncio.create_task(provider.complete(CONVERSATION, on_token=tokens))
        await asyncio.wait_for(tokens.first.wait(), timeout=10)
        turn.cancel()
        with pytest.raises(asyncio.CancelledError):
            await turn
        assert tokens.received == ["one "]
        result = await provider.complete(CONVERSATION, on_token=Tokens())
    assert result.content == "You said: What time is it?"


async def test_wait_for_requests_sees_concurrent_calls(llm: FakeLLM) -> None:
    llm.script(Reply(text="slow", delay=30), Reply(text="fast"))
    async with openai_provider(llm.base_url) as provider:
        slow = asyncio.create_task(provider.complete(CONVERSATION))
        assert len(await llm.wait_for_requests(1)) == 1
        fast = asyncio.create_task(provider.complete(CONVERSATION))
        assert len(await llm.wait_for_requests(2)) == 2
        assert (await fast).content == "fast"
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow


async def test_check_lists_models(llm: FakeLLM) -> None:
    async with openai_provider(llm.base_url) as provider:
        description = await provider.check()
    assert llm.model_listings == 1
    assert llm.base_url in description
    assert "'fake-model' listed" in description


async def test_check_notices_a_missing_model(llm: FakeLLM) -> None:
    async with openai_provider(llm.base_url, model="gpt-unknown") as provider:
        assert "'gpt-unknown' not listed" in await provider.check()


async def test_each_model_call_is_logged_at_debug_only(
    llm: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="agent_core.llm")
    llm.script(Reply(text="It is noon."), Reply(text="Still noon."))
    async with openai_provider(llm.base_url) as provider:
        await provider.complete(CONVERSATION)
        await provider.complete(CONVERSATION, tools=[CLOCK_TOOL], on_token=Tokens())

    records = [r for r in caplog.records if r.name == "agent_core.llm"]
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (logging.DEBUG, "model call: fake-model, 2 messages, 0 tools"),
        (logging.DEBUG, "model call: fake-model, 2 messages, 1 tools, streamed"),
    ]
