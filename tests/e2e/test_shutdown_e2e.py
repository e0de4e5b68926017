"""SIGTERM while a reply streams: the process drains, exits 0 and leaves a consistent history."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import openai
import pytest
from openai import AsyncStream
from openai.types.chat import ChatCompletionChunk

from gateway.contracts.history import Role
from gateway.store import Store
from tests.e2e.daemon import running
from tests.e2e.test_api_e2e import client, settings
from tests.fakes.llm import FakeLLM, Reply

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


async def read_stream(
    stream: AsyncStream[ChatCompletionChunk], pieces: list[str], on_first: Callable[[], None]
) -> None:
    """Collect streamed content into `pieces`, calling `on_first` when the reply starts."""
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if not pieces:
                on_first()
            pieces.append(chunk.choices[0].delta.content)


async def test_sigterm_mid_stream_lets_the_turn_finish(tmp_path: Path) -> None:
    async with FakeLLM() as llm:
        words = "one two three four five six"
        llm.script(Reply(text=words, chunks=6, chunk_delay=0.2), Reply(text="nothing to save"))
        config = settings(llm)
        config["sessions"] = {"drain_timeout": 20}
        async with running(tmp_path / "s", **config) as daemon:
            async with client(daemon, "drain") as sdk:
                stream = await sdk.chat.completions.create(
                    model="herald", messages=[{"role": "user", "content": "count"}], stream=True
                )
                pieces: list[str] = []
                await read_stream(stream, pieces, daemon.signal)
            assert "".join(pieces) == words
            assert await daemon.wait() == 0
    async with Store.open(daemon.database_url) as store:
        session = await store.get_session("api:default:drain")
        assert session is not None
        transcript = await store.transcript(session.id)
        assert [(m.role, m.content, m.interrupted) for m in transcript] == [
            (Role.USER, "count", False),
            (Role.ASSISTANT, words, False),
        ]


async def test_sigterm_past_the_drain_timeout_checkpoints_the_turn(tmp_path: Path) -> None:
    async with FakeLLM() as llm:
        llm.script(Reply(text="alpha beta gamma delta epsilon", chunks=5, chunk_delay=3.0))
        config = settings(llm)
        config["sessions"] = {"drain_timeout": 1}
        async with running(tmp_path / "s", **config) as daemon:
            async with client(daemon, "cut") as sdk:
                stream = await sdk.chat.completions.create(
                    model="herald", messages=[{"role": "user", "content": "go"}], stream=True
                )
                pieces: list[str] = []
                with pytest.raises(openai.APIError, match="interrupted"):
                    await read_stream(stream, pieces, daemon.signal)
            assert pieces[0].strip() == "alpha"
            assert await daemon.wait() == 0
        assert "cancelling 1 turn(s) after the drain timeout" in daemon.output()
    async with Store.open(daemon.database_url) as store:
        session = await store.get_session("api:default:cut")
        assert session is not None
        transcript = await store.transcript(session.id)
        assert [(m.role, m.interrupted) for m in transcript] == [
            (Role.USER, False),
            (Role.ASSISTANT, True),
        ]
        assert transcript[1].content.startswith("alpha")
        assert transcript[1].content != "alpha beta gamma delta epsilon"
        assert await store.interrupt_running_turns() == 0  # no turn was left running
