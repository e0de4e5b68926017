"""Admission control: past `sessions.max_waiting_turns` waiting API turns, refuse at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from agent_core.agent import Agent, AgentSettings
from agent_core.memory import MemoryFiles
from agent_core.tools import ToolRegistry
from gateway.config import HeraldConfig, SessionsConfig
from gateway.contracts.errors import Overloaded
from gateway.contracts.ids import SessionKey
from gateway.http.app import create_app
from gateway.http.deps import AppDeps
from gateway.metrics import Metrics
from gateway.sessions import SessionManager, TurnRequest
from gateway.store import Store
from tests.integration.test_sessions import GatedProvider

pytestmark = pytest.mark.timeout(60)
KEY = "admission-key"


async def _no_snapshot(*_: object) -> tuple[str, str]:
    return "", ""


@pytest.fixture
async def provider() -> GatedProvider:
    return GatedProvider()


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
async def manager(
    store: Store, provider: GatedProvider, metrics: Metrics, tmp_path: Path
) -> AsyncIterator[SessionManager]:
    agent = Agent(
        provider, store, MemoryFiles(tmp_path), ToolRegistry(), AgentSettings(memory_pass=False)
    )
    config = SessionsConfig(max_concurrent_turns=1, max_waiting_turns=1, drain_timeout=0.2)
    async with SessionManager(store, agent, config, metrics, _no_snapshot) as m:
        yield m


def request(session: str, text: str) -> TurnRequest:
    return TurnRequest(SessionKey(f"test:acct:{session}"), "test", text)


def refused(metrics: Metrics) -> float:
    return metrics.registry.get_sample_value("herald_refused_turns_total") or 0.0


async def test_turns_past_the_waiting_cap_are_refused_and_counted(
    manager: SessionManager, provider: GatedProvider, metrics: Metrics
) -> None:
    running = manager.submit(request("a", "a"))
    await provider.wait_started(1)  # holds the only slot; nothing waits
    waiting = manager.submit(request("b", "b"))
    with pytest.raises(Overloaded) as caught:
        manager.submit(request("c", "c"))
    assert caught.value.retry_after > 0
    assert refused(metrics) == 1.0

    provider.gate("a").set()
    assert (await running.result()).status == "completed"
    await provider.wait_started(2)  # b holds the slot now: room for one waiting turn again
    later = manager.submit(request("c", "c"))
    for text in ("b", "c"):
        provider.gate(text).set()
    assert [(await s.result()).status for s in (waiting, later)] == ["completed"] * 2
    assert refused(metrics) == 1.0


async def test_the_api_answers_503_with_retry_after_when_overloaded(
    manager: SessionManager, provider: GatedProvider, metrics: Metrics, store: Store
) -> None:
    config = HeraldConfig.model_validate({"api": {"key": KEY}})
    deps = AppDeps(config, store, manager, metrics, llm_provider="gated", llm_model="gated")
    app = create_app(deps)
    transport = httpx.ASGITransport(app=app.state.asgi)
    async with httpx.AsyncClient(transport=transport, base_url="http://herald") as http:

        async def ask(session: str) -> httpx.Response:
            return await http.post(
                "/v1/chat/completions",
                json={"model": "herald", "messages": [{"role": "user", "content": session}]},
                headers={"Authorization": f"Bearer {KEY}", "X-Herald-Session-Id": session},
            )

        async with asyncio.TaskGroup() as tg:
            first = tg.create_task(ask("a"))
            await provider.wait_started(1)
            manager.submit(request("b", "b"))  # waits for the slot
            overloaded = await ask("c")
            assert overloaded.status_code == 503
            assert overloaded.headers["retry-after"] == "1"
            assert overloaded.json()["error"]["type"] == "service_unavailable"
            assert refused(metrics) == 1.0
            for text in ("a", "b"):
                provider.gate(text).set()
        assert first.result().status_code == 200
    # Refused before any database work: the session was never created.
    assert await store.get_session("api:default:c") is None
