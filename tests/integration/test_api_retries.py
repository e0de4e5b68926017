"""A retried API request is one message: with the model down the request is refused (503)
having stored nothing, so the openai SDK's own retry asks the question once; a request sent
again with its `Idempotency-Key` is answered by the same turn (the whole daemon in-process,
the real `openai` client against it, the fake model behind it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import select

from gateway.store.tables import messages, sessions, turns
from tests.e2e.daemon import free_port
from tests.fakes.chat_server import FakeChatServer
from tests.fakes.llm import FakeLLM, Reply, last_user_text
from tests.integration.inproc import Herald, running_daemon

pytestmark = pytest.mark.timeout(90)

API_KEY = "retries-api-key-0123456789"
TOKEN = "4242:retries-chat-token-0123"


@dataclass
class Rig:
    herald: Herald
    llm_port: int
    api: httpx.AsyncClient

    async def history(self, session: str) -> list[tuple[str, str]]:
        """(role, content) of every stored message of API session `session`, in order."""
        async with self.herald.store.read() as conn:
            rows = await conn.execute(
                select(messages.c.role, messages.c.content)
                .join(sessions, sessions.c.id == messages.c.session_id)
                .where(sessions.c.key.endswith(f":{session}"))
                .order_by(messages.c.id)
            )
            return [(str(r.role), str(r.content)) for r in rows]

    async def turn_statuses(self) -> list[str]:
        async with self.herald.store.read() as conn:
            return [str(s) for s in (await conn.scalars(select(turns.c.status))).all()]


@asynccontextmanager
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    port, llm_port = free_port(), free_port()
    async with FakeChatServer(TOKEN) as chat:
        section = {"url": chat.base_url, "token": TOKEN, "account": "bot1", "poll_timeout": 1}
        config = {
            "api": {"host": "127.0.0.1", "port": port, "key": API_KEY},
            "llm": {
                "base_url": f"http://127.0.0.1:{llm_port}/v1",
                "api_key": "k",
                "memory_pass": False,
                "max_retries": 0,
                "connect_timeout": 2,
            },
        }
        placeholder = FakeLLM()  # only read when `extra` has no llm section
        async with (
            running_daemon(tmp_path, placeholder, "test", section, port=port, extra=config) as h,
            httpx.AsyncClient(
                base_url=h.url,
                headers={"Authorization": f"Bearer {API_KEY}"},
                timeout=30.0,
                trust_env=False,
            ) as api,
        ):
            yield Rig(h, llm_port, api)


def ask(text: str, session: str, **headers: str) -> dict[str, Any]:
    """The arguments of a session request asking `text`."""
    return {
        "json": {"messages": [{"role": "user", "content": text}]},
        "headers": {"X-Herald-Session-Id": session, **headers},
    }


async def test_the_sdks_retry_after_a_503_asks_the_question_once(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        refused = await r.api.post("/v1/chat/completions", **ask("warm up", "s1"))  # model down
        assert refused.status_code == 503
        message = refused.json()["error"]["message"]
        assert message.endswith("; retry later"), message
        assert message.count("retry later") == 1, message  # said once
        assert await r.history("s1") == []  # refused, so nothing of it is kept
        sdk = openai.AsyncOpenAI(
            base_url=f"{r.herald.url}/v1", api_key=API_KEY, max_retries=2, timeout=30.0
        )
        async with sdk:
            call = asyncio.create_task(
                sdk.chat.completions.create(
                    model="herald",
                    messages=[{"role": "user", "content": "what is the capital of France?"}],
                    extra_headers={"X-Herald-Session-Id": "s1"},
                )
            )
            # The first try is refused (503, Retry-After); the model is back before the retry.
            await r.herald.until(lambda: _failed_twice(r))
            assert not call.done()
            async with FakeLLM(port=r.llm_port) as llm:
                answer = await asyncio.wait_for(call, 60)
        assert answer.choices[0].message.content == "You said: what is the capital of France?"
        assert [last_user_text(b) for b in llm.requests] == ["what is the capital of France?"]
        assert await r.history("s1") == [
            ("user", "what is the capital of France?"),
            ("assistant", "You said: what is the capital of France?"),
        ]


async def _failed_twice(r: Rig) -> bool:
    return (await r.turn_statuses()).count("failed") >= 2


async def test_an_idempotency_key_answers_a_request_sent_again_once(tmp_path: Path) -> None:
    async with rig(tmp_path) as r, FakeLLM(port=r.llm_port) as llm:
        first = await r.api.post("/v1/chat/completions", **ask("hello", "s2", **KEY_A))
        again = await r.api.post("/v1/chat/completions", **ask("hello", "s2", **KEY_A))
        assert first.status_code == again.status_code == 200, again.text
        assert answer_of(again) == answer_of(first) == "You said: hello"
        assert len(llm.requests) == 1  # answered once
        streamed = await r.api.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hello"}], "stream": True},
            headers={"X-Herald-Session-Id": "s2", **KEY_A},
        )
        assert "You said: hello" in streamed.text
        other = await r.api.post("/v1/chat/completions", **ask("something else", "s2", **KEY_A))
        assert other.status_code == 422, other.text
        assert len(llm.requests) == 1
        assert await r.history("s2") == [("user", "hello"), ("assistant", "You said: hello")]

        # A try whose tool ran keeps its question; the retry continues it.
        llm.script(Reply(tool_calls=[("session_search", {"query": "hello"})]), Reply(status=503))
        failed = await r.api.post("/v1/chat/completions", **ask("search it", "s2", **KEY_B))
        assert failed.status_code == 503, failed.text
        done = await r.api.post("/v1/chat/completions", **ask("search it", "s2", **KEY_B))
        assert done.status_code == 200, done.text
        assert answer_of(done) == "You said: search it"
        history = await r.history("s2")
        assert [c for role, c in history if role == "user"] == ["hello", "search it"]
        assert history[-1] == ("assistant", "You said: search it")


KEY_A = {"Idempotency-Key": "request-a"}
KEY_B = {"Idempotency-Key": "request-b"}


def answer_of(response: httpx.Response) -> str:
    content: str = response.json()["choices"][0]["message"]["content"]
    return content
