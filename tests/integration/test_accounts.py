"""Several accounts of one platform in one Herald: two Telegram bots (two tokens, each on a
fake Bot API of its own, as two bots are two queues of updates on Telegram) answer their own
chats with their own session keys, access lists, busy modes, rate limits and targets."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.access import Pairings
from tests.fakes.llm import FakeLLM
from tests.fakes.telegram import FakeTelegramServer
from tests.integration.inproc import Herald, running_daemon
from tests.integration.telegram_rig import ANN, BOB, TOKEN, running_herald

pytestmark = pytest.mark.timeout(90)

FAMILY_TOKEN = "111111:family-bot-token"
CAROL = 333333333
WORK_TOKEN = "222222:work-bot-token"


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as server:
        yield server


@pytest.fixture
async def bots() -> AsyncIterator[tuple[FakeTelegramServer, FakeTelegramServer]]:
    async with (
        FakeTelegramServer(FAMILY_TOKEN, bot_username="family_bot") as family,
        FakeTelegramServer(WORK_TOKEN, bot_username="work_bot") as work,
    ):
        yield family, work


def account(tg: FakeTelegramServer, token: str, **more: Any) -> dict[str, Any]:
    return {
        "token": token,
        "base_url": tg.base_url,
        "base_file_url": tg.base_file_url,
        **more,
    }


@contextlib.asynccontextmanager
async def two_bots(
    tmp_path: Path,
    llm: FakeLLM,
    bots: tuple[FakeTelegramServer, FakeTelegramServer],
    *,
    family: dict[str, Any] | None = None,
    work: dict[str, Any] | None = None,
) -> AsyncIterator[Herald]:
    """Herald with `telegram.accounts` family and work; Ann is allowed on both (a default
    written beside `accounts`) unless an account says otherwise."""
    section = {
        "allowed_users": [str(ANN)],
        "poll_timeout": 1,
        "stream_edits": False,
        "min_send_interval": 0,
        "accounts": {
            "family": account(bots[0], FAMILY_TOKEN, **(family or {})),
            "work": account(bots[1], WORK_TOKEN, **(work or {})),
        },
    }
    async with running_daemon(tmp_path, llm, "telegram", section) as herald:
        yield herald


def api(herald: Herald) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=herald.url, timeout=10, trust_env=False)


async def test_each_account_answers_its_own_chats_with_its_own_session_keys(
    tmp_path: Path, llm: FakeLLM, bots: tuple[FakeTelegramServer, FakeTelegramServer]
) -> None:
    family, work = bots
    async with two_bots(tmp_path, llm, bots) as herald:
        family.inject_message(ANN, "to the family bot", sender_id=ANN)
        work.inject_message(ANN, "to the work bot", sender_id=ANN)
        [home_reply] = await family.wait_for_sent(1)
        [work_reply] = await work.wait_for_sent(1)
        assert home_reply.plain_text == "You said: to the family bot"
        assert work_reply.plain_text == "You said: to the work bot"
        rows = await herald.answered(2)
        assert sorted((r["account"], r["session_key"]) for r in rows) == [
            ("family", f"telegram:family:{ANN}"),
            ("work", f"telegram:work:{ANN}"),
        ]
        async with api(herald) as client:
            health = (await client.get("/health")).json()
            console = await client.get("/console")
        assert console.status_code == 200
        assert "telegram:family" in console.text
        assert "telegram:work" in console.text
        assert health["adapters"] == {"telegram:family": "receiving", "telegram:work": "receiving"}
        leases = herald.supervisor.receiver_leases
        assert {key: lease.name for key, lease in leases.items()} == {
            ("telegram", "family"): "adapter:telegram:family",
            ("telegram", "work"): "adapter:telegram:work",
        }
        registry = herald.supervisor.metrics.registry
        for name in ("family", "work"):
            labels = {"platform": "telegram", "account": name}
            assert registry.get_sample_value("herald_inbound_messages_total", labels) == 1


async def test_a_429_on_one_account_never_delays_the_other(
    tmp_path: Path, llm: FakeLLM, bots: tuple[FakeTelegramServer, FakeTelegramServer]
) -> None:
    """Ann's chat has the same id on both bots; the family bot is told to wait a long
    minute there, and the work bot answers her in the same chat id meanwhile."""
    family, work = bots
    family.rate_limit(ANN, count=5, retry_after=60)
    async with two_bots(tmp_path, llm, bots):
        family.inject_message(ANN, "first, to family", sender_id=ANN)
        await family.wait_for(lambda: family.calls_rate_limited > 0, 20)
        work.inject_message(ANN, "then, to work", sender_id=ANN)
        [reply] = await work.wait_for_sent(1, timeout=20)
        assert reply.plain_text == "You said: then, to work"
        assert family.sent == []  # still waiting out its retry_after


async def test_access_lists_and_busy_modes_are_per_account(
    tmp_path: Path, llm: FakeLLM, bots: tuple[FakeTelegramServer, FakeTelegramServer]
) -> None:
    family, work = bots
    work_keys = {"allowed_users": [str(BOB)], "busy_mode": "collect"}
    async with two_bots(tmp_path, llm, bots, work=work_keys) as herald:
        work.inject_message(BOB, "hi work", sender_id=BOB)
        [answered] = await work.wait_for_sent(1)
        assert answered.plain_text == "You said: hi work"
        family.inject_message(BOB, "hi family", sender_id=BOB)
        [refused] = await family.wait_for_sent(1)
        assert "pairing code" in refused.plain_text  # Bob is a stranger to the family bot
        work.inject_message(ANN, "hi work", sender_id=ANN)  # Ann: not on work's own list
        [pairing] = await work.wait_for_sent(lambda s: s.chat_id == ANN)
        assert "pairing code" in pairing.plain_text
        family.inject_message(ANN, "/status", sender_id=ANN)
        work.inject_message(BOB, "/status", sender_id=BOB)
        [family_status] = await family.wait_for_sent(lambda s: "Busy mode" in s.plain_text)
        [work_status] = await work.wait_for_sent(lambda s: "Busy mode" in s.plain_text)
        assert "Busy mode: queue" in family_status.plain_text
        assert "Busy mode: collect" in work_status.plain_text
        outcomes = {
            (r["account"], r["sender_id"], r["text"]): r["outcome"]
            for r in await herald.answered(5)
        }
        assert outcomes[("family", str(BOB), "hi family")] == "rejected"
        assert outcomes[("work", str(BOB), "hi work")] == "answered"

        # A pairing approved on the family bot lets Bob in there, not on a bot he never
        # asked (the work bot lets him in by its own list; Carol shows the rule).
        code = re.search(r"code is ([A-Z0-9]{8})", refused.plain_text)
        assert code is not None
        await Pairings(herald.store).approve(code[1])
        family.inject_message(BOB, "me again", sender_id=BOB)
        await family.wait_for_sent(lambda s: s.plain_text == "You said: me again")
        family.inject_message(CAROL, "hello", sender_id=CAROL)
        [carols] = await family.wait_for_sent(lambda s: s.chat_id == CAROL)
        carol_code = re.search(r"code is ([A-Z0-9]{8})", carols.plain_text)
        assert carol_code is not None
        await Pairings(herald.store).approve(carol_code[1])
        work.inject_message(CAROL, "and here?", sender_id=CAROL)
        [elsewhere] = await work.wait_for_sent(lambda s: s.chat_id == CAROL)
        assert "pairing code" in elsewhere.plain_text


async def test_a_target_naming_an_account_delivers_through_it(
    tmp_path: Path, llm: FakeLLM, bots: tuple[FakeTelegramServer, FakeTelegramServer]
) -> None:
    family, work = bots
    async with two_bots(tmp_path, llm, bots) as herald, api(herald) as client:
        made = await client.post(
            "/api/jobs",
            json={"prompt": "report", "schedule": "every 1h", "targets": [f"telegram:work:{ANN}"]},
        )
        assert made.status_code == 201, made.text
        assert made.json()["targets"] == [f"telegram:work:{ANN}"]
        run = await client.post(f"/api/jobs/{made.json()['id']}/run")
        assert run.status_code == 202, run.text
        [report] = await work.wait_for_sent(1, timeout=20)
        assert "report" in report.plain_text
        assert family.sent == []
        unnamed = await client.post(
            "/api/jobs",
            json={"prompt": "r", "schedule": "every 1h", "targets": [f"telegram:{ANN}"]},
        )
        assert unnamed.status_code == 400
        assert "several accounts (family, work): name one" in unnamed.text


async def test_an_old_single_section_config_keeps_its_names(tmp_path: Path, llm: FakeLLM) -> None:
    """One `platforms.telegram` section, as before accounts: the adapter is `telegram`,
    its session keys, lease and targets are what they were."""
    async with (
        FakeTelegramServer(TOKEN, bot_username="herald_bot") as tg,
        running_herald(tmp_path, tg, llm) as herald,
    ):
        tg.inject_message(ANN, "hello", sender_id=ANN)
        await tg.wait_for_sent(1)
        [row] = await herald.answered(1)
        assert (row["account"], row["session_key"]) == ("default", f"telegram:default:{ANN}")
        assert list(herald.supervisor.adapter_states()) == ["telegram"]
        leases = herald.supervisor.receiver_leases
        assert {k: v.name for k, v in leases.items()} == {
            ("telegram", "default"): "adapter:telegram:default"
        }
        assert herald.config.platforms.accounts().keys() == {("telegram", "default")}


async def test_turning_one_account_off_keeps_the_others_name(
    tmp_path: Path, llm: FakeLLM, bots: tuple[FakeTelegramServer, FakeTelegramServer]
) -> None:
    """The work bot turned off: the family bot is still `telegram:family` (its webhook path
    `/webhooks/telegram:family` does not move to `/webhooks/telegram`)."""
    async with two_bots(tmp_path, llm, bots, work={"enabled": False}) as herald:
        assert list(herald.supervisor.adapter_states()) == ["telegram:family"]
        family, _ = bots
        family.inject_message(ANN, "hello", sender_id=ANN)
        await family.wait_for_sent(1)
