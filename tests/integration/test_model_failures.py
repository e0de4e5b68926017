"""When the model fails, Herald stays up: every kind of model failure on a platform turn, an
API turn and a scheduled job, through the real OpenAI client against the fake LLM server.

A transient failure (unreachable, 5xx or 429 after the client's retries) keeps the message
queued, tells its sender once and answers when the model is back; a permanent one (401, 400,
a turn past its timeout) drops the message at once with a notice. The daemon never stops.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.daemon import free_port
from tests.fakes.llm import FakeLLM, Reply, you_said
from tests.fakes.telegram import FakeTelegramServer, Sent
from tests.integration.inproc import Herald, running_daemon
from tests.integration.telegram_rig import ANN, BOB, TOKEN

pytestmark = pytest.mark.timeout(90)

OUTAGE_NOTICE = "can't reach my language model"


def llm_section(port: int) -> dict[str, Any]:
    """The model at 127.0.0.1:`port`, without the client's own retries (the tests are about
    what Herald does once they are spent)."""
    return {
        "base_url": f"http://127.0.0.1:{port}/v1",
        "api_key": "k",
        "memory_pass": False,
        "max_retries": 0,
        "connect_timeout": 2,
    }


def sessions_section(**changes: Any) -> dict[str, Any]:
    """Fast retries while the model is away."""
    return {
        "drain_timeout": 2,
        "ack_interval": 0,
        "model_retry_initial": 0.05,
        "model_retry_max": 0.2,
        **changes,
    }


@dataclasses.dataclass
class Setup:
    tmp_path: Path
    tg: FakeTelegramServer
    llm_port: int


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    async with FakeTelegramServer(TOKEN) as tg:
        yield Setup(tmp_path, tg, free_port())


def herald(s: Setup, llm: FakeLLM | None = None, **sessions: Any) -> Any:
    """The daemon in-process with Telegram at the fake and the model at `s.llm_port`."""
    section = {
        "token": TOKEN,
        "base_url": s.tg.base_url,
        "base_file_url": s.tg.base_file_url,
        "allowed_users": [str(ANN), str(BOB)],
        "poll_timeout": 1,
        "stream_edits": False,
        "min_send_interval": 0,
    }
    placeholder = llm or FakeLLM()  # only its base_url is read, and `extra` replaces it
    return running_daemon(
        s.tmp_path,
        placeholder,
        "telegram",
        section,
        extra={"llm": llm_section(s.llm_port), "sessions": sessions_section(**sessions)},
    )


def to(chat: int) -> Any:
    return lambda sent: sent.chat_id == chat


async def sent_to(tg: FakeTelegramServer, chat: int, n: int) -> list[str]:
    """Wait until `chat` got `n` messages; return their texts."""
    found: list[Sent] = await tg.wait_for_sent(lambda s: s.chat_id == chat, timeout=15)
    async with asyncio.timeout(15):
        while len(found) < n:
            await asyncio.sleep(0.02)
            found = [s for s in tg.sent if s.chat_id == chat]
    return [s.plain_text for s in found]


async def health(h: Herald) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
        body: dict[str, Any] = (await client.get(f"{h.url}/health")).json()
        return body


async def outcome_of(h: Herald, index: int = 0) -> tuple[str, str | None]:
    """(outcome, detail) of the `index`-th stored message, once it has one."""
    rows = await h.answered(index + 1)
    return str(rows[index]["outcome"]), rows[index]["outcome_detail"]


async def test_unreachable_model_queues_tells_once_and_answers_when_back(setup: Setup) -> None:
    async with herald(setup) as h:
        setup.tg.inject_message(ANN, "first", sender_id=ANN)
        [notice] = await sent_to(setup.tg, ANN, 1)
        assert OUTAGE_NOTICE in notice
        setup.tg.inject_message(ANN, "second", sender_id=ANN)
        async with asyncio.timeout(15):
            while len(await h.rows()) < 2:
                await asyncio.sleep(0.02)
        assert all(r["outcome"] is None for r in await h.rows())  # both still waiting
        body = await health(h)
        assert body["status"] == "ok"
        assert body["llm"]["state"] == "unreachable"
        assert body["llm"]["detail"].startswith("unreachable since ")
        assert await h.ready() == 200
        assert not h.supervisor._stop.is_set()
        async with FakeLLM(port=setup.llm_port) as llm:
            texts = await sent_to(setup.tg, ANN, 3)
            rows = await h.answered(2)
            assert [r["outcome"] for r in rows] == ["answered", "answered"]
            assert texts[1:] == ["You said: first", "You said: second"]
            assert (await health(h))["llm"]["state"] == "ok"
            assert len(llm.requests) == 2  # each answered once
        # Told once for the whole outage, not once per message or per retry.
        assert sum(OUTAGE_NOTICE in t for t in setup.tg.texts_in(ANN)) == 1
        metrics = await _metrics(h)
        assert 'herald_model_failures_total{kind="unreachable"}' in metrics


async def test_outage_then_recovery_on_the_same_address(setup: Setup) -> None:
    async with FakeLLM(port=setup.llm_port) as llm, herald(setup, llm) as h:
        setup.tg.inject_message(ANN, "before", sender_id=ANN)
        assert await sent_to(setup.tg, ANN, 1) == ["You said: before"]
        await llm.__aexit__(None, None, None)  # the endpoint goes away
        setup.tg.inject_message(ANN, "during", sender_id=ANN)
        texts = await sent_to(setup.tg, ANN, 2)
        assert OUTAGE_NOTICE in texts[1]
        async with FakeLLM(port=setup.llm_port) as back:
            texts = await sent_to(setup.tg, ANN, 3)
            assert texts[2] == "You said: during"
            assert len(back.requests) == 1
        assert [r["outcome"] for r in await h.rows()] == ["answered", "answered"]


@pytest.mark.parametrize("status", [500, 502, 503, 429])
async def test_server_errors_after_retries_are_transient(setup: Setup, status: int) -> None:
    async with FakeLLM(port=setup.llm_port) as llm, herald(setup, llm) as h:
        failing = True

        def answer(body: dict[str, Any]) -> Reply:
            return Reply(status=status, retry_after=0.01) if failing else you_said(body)

        llm.responder = answer
        setup.tg.inject_message(ANN, "hello", sender_id=ANN)
        [notice] = await sent_to(setup.tg, ANN, 1)
        assert OUTAGE_NOTICE in notice
        await llm.wait_for_requests(3)  # tried again, with backoff
        failing = False
        texts = await sent_to(setup.tg, ANN, 2)
        assert texts[1] == "You said: hello"
        rows = await h.answered(1)
        assert [r["outcome"] for r in rows] == ["answered"]
        assert rows[0]["attempts"] <= 1  # the model's failures did not use up its tries


@pytest.mark.parametrize(
    ("status", "word"),
    [(401, "refused"), (403, "refused"), (400, "refused")],
)
async def test_refused_request_drops_at_once_with_a_notice(
    setup: Setup, status: int, word: str
) -> None:
    async with FakeLLM(port=setup.llm_port) as llm, herald(setup, llm) as h:
        llm.script(Reply(status=status))
        setup.tg.inject_message(ANN, "hello", sender_id=ANN)
        [notice] = await sent_to(setup.tg, ANN, 1)
        assert word in notice
        outcome, detail = await outcome_of(h)
        assert outcome == "dropped"
        assert detail is not None
        assert str(status) in detail
        assert len(llm.requests) == 1  # not retried
        if status in (401, 403):
            body = await health(h)
            assert body["llm"]["state"] == "rejected"
            assert body["status"] == "ok"
        # The daemon goes on: the next message is answered.
        setup.tg.inject_message(ANN, "again", sender_id=ANN)
        texts = await sent_to(setup.tg, ANN, 2)
        assert texts[1] == "You said: again"
        assert (await health(h))["llm"]["state"] == "ok"


async def test_turn_past_its_timeout_is_dropped_with_a_notice(setup: Setup) -> None:
    async with FakeLLM(port=setup.llm_port) as llm, herald(setup, llm, turn_timeout=3.0) as h:
        llm.script(Reply(hang=True))
        setup.tg.inject_message(ANN, "slow", sender_id=ANN)
        [notice] = await sent_to(setup.tg, ANN, 1)
        assert "took longer than 3s" in notice
        outcome, _ = await outcome_of(h)
        assert outcome == "dropped"
        setup.tg.inject_message(ANN, "fast", sender_id=ANN)
        assert (await sent_to(setup.tg, ANN, 2))[1] == "You said: fast"


async def test_outage_longer_than_the_wait_drops_with_a_notice(setup: Setup) -> None:
    async with herald(setup, model_outage_max_wait=0.5) as h:
        setup.tg.inject_message(ANN, "hello", sender_id=ANN)
        texts = await sent_to(setup.tg, ANN, 2)
        assert OUTAGE_NOTICE in texts[0]
        assert "unreachable for" in texts[1]
        outcome, detail = await outcome_of(h)
        assert outcome == "dropped"
        assert detail is not None
        assert "unreachable" in detail


async def test_other_chats_and_commands_work_during_an_outage(setup: Setup) -> None:
    async with herald(setup) as h:
        setup.tg.inject_message(ANN, "hello", sender_id=ANN)
        await sent_to(setup.tg, ANN, 1)
        setup.tg.inject_message(BOB, "/status", sender_id=BOB)
        [status] = await sent_to(setup.tg, BOB, 1)
        assert status.startswith("Session telegram:")
        setup.tg.inject_message(ANN, "/stop", sender_id=ANN)
        texts = await sent_to(setup.tg, ANN, 2)
        # Waiting for its next try, or in a try right now: either way it is stopped.
        assert "Cleared 1 queued message" in texts[1] or texts[1].startswith("⏹ Stopped.")
        rows = [r for r in await h.answered(3) if r["chat_id"] == str(ANN)]
        assert [(r["text"], r["outcome"]) for r in rows] == [
            ("hello", "dropped"),
            ("/stop", "answered"),
        ]


async def test_a_message_waiting_through_new_is_answered_in_the_new_conversation(
    setup: Setup,
) -> None:
    async with herald(setup, model_retry_initial=0.3, model_retry_max=0.3) as h:
        setup.tg.inject_message(ANN, "remember me", sender_id=ANN)
        await sent_to(setup.tg, ANN, 1)
        setup.tg.inject_message(ANN, "/new", sender_id=ANN)
        texts = await sent_to(setup.tg, ANN, 2)
        assert "new conversation" in texts[1]
        async with FakeLLM(port=setup.llm_port) as llm:
            rows = [r for r in await h.answered(2) if r["text"] == "remember me"]
            if rows[0]["outcome"] == "answered":  # /new came between two tries
                [asked] = llm.requests
                assert "remember me" in json.dumps(asked["messages"])
                assert (await sent_to(setup.tg, ANN, 3))[2] == "You said: remember me"
            else:  # /new stopped a try under way: dropped, as a running turn is
                assert rows[0]["outcome"] == "dropped"


async def test_api_turns_fail_with_a_retryable_error_during_an_outage(setup: Setup) -> None:
    async with herald(setup) as h, httpx.AsyncClient(timeout=10.0, trust_env=False) as client:
        body = {"model": "herald", "messages": [{"role": "user", "content": "hi"}], "user": "u1"}
        response = await client.post(f"{h.url}/v1/chat/completions", json=body)
        assert response.status_code == 503
        assert "retry" in response.json()["error"]["message"]
        stateless = await client.post(
            f"{h.url}/v1/chat/completions",
            json={"model": "herald", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert stateless.status_code == 503
        assert (await client.get(f"{h.url}/health")).json()["status"] == "ok"
        async with FakeLLM(port=setup.llm_port):
            response = await client.post(f"{h.url}/v1/chat/completions", json=body)
            assert response.status_code == 200
            assert response.json()["choices"][0]["message"]["content"] == "You said: hi"


async def test_scheduled_job_during_an_outage_is_recorded_failed(setup: Setup) -> None:
    async with herald(setup) as h, httpx.AsyncClient(timeout=10.0, trust_env=False) as client:
        job = {"prompt": "report", "schedule": "every 1h", "targets": [f"telegram:{ANN}"]}
        created = await client.post(f"{h.url}/api/jobs", json=job)
        assert created.status_code in (200, 201), created.text
        job_id = created.json()["id"]
        ran = await client.post(f"{h.url}/api/jobs/{job_id}/run")
        assert ran.status_code in (200, 202), ran.text

        async def failed() -> bool:
            runs = (await client.get(f"{h.url}/api/jobs/{job_id}")).json()["runs"]
            return any(r["status"] == "failed" for r in runs)

        await h.until(failed)
        assert (await client.get(f"{h.url}/health")).json()["status"] == "ok"
        assert not h.supervisor._stop.is_set()


async def _metrics(h: Herald) -> str:
    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
        return (await client.get(f"{h.url}/metrics")).text
