"""The scripted provider itself: it must be trustworthy for the other tests to mean anything."""

from __future__ import annotations

import asyncio

import pytest

from agent_core.llm import LLMProvider
from gateway.contracts.errors import LLMUnavailable
from tests.unit.agent.fakes import ScriptedProvider, Stall, Tokens, answer, pieces
from tests.unit.agent.transcripts import user


async def test_replies_in_order_and_records_every_call() -> None:
    tool = {"type": "function", "function": {"name": "clock", "parameters": {}}}
    provider = ScriptedProvider(answer("one"), answer("two"))

    first = await provider.complete([user("a")], tools=[tool])
    second = await provider.complete([user("b")])

    assert (first.content, second.content) == ("one", "two")
    assert [c.messages for c in provider.calls] == [(user("a"),), (user("b"),)]
    assert provider.calls[0].tool_names == ["clock"]
    assert provider.calls[1].tools == ()
    assert provider.pending == 0


async def test_streams_content_in_pieces() -> None:
    provider = ScriptedProvider(answer("abcdefghij"), piece_chars=4)
    tokens = Tokens()

    await provider.complete([user("x")], on_token=tokens)

    assert tokens.received == ["abcd", "efgh", "ij"]
    assert provider.calls[0].streamed
    assert pieces("", 3) == []


async def test_raises_scripted_errors_and_refuses_unscripted_calls() -> None:
    provider = ScriptedProvider(LLMUnavailable("down"))

    with pytest.raises(LLMUnavailable):
        await provider.complete([user("x")])
    with pytest.raises(AssertionError, match="script is done"):
        await provider.complete([user("y")])
    assert len(provider.calls) == 2


async def test_a_stall_streams_then_waits_until_released() -> None:
    stall = Stall(tokens=("par", "tial"), then=answer("done"))
    provider = ScriptedProvider(stall)
    tokens = Tokens()
    task = asyncio.create_task(provider.complete([user("x")], on_token=tokens))

    await stall.reached.wait()
    assert tokens.text == "partial"
    assert not task.done()
    stall.release.set()

    assert (await task).content == "done"


async def test_protocol_methods() -> None:
    provider: LLMProvider = ScriptedProvider()
    assert await provider.check() == "scripted provider"
    await provider.aclose()
    assert isinstance(provider, ScriptedProvider)
    assert provider.closed
