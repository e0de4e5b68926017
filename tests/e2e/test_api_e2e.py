"""`herald run` as a subprocess, driven by the real `openai` SDK, answered by the fake LLM."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from agent_core.agent import MEMORY_MARKER
from gateway.contracts.history import Role
from gateway.store import Store
from tests.e2e.daemon import Daemon, running
from tests.fakes.llm import FakeLLM, Reply, you_said

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
KEY = "e2e-secret-key"


def conversation_requests(llm: FakeLLM) -> list[dict[str, Any]]:
    """The model calls of turns (not of the memory pass)."""
    return [r for r in llm.requests if MEMORY_MARKER not in str(r["messages"][0]["content"])]


def responder(body: dict[str, Any]) -> Reply:
    """Answer turns by echoing; answer the memory pass with nothing to save."""
    if MEMORY_MARKER in str(body["messages"][0]["content"]):
        return Reply(text="nothing to save")
    return you_said(body)


def settings(llm: FakeLLM, **api: Any) -> dict[str, Any]:
    """Daemon settings pointing at the fake LLM."""
    return {
        "llm": {"base_url": llm.base_url, "api_key": "sk-fake", "model": "fake-model"},
        "api": {"key": KEY, **api},
    }


def client(daemon: Daemon, session: str | None = None) -> openai.AsyncOpenAI:
    """An SDK client for the daemon, naming a session by header when given."""
    headers = {"X-Herald-Session-Id": session} if session else None
    return openai.AsyncOpenAI(
        base_url=f"{daemon.url}/v1", api_key=KEY, default_headers=headers, max_retries=0
    )


async def test_session_history_across_calls_and_restart(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with FakeLLM() as llm:
        llm.responder = responder
        async with running(state, **settings(llm)) as daemon:
            async with client(daemon, "alpha") as sdk:
                raw = await sdk.chat.completions.with_raw_response.create(
                    model="herald", messages=[{"role": "user", "content": "my name is Ada"}]
                )
                assert raw.headers["x-herald-session-id"] == "alpha"
                first = raw.parse()
                assert first.choices[0].message.content == "You said: my name is Ada"
                assert first.usage is not None
                assert first.usage.total_tokens > 0

                stream = await sdk.chat.completions.create(
                    model="herald",
                    messages=[{"role": "user", "content": "what is my name?"}],
                    stream=True,
                    stream_options={"include_usage": True},
                )
                pieces: list[str] = []
                usage = None
                async for chunk in stream:
                    if chunk.usage is not None:
                        usage = chunk.usage
                    if chunk.choices and chunk.choices[0].delta.content:
                        pieces.append(chunk.choices[0].delta.content)
                assert "".join(pieces) == "You said: what is my name?"
                assert usage is not None
                assert usage.prompt_tokens > 0
            second = conversation_requests(llm)[-1]["messages"]
            contents = [(m["role"], m["content"]) for m in second]
            assert contents[-3:] == [
                ("user", "my name is Ada"),
                ("assistant", "You said: my name is Ada"),
                ("user", "what is my name?"),
            ]
            assert await daemon.stop() == 0

        # A new process on the same state directory rebuilds the history from SQL.
        async with running(state, **settings(llm)) as daemon, client(daemon, "alpha") as sdk:
            third = await sdk.chat.completions.create(
                model="herald", messages=[{"role": "user", "content": "and again?"}]
            )
            assert third.choices[0].message.content == "You said: and again?"
            texts = [m["content"] for m in conversation_requests(llm)[-1]["messages"]]
            assert texts[1:] == [
                "my name is Ada",
                "You said: my name is Ada",
                "what is my name?",
                "You said: what is my name?",
                "and again?",
            ]
            assert await daemon.stop() == 0


async def test_sessions_are_separate_and_user_field_names_one(tmp_path: Path) -> None:
    async with FakeLLM() as llm:
        llm.responder = responder
        async with running(tmp_path / "s", **settings(llm)) as daemon:
            async with client(daemon) as sdk:
                await sdk.chat.completions.create(
                    model="herald", messages=[{"role": "user", "content": "one"}], user="u1"
                )
                await sdk.chat.completions.create(
                    model="herald", messages=[{"role": "user", "content": "two"}], user="u2"
                )
                await sdk.chat.completions.create(
                    model="herald", messages=[{"role": "user", "content": "three"}], user="u1"
                )
            turns = conversation_requests(llm)
            assert [m["content"] for m in turns[1]["messages"][1:]] == ["two"]
            assert [m["content"] for m in turns[2]["messages"][1:]] == [
                "one",
                "You said: one",
                "three",
            ]
            assert await daemon.stop() == 0
        async with Store.open(daemon.database_url) as store:
            keys = sorted(s.key for s in await store.list_sessions())
        assert keys == ["api:default:u1", "api:default:u2"]


async def test_stateless_request_uses_given_history_and_stores_nothing(tmp_path: Path) -> None:
    async with FakeLLM() as llm:
        llm.responder = responder
        async with running(tmp_path / "s", **settings(llm)) as daemon:
            async with client(daemon) as sdk:
                reply = await sdk.chat.completions.create(
                    model="herald",
                    messages=[
                        {"role": "system", "content": "be brief"},
                        {"role": "user", "content": "hi"},
                        {"role": "assistant", "content": "hello"},
                        {"role": "user", "content": "bye"},
                    ],
                )
            assert reply.choices[0].message.content == "You said: bye"
            sent = conversation_requests(llm)[-1]["messages"]
            assert [m["content"] for m in sent[1:]] == ["be brief", "hi", "hello", "bye"]
            assert await daemon.stop() == 0
        async with Store.open(daemon.database_url) as store:
            assert await store.list_sessions() == []


async def test_models_health_and_openapi(tmp_path: Path) -> None:
    async with FakeLLM() as llm, running(tmp_path / "s", **settings(llm)) as daemon:
        async with client(daemon) as sdk:
            models = await sdk.models.list()
            assert [m.id for m in models.data] == ["herald"]
        async with httpx.AsyncClient(base_url=daemon.url) as http:
            assert (await http.get("/health")).json() == {"status": "ok"}  # no key: no details
            key = {"Authorization": f"Bearer {KEY}"}
            health = (await http.get("/health", headers=key)).json()
            assert health["status"] == "ok"
            assert health["llm"]["provider"] == "openai"
            assert health["database"] == "sqlite"
            spec = (await http.get("/openapi.json")).json()
            assert "/v1/chat/completions" in spec["paths"]
            metrics = await http.get("/metrics", headers={"Authorization": f"Bearer {KEY}"})
            assert metrics.status_code == 200
            assert "herald_http_requests_total" in metrics.text
            assert (await http.get("/metrics")).status_code == 401
        assert await daemon.stop() == 0


async def test_echo_provider_without_llm_says_so(tmp_path: Path) -> None:
    async with running(tmp_path / "s") as daemon:
        import httpx

        async with httpx.AsyncClient(base_url=daemon.url) as http:
            health = (await http.get("/health")).json()
            assert health["llm"]["provider"] == "echo"
            assert "offline" in health["llm"]["warning"]
            reply = await http.post(
                "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "ping"}], "user": "x"},
            )
            assert reply.json()["choices"][0]["message"]["content"] == "echo: ping"
        assert await daemon.stop() == 0
    assert "OFFLINE ECHO PROVIDER" in daemon.output()
    async with Store.open(daemon.database_url) as store:
        session = await store.get_session("api:default:x")
        assert session is not None
        roles = [m.role for m in await store.transcript(session.id)]
        assert roles == [Role.USER, Role.ASSISTANT]


async def test_server_timing_splits_herald_time_from_the_model_time(tmp_path: Path) -> None:
    async with FakeLLM() as llm:
        llm.responder = lambda body: Reply(text="slow answer", delay=0.2)
        config = settings(llm)
        config["llm"]["memory_pass"] = False
        async with running(tmp_path / "state", **config) as daemon, client(daemon) as sdk:
            started = time.monotonic()
            raw = await sdk.chat.completions.with_raw_response.create(
                model="herald", messages=[{"role": "user", "content": "hi"}]
            )
            elapsed_ms = (time.monotonic() - started) * 1000
            assert raw.parse().choices[0].message.content == "slow answer"
            timing = raw.headers["server-timing"]
            parts = dict(part.strip().split(";dur=") for part in timing.split(","))
            assert set(parts) == {"herald", "llm"}
            assert float(parts["llm"]) >= 200.0
            # Herald's own share is real time, and the two shares fit in what the client saw.
            assert float(parts["herald"]) > 0.0
            assert float(parts["herald"]) + float(parts["llm"]) <= elapsed_ms
            async with httpx.AsyncClient(base_url=daemon.url) as http:
                auth = {"Authorization": f"Bearer {KEY}"}
                metrics = (await http.get("/metrics", headers=auth)).text
            assert "herald_turn_overhead_seconds_count 1.0" in metrics
