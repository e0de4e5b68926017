"""Who may do what, through Telegram: groups keep their memories apart, and only an operator
chooses where the scheduled reports go (the daemon in-process, the fake Bot API, the fake
LLM scripting the agent's tool calls)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.cron.targets import HOME_SETTING
from gateway.store.memory_docs import SqlMemoryDocs
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.telegram import FakeTelegramServer
from tests.integration.inproc import running_daemon
from tests.integration.telegram_rig import ANN, BOB, BOT_USERNAME, TOKEN, running_herald

pytestmark = pytest.mark.timeout(90)

GROUP_A = -1001111111111
GROUP_B = -1002222222222


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer(TOKEN, bot_username=BOT_USERNAME) as server:
        yield server


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as server:
        yield server


def in_group(**extra: Any) -> dict[str, Any]:
    return {"chat_type": "supergroup", "sender_id": BOB, "sender_name": "Bob", **extra}


def prompt_text(body: dict[str, Any]) -> str:
    return json.dumps(body["messages"])


async def test_a_groups_memory_never_reaches_another_group(
    tmp_path: Path, tg: FakeTelegramServer, llm: FakeLLM
) -> None:
    async with running_herald(tmp_path, tg, llm, group_sessions="chat") as herald:
        llm.script(
            Reply(
                tool_calls=[
                    ("memory", {"action": "add", "target": "user", "content": "Carol: asthma"})
                ]
            ),
            Reply(text="Noted."),
        )
        tg.inject_message(GROUP_A, f"@{BOT_USERNAME} remember Carol has asthma", **in_group())
        await tg.wait_for_sent(lambda s: s.chat_id == GROUP_A)
        owners = await SqlMemoryDocs(herald.store).owners()
        assert len(owners) == 1, owners
        assert owners[0].startswith("g-"), "the group's own scope, no shared one"

        tg.inject_message(GROUP_B, f"@{BOT_USERNAME} who has asthma?", **in_group())
        await tg.wait_for_sent(lambda s: s.chat_id == GROUP_B)
        asked_b = llm.requests[-1]
        assert "who has asthma" in prompt_text(asked_b)
        assert "Carol: asthma" not in prompt_text(asked_b)

        # Ann's own direct chat never sees the group's memory either.
        tg.inject_message(ANN, "what do you know?", sender_id=ANN)
        await tg.wait_for_sent(lambda s: s.chat_id == ANN)
        assert "Carol: asthma" not in prompt_text(llm.requests[-1])

        # Group A's next conversation starts with what group A saved.
        tg.inject_message(GROUP_A, "/new", **in_group())
        await tg.wait_for_sent(lambda s: s.chat_id == GROUP_A and "new conversation" in s.text)
        tg.inject_message(GROUP_A, f"@{BOT_USERNAME} who has asthma?", **in_group())
        await tg.wait_for_sent(lambda s: s.chat_id == GROUP_A and "who has asthma" in s.plain_text)
        assert "Carol: asthma" in prompt_text(llm.requests[-1])


async def test_only_an_operator_sets_the_home_channel(
    tmp_path: Path, tg: FakeTelegramServer, llm: FakeLLM
) -> None:
    async with running_herald(tmp_path, tg, llm) as herald:
        # BOB is allowed to talk to the agent but does not operate it.
        tg.inject_message(BOB, "/sethome", sender_id=BOB)
        [refused] = await tg.wait_for_sent(lambda s: s.chat_id == BOB)
        assert "Only Herald's operator" in refused.plain_text
        tg.inject_message(GROUP_A, f"/sethome@{BOT_USERNAME}", **in_group())
        await tg.wait_for_sent(lambda s: s.chat_id == GROUP_A)
        assert await herald.store.get_setting(HOME_SETTING) is None
        rows = await herald.answered(2)
        assert {r["outcome"] for r in rows} == {"rejected"}


async def test_an_operator_listed_in_access_operators_sets_it(
    tmp_path: Path, tg: FakeTelegramServer, llm: FakeLLM
) -> None:
    section = {
        "token": TOKEN,
        "base_url": tg.base_url,
        "base_file_url": tg.base_file_url,
        "allowed_users": [str(ANN), str(BOB)],
        "poll_timeout": 1,
        "stream_edits": False,
        "min_send_interval": 0,
    }
    extra = {"access": {"operators": [f"telegram:{ANN}"]}}
    async with running_daemon(tmp_path, llm, "telegram", section, extra=extra) as herald:
        tg.inject_message(ANN, "/sethome", sender_id=ANN)
        [done] = await tg.wait_for_sent(lambda s: s.chat_id == ANN)
        assert "Scheduled reports will come to this chat" in done.plain_text
        assert await herald.store.get_setting(HOME_SETTING) == f"telegram:{ANN}"
