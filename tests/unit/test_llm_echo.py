"""The offline echo provider and provider selection."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from agent_core.config import LLMConfig
from agent_core.llm import Completion, EchoProvider, LLMProvider, OpenAIProvider, make_provider
from gateway.contracts.history import ChatMessage, Role

CONVERSATION = (
    ChatMessage(Role.SYSTEM, "You are Herald."),
    ChatMessage(Role.USER, "first question"),
    ChatMessage(Role.ASSISTANT, "first answer"),
    ChatMessage(Role.USER, "hello  there, world"),
)


async def test_echoes_the_last_user_message() -> None:
    result = await EchoProvider().complete(CONVERSATION)
    assert result == Completion(
        content="echo: hello  there, world",
        usage=result.usage,
        finish_reason="stop",
    )
    assert result.tool_calls == ()


async def test_streams_word_by_word_and_tokens_concatenate_to_content() -> None:
    tokens: list[str] = []

    async def on_token(token: str) -> None:
        tokens.append(token)

    result = await EchoProvider().complete(CONVERSATION, on_token=on_token)
    assert tokens == ["echo: ", "hello  ", "there, ", "world"]
    assert "".join(tokens) == result.content


async def test_never_calls_tools() -> None:
    tool = {"type": "function", "function": {"name": "clock", "parameters": {}}}
    result = await EchoProvider().complete(CONVERSATION, tools=[tool])
    assert result.tool_calls == ()
    assert result.finish_reason == "stop"


async def test_usage_is_estimated_as_characters_over_four() -> None:
    messages = (ChatMessage(Role.USER, "x" * 40),)
    result = await EchoProvider().complete(messages)
    assert result.usage is not None
    assert result.usage.prompt_tokens == 10
    assert result.usage.completion_tokens == 12  # "echo: " + 40 characters, rounded up


async def test_without_a_user_message_echoes_nothing() -> None:
    result = await EchoProvider().complete((ChatMessage(Role.SYSTEM, "system only"),))
    assert result.content == "echo: "


async def test_check_describes_the_offline_provider() -> None:
    provider = EchoProvider()
    assert await provider.check() == "offline echo provider (no LLM configured)"
    await provider.aclose()


async def test_make_provider_picks_echo_without_endpoint_or_key() -> None:
    provider: LLMProvider = make_provider(LLMConfig())
    assert isinstance(provider, EchoProvider)
    assert provider.name == "echo"
    await provider.aclose()


@pytest.mark.parametrize(
    "config",
    [
        LLMConfig(base_url="http://127.0.0.1:9/v1"),
        LLMConfig(api_key=SecretStr("sk-test"), base_url="http://127.0.0.1:9/v1"),
        LLMConfig(provider="openai", base_url="http://127.0.0.1:9/v1", model="local"),
    ],
)
async def test_make_provider_picks_openai_with_an_endpoint(config: LLMConfig) -> None:
    provider = make_provider(config)
    try:
        assert isinstance(provider, OpenAIProvider)
        assert provider.name == "openai"
        assert provider.model == config.model
    finally:
        await provider.aclose()


async def test_make_provider_honours_an_explicit_echo() -> None:
    provider = make_provider(LLMConfig(provider="echo", base_url="http://127.0.0.1:9/v1"))
    assert isinstance(provider, EchoProvider)
