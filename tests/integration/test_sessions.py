"""The session manager with the real store and agent: lanes, the global cap, drain."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from agent_core.agent import Agent, AgentSettings
from agent_core.llm import Completion, TokenCallback, Usage
from agent_core.memory import MemoryFiles
from agent_core.tools import ToolRegistry
from gateway.config import SessionsConfig
from gateway.contracts.errors import ShuttingDown
from gateway.contracts.history import ChatMessage, Role
from gateway.contracts.ids import SessionKey
from gateway.metrics import Metrics
from gateway.sessions import Finished, SessionManager, TurnRequest
from gateway.store import Store

pytestmark = pytest.mark.timeout(60)


class GatedProvider:
    """A provider whose calls wait until the test opens their gate, one gate per session text."""

    name = "gated"
    model = "gated"

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Event] = {}
        self.started: list[str] = []
        self.running = 0
        self.peak = 0
        self.changed = asyncio.Condition()

    def gate(self, text: str) -> asyncio.Event:
        """The gate of the call answering `text`."""
        return self.gates.setdefault(text, asyncio.Event())

    async def wait_started(self, n: int) -> None:
        """Wait until `n` calls have started."""
        async with self.changed:
            await self.changed.wait_for(lambda: len(self.started) >= n)

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[Mapping[str, Any]] = (),
        on_token: TokenCallback | None = None,
    ) -> Completion:
        text = messages[-1].content
        async with self.changed:
            self.started.append(text)
            self.running += 1
            self.peak = max(self.peak, self.running)
            self.changed.notify_all()
        try:
            if on_token is not None:
                await on_token("partial ")
            await self.gate(text).wait()
        finally:
            self.running -= 1
        return Completion(f"answer to {text}", usage=Usage(10, 2))

    async def check(self) -> str:
        return "gated"

    async def aclose(self) -> None:
        return None


async def _no_snapshot(*_: object) -> tuple[str, str]:
    return "", ""


@pytest.fixture
async def provider() -> GatedProvider:
    return GatedProvider()


@pytest.fixture
async def manager(
    store: Store, provider: GatedProvider, tmp_path: Path
) -> AsyncIterator[SessionManager]:
    agent = Agent(
        provider,
        store,
        MemoryFiles(tmp_path),
        ToolRegistry(),
        AgentSettings(memory_pass=False),
    )
    config = SessionsConfig(max_concurrent_turns=2, drain_timeout=0.2)
    async with SessionManager(store, agent, config, Metrics(), _no_snapshot) as m:
        yield m


def request(session: str, text: str) -> TurnRequest:
    return TurnRequest(SessionKey(f"test:acct:{session}"), "test", text)


async def test_one_session_runs_its_turns_in_order(
    manager: SessionManager, provider: GatedProvider, store: Store
) -> None:
    streams = [manager.submit(request("a", f"m{i}")) for i in range(3)]
    await provider.wait_started(1)
    assert provider.started == ["m0"]  # the others wait for the lane
    for i in range(3):
        provider.gate(f"m{i}").set()
        done = await streams[i].result()
        assert done.text == f"answer to m{i}"
    session = await store.get_session("test:acct:a")
    assert session is not None
    assert [m.content for m in await store.transcript(session.id)] == [
        "m0",
        "answer to m0",
        "m1",
        "answer to m1",
        "m2",
        "answer to m2",
    ]
    assert provider.peak == 1
    assert manager.lanes == 0


async def test_sessions_run_concurrently_up_to_the_cap(
    manager: SessionManager, provider: GatedProvider
) -> None:
    streams = [manager.submit(request(s, s)) for s in ("a", "b", "c")]
    await provider.wait_started(2)
    assert sorted(provider.started) in (["a", "b"], ["a", "c"], ["b", "c"])
    for text in list(provider.started):
        provider.gate(text).set()
    await provider.wait_started(3)
    for text in ("a", "b", "c"):
        provider.gate(text).set()
    results = [await s.result() for s in streams]
    assert [r.status for r in results] == ["completed"] * 3
    assert provider.peak == 2


async def test_a_blocked_session_does_not_hold_a_slot_for_its_queue(
    manager: SessionManager, provider: GatedProvider
) -> None:
    manager.submit(request("slow", "s0"))
    for i in range(1, 5):
        manager.submit(request("slow", f"s{i}"))
    other = manager.submit(request("fast", "f"))
    await provider.wait_started(2)
    provider.gate("f").set()
    assert (await other.result()).text == "answer to f"
    for i in range(5):
        provider.gate(f"s{i}").set()


async def test_drain_checkpoints_a_running_turn_and_refuses_new_ones(
    manager: SessionManager, provider: GatedProvider, store: Store
) -> None:
    stream = manager.submit(request("d", "long"))
    await provider.wait_started(1)
    await manager.drain(0.05)
    done = await stream.result()
    assert isinstance(done, Finished)
    assert done.status == "interrupted"
    with pytest.raises(ShuttingDown):
        manager.submit(request("d", "late"))
    session = await store.get_session("test:acct:d")
    assert session is not None
    transcript = await store.transcript(session.id)
    assert [(m.role, m.content, m.interrupted) for m in transcript] == [
        (Role.USER, "long", False),
        (Role.ASSISTANT, "partial ", True),
    ]
    assert done.turn_id is not None
    assert await store.turn_status(done.turn_id) == "interrupted"


async def test_a_request_for_the_whole_answer_is_not_streamed_from_the_model(
    manager: SessionManager, provider: GatedProvider, store: Store
) -> None:
    whole = TurnRequest(SessionKey("test:acct:w"), "test", "long", stream=False)
    stream = manager.submit(whole)
    await provider.wait_started(1)
    await manager.drain(0.05)
    done = await stream.result()
    assert done.status == "interrupted"
    # The model's answer was never streamed, so no part of it was there to keep; and a turn
    # cut off before producing anything keeps no question either (the client is told to
    # retry, and its retry asks once).
    session = await store.get_session("test:acct:w")
    assert session is not None
    assert await store.transcript(session.id) == []
    assert done.turn_id is not None
    assert await store.turn_status(done.turn_id) == "interrupted"
