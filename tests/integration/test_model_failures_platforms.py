"""When the model fails, Herald stays up, on every platform: each one through its fake (see
tests/contract/harness.py), the model through the real OpenAI client against the fake LLM
server, brought up and down on one address.

On every platform: an unreachable model keeps the message waiting and tells its sender once,
and the message is answered exactly once when the model is back; a refused request is dropped
at once with a notice and the next message is answered; stopping during an outage drains and
exits 0, and the waiting message is answered after the next start; a turn past its timeout is
dropped with a notice.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.contract.harness import HARNESSES, PlatformHarness, started
from tests.e2e.daemon import free_port
from tests.fakes.llm import FakeLLM, Reply, you_said
from tests.integration.inproc import Herald, running_daemon
from tests.integration.test_model_failures import OUTAGE_NOTICE, llm_section, sessions_section

pytestmark = pytest.mark.timeout(90)

TURN_TIMEOUT = 5.0
"""Long enough for a turn that is answered on a busy test machine: CI, with every worker busy,
once took over 2 s for the answered turn after the hung one."""


@pytest.fixture(params=sorted(HARNESSES))
async def platform(request: pytest.FixtureRequest) -> AsyncIterator[PlatformHarness]:
    async with started(str(request.param)) as harness:
        yield harness


@contextlib.asynccontextmanager
async def herald(
    tmp_path: Path,
    platform: PlatformHarness,
    llm_port: int,
    *,
    port: int | None = None,
    **sessions: Any,
) -> AsyncIterator[Herald]:
    """The daemon in-process with `platform` at its fake and the model at `llm_port` (where
    nothing may listen yet); `sessions` changes the fast-retry sessions section."""
    port = free_port() if port is None else port
    async with running_daemon(
        tmp_path,
        FakeLLM(),  # not started: only the `llm` section below is read
        platform.platform,
        platform.section(port),
        port=port,
        extra={"llm": llm_section(llm_port), "sessions": sessions_section(**sessions)},
    ) as h:
        yield h


async def health(h: Herald) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
        body: dict[str, Any] = (await client.get(f"{h.url}/health")).json()
        return body


async def stored(h: Herald, count: int) -> list[dict[str, Any]]:
    """Wait until `count` messages are stored (with or without an outcome); return them."""
    async with asyncio.timeout(15):
        while len(rows := await h.rows()) < count:
            await asyncio.sleep(0.02)
    return [dict(r) for r in rows]


async def test_unreachable_model_tells_once_and_answers_once_when_back(
    tmp_path: Path, platform: PlatformHarness
) -> None:
    ann = platform.people[0]
    llm_port = free_port()
    async with herald(tmp_path, platform, llm_port) as h:
        await platform.send(h, ann, "first")
        [notice] = await platform.wait_texts(ann, 1)
        assert OUTAGE_NOTICE in notice
        await platform.send(h, ann, "second")
        rows = await stored(h, 2)
        assert [r["outcome"] for r in rows] == [None, None]  # both still waiting
        body = await health(h)
        assert body["status"] == "ok"
        assert body["llm"]["state"] == "unreachable"
        assert body["llm"]["detail"].startswith("unreachable since ")
        assert await h.ready() == 200
        assert not h.supervisor._stop.is_set()

        async with FakeLLM(port=llm_port) as llm:
            texts = await platform.wait_texts(ann, 3)
            rows = [dict(r) for r in await h.answered(2)]
            assert [r["outcome"] for r in rows] == ["answered", "answered"]
            assert texts[1:] == ["You said: first", "You said: second"]
            assert len(llm.requests) == 2  # each answered once
            assert (await health(h))["llm"]["state"] == "ok"
        assert len(platform.texts_to(ann)) == 3  # nothing came after the answers
        assert sum(OUTAGE_NOTICE in t for t in platform.texts_to(ann)) == 1
    assert h.exit_code == 0


async def test_refused_request_is_dropped_with_a_notice_and_the_next_is_answered(
    tmp_path: Path, platform: PlatformHarness
) -> None:
    ann = platform.people[0]
    async with FakeLLM() as llm, herald(tmp_path, platform, llm.port) as h:
        llm.script(Reply(status=401))
        await platform.send(h, ann, "hello")
        [notice] = await platform.wait_texts(ann, 1)
        assert "refused" in notice
        [row] = [dict(r) for r in await h.answered(1)]
        assert row["outcome"] == "dropped"
        assert "401" in str(row["outcome_detail"])
        assert len(llm.requests) == 1  # not retried
        body = await health(h)
        assert (body["status"], body["llm"]["state"]) == ("ok", "rejected")
        assert await h.ready() == 200

        await platform.send(h, ann, "again")
        texts = await platform.wait_texts(ann, 2)
        assert texts[1] == "You said: again"
        assert [r["outcome"] for r in await h.answered(2)] == ["dropped", "answered"]
        assert (await health(h))["llm"]["state"] == "ok"
    assert h.exit_code == 0


async def test_turn_past_its_timeout_is_dropped_with_a_notice_and_the_next_is_answered(
    tmp_path: Path, platform: PlatformHarness
) -> None:
    ann = platform.people[0]
    async with (
        FakeLLM() as llm,
        herald(tmp_path, platform, llm.port, turn_timeout=TURN_TIMEOUT) as h,
    ):
        llm.script(Reply(hang=True))
        await platform.send(h, ann, "slow")
        [notice] = await platform.wait_texts(ann, 1)
        assert f"took longer than {TURN_TIMEOUT:g}s" in notice
        [row] = [dict(r) for r in await h.answered(1)]
        assert row["outcome"] == "dropped"
        await platform.send(h, ann, "fast")
        assert (await platform.wait_texts(ann, 2))[1] == "You said: fast"
        assert (await health(h))["status"] == "ok"
    assert h.exit_code == 0


async def test_stopping_during_an_outage_drains_and_the_message_waits_for_the_next_start(
    tmp_path: Path, platform: PlatformHarness
) -> None:
    ann, bob = platform.people
    llm_port = free_port()
    port = free_port()
    async with herald(tmp_path, platform, llm_port, port=port) as h:
        await platform.send(h, ann, "kept")
        [notice] = await platform.wait_texts(ann, 1)
        assert OUTAGE_NOTICE in notice
        [row] = await stored(h, 1)
        assert row["outcome"] is None
    assert h.exit_code == 0  # the stop did not wait for the model

    async with FakeLLM(port=llm_port) as llm, herald(tmp_path, platform, llm_port, port=port) as h:
        texts = await platform.wait_texts(ann, 2)
        assert texts[1] == "You said: kept"
        await platform.send(h, bob, "new")
        assert await platform.wait_texts(bob, 1) == ["You said: new"]
        assert [r["outcome"] for r in await h.answered(2)] == ["answered", "answered"]
        assert len(llm.requests) == 2
        assert len(platform.texts_to(ann)) == 2
    assert h.exit_code == 0


async def test_a_message_during_a_retry_gets_no_busy_acknowledgement(tmp_path: Path) -> None:
    """A message that arrives while a retry of the outage is running is not acknowledged with
    "still working": its sender was told once that their messages wait."""
    async with (
        started("loopback") as platform,
        FakeLLM() as llm,
        herald(tmp_path, platform, llm.port) as h,
    ):
        ann = platform.people[0]
        llm.responder = lambda body: Reply(status=503)
        await platform.send(h, ann, "first")
        [notice] = await platform.wait_texts(ann, 1)
        assert OUTAGE_NOTICE in notice
        llm.responder = lambda body: Reply(status=503, delay=1.0)  # the next retry stays busy
        tried = len(llm.requests)
        await llm.wait_for_requests(tried + 1)
        await platform.send(h, ann, "second")
        await stored(h, 2)
        assert len(llm.requests) == tried + 1  # it arrived during that retry
        llm.responder = you_said
        texts = await platform.wait_texts(ann, 3)
        assert texts == [notice, "You said: first", "You said: second"]
        await h.answered(2)
        assert platform.texts_to(ann) == texts
    assert h.exit_code == 0
