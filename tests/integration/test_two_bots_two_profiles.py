"""Issue 42's whole setup: two Telegram bots (two tokens, each on a fake Bot API of its own)
in one Herald, each account bound to its own profile. Each bot answers with its profile's
persona and model; one bot's 429 never delays the other; a memory written through one
profile is absent from the other's prompt; a job of `work` reports to `work`'s home, through
the work bot."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.daemon import free_port
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.telegram import FakeTelegramServer
from tests.integration.inproc import Herald, running_daemon
from tests.integration.telegram_rig import ANN

pytestmark = pytest.mark.timeout(90)

FAMILY_TOKEN = "111111:family-bot-token"
WORK_TOKEN = "222222:work-bot-token"
KEY = "api-secret-two-bots"
FAMILY_SOUL = "You are Hearth, the family assistant."
WORK_SOUL = "You are Ledger, the work assistant."
WAIT = 20.0


def account(tg: FakeTelegramServer, token: str) -> dict[str, Any]:
    return {"token": token, "base_url": tg.base_url, "base_file_url": tg.base_file_url}


def system(body: dict[str, Any]) -> str:
    first = body["messages"][0]
    assert first["role"] == "system"
    return str(first["content"])


def asked(llm: FakeLLM, text: str) -> dict[str, Any]:
    """The first request to the model whose last message contains `text`."""
    for body in llm.requests:
        if text in str(body["messages"][-1].get("content")):
            return body
    raise AssertionError(f"the model was never asked {text!r}")


@contextlib.asynccontextmanager
async def two_bots_two_profiles(
    tmp_path: Path, llm: FakeLLM, family: FakeTelegramServer, work: FakeTelegramServer
) -> AsyncIterator[tuple[Herald, httpx.AsyncClient]]:
    port = free_port()
    section = {
        "allowed_users": [str(ANN)],
        "poll_timeout": 1,
        "stream_edits": False,
        "min_send_interval": 0,
        "accounts": {
            "family": account(family, FAMILY_TOKEN),
            "work": account(work, WORK_TOKEN),
        },
    }
    extra = {
        "api": {"host": "127.0.0.1", "port": port, "key": KEY},
        "llm": {
            "base_url": llm.base_url,
            "api_key": "k",
            "memory_pass": False,
            "model": "default-model",
        },
        "profiles": {
            "family": {"soul": FAMILY_SOUL, "llm": {"model": "family-model"}},
            "work": {
                "soul": WORK_SOUL,
                "llm": {"model": "work-model"},
                "home": f"telegram:work:{ANN}",
            },
        },
        "bindings": [
            {"profile": "family", "platform": "telegram", "account": "family"},
            {"profile": "work", "platform": "telegram", "account": "work"},
        ],
    }
    async with (
        running_daemon(tmp_path, llm, "telegram", section, port=port, extra=extra) as herald,
        httpx.AsyncClient(
            base_url=herald.url,
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=10.0,
            trust_env=False,
        ) as api,
    ):
        yield herald, api


@pytest.fixture
async def bots() -> AsyncIterator[tuple[FakeTelegramServer, FakeTelegramServer]]:
    async with (
        FakeTelegramServer(FAMILY_TOKEN, bot_username="family_bot") as family,
        FakeTelegramServer(WORK_TOKEN, bot_username="work_bot") as work,
    ):
        yield family, work


async def test_two_bots_answer_as_their_profiles_and_keep_their_memories_apart(
    tmp_path: Path, bots: tuple[FakeTelegramServer, FakeTelegramServer]
) -> None:
    family, work = bots
    async with FakeLLM() as llm, two_bots_two_profiles(tmp_path, llm, family, work):
        family.inject_message(ANN, "hello family bot", sender_id=ANN)
        work.inject_message(ANN, "hello work bot", sender_id=ANN)
        await family.wait_for_sent(1)
        await work.wait_for_sent(1)
        to_family, to_work = asked(llm, "hello family bot"), asked(llm, "hello work bot")
        assert to_family["model"] == "family-model"
        assert FAMILY_SOUL in system(to_family)
        assert WORK_SOUL not in system(to_family)
        assert to_work["model"] == "work-model"
        assert WORK_SOUL in system(to_work)
        assert FAMILY_SOUL not in system(to_work)

        # Ann tells the work bot something to remember …
        llm.script(
            Reply(
                tool_calls=[
                    ("memory", {"action": "add", "target": "user", "content": "ships on Fridays"})
                ]
            ),
            Reply("noted"),
        )
        work.inject_message(ANN, "remember: we ship on Fridays", sender_id=ANN)
        await work.wait_for_sent(2)
        # … which the work profile reads back in her next conversation (memory is read at a
        # session's start), and the family profile never sees.
        for bot, sent in ((work, 3), (family, 2)):
            bot.inject_message(ANN, "/new", sender_id=ANN)
            await bot.wait_for_sent(sent)
        work.inject_message(ANN, "what about Friday, work?", sender_id=ANN)
        family.inject_message(ANN, "what about Friday, family?", sender_id=ANN)
        await work.wait_for_sent(4)
        await family.wait_for_sent(3)
        assert "ships on Fridays" in system(asked(llm, "what about Friday, work?"))
        assert "ships on Fridays" not in system(asked(llm, "what about Friday, family?"))


async def test_one_bots_429_never_delays_the_other_profiles_bot(
    tmp_path: Path, bots: tuple[FakeTelegramServer, FakeTelegramServer]
) -> None:
    family, work = bots
    family.rate_limit(ANN, count=5, retry_after=60)
    async with FakeLLM() as llm, two_bots_two_profiles(tmp_path, llm, family, work):
        family.inject_message(ANN, "first, to family", sender_id=ANN)
        await family.wait_for(lambda: family.calls_rate_limited > 0, WAIT)
        work.inject_message(ANN, "then, to work", sender_id=ANN)
        [reply] = await work.wait_for_sent(1, timeout=WAIT)
        assert reply.plain_text == "You said: then, to work"
        assert asked(llm, "then, to work")["model"] == "work-model"
        assert family.sent == []  # still waiting out its retry_after


async def test_a_job_of_work_reports_to_works_home_through_the_work_bot(
    tmp_path: Path, bots: tuple[FakeTelegramServer, FakeTelegramServer]
) -> None:
    family, work = bots
    async with FakeLLM() as llm, two_bots_two_profiles(tmp_path, llm, family, work) as (_, api):
        made = await api.post(
            "/api/jobs",
            json={
                "prompt": "the weekly work report",
                "schedule": "every 30m",
                "targets": ["home"],
                "profile": "work",
            },
        )
        assert made.status_code == 201, made.text
        run = await api.post(f"/api/jobs/{made.json()['id']}/run")
        assert run.status_code == 202, run.text
        [report] = await work.wait_for_sent(1, timeout=WAIT)
        assert "the weekly work report" in report.plain_text
        job_run = asked(llm, "the weekly work report")
        assert job_run["model"] == "work-model"
        assert WORK_SOUL in system(job_run)
        assert family.sent == []
