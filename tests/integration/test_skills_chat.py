"""Skills in chat, through the whole daemon in-process (Telegram at its fake, the fake LLM
scripting tool calls): the command menu, /skills, /<skill> text, and the background review
saving a skill off the chat's path and stopping at the person's next message."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_core.memory import person
from agent_core.skills.review import REVIEW_MARKER
from gateway.contracts.ids import UserId
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.telegram import FakeTelegramServer
from tests.integration.inproc import running_daemon
from tests.integration.telegram_rig import ANN, BOB, BOT_USERNAME, TOKEN
from tests.unit.skills.helpers import skill_text

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer(TOKEN, bot_username=BOT_USERNAME) as server:
        yield server


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as server:
        yield server


def section(tg: FakeTelegramServer) -> dict[str, Any]:
    return {
        "token": TOKEN,
        "base_url": tg.base_url,
        "base_file_url": tg.base_file_url,
        "allowed_users": [str(ANN), str(BOB)],
        "poll_timeout": 1,
        "stream_edits": False,
        "min_send_interval": 0,
        "min_edit_interval": 0.2,
    }


def system_of(body: dict[str, Any]) -> str:
    return str(body["messages"][0]["content"])


def last_user(body: dict[str, Any]) -> str:
    users = [m for m in body["messages"] if m["role"] == "user"]
    return str(users[-1]["content"])


async def test_menu_list_and_skill_command(
    tmp_path: Path, tg: FakeTelegramServer, llm: FakeLLM
) -> None:
    async with running_daemon(tmp_path, llm, "telegram", section(tg)) as herald:
        commands = {c["command"]: c["description"] for c in tg.commands}
        assert {"new", "stop", "skills", "help"} <= set(commands)
        assert "daily_briefing" in commands  # a bundled skill, hyphen made underscore

        tg.inject_message(ANN, "/skills", sender_id=ANN)
        listed = await tg.wait_for_sent(lambda s: s.chat_id == ANN and "Skills (" in s.text)
        assert "/daily-briefing" in listed[0].text

        llm.script(Reply(text="Your briefing is set for 7:00."))
        tg.inject_message(ANN, "/daily_briefing at 7 with Lisbon weather", sender_id=ANN)
        await tg.wait_for_sent(lambda s: s.chat_id == ANN and "7:00" in s.text)
        body = llm.requests[-1]
        message = last_user(body)
        assert '<skill name="daily-briefing">' in message
        assert "schedule_job" in message
        assert message.endswith("at 7 with Lisbon weather")
        # The system prompt has the index only, not the skill's text.
        assert "- daily-briefing:" in system_of(body)
        assert "schedule_job` (action `create`)" not in system_of(body)

        # An HTTP API session turn (what `herald chat` sends) expands it the same way.
        async with httpx.AsyncClient(timeout=10.0, trust_env=False) as client:
            asked = {
                "model": "herald",
                "messages": [{"role": "user", "content": "/summarize-thread this one"}],
                "user": "u1",
            }
            response = await client.post(f"{herald.url}/v1/chat/completions", json=asked)
        assert response.status_code == 200, response.text
        assert '<skill name="summarize-thread">' in last_user(llm.requests[-1])


async def test_the_review_saves_a_skill_and_stops_at_the_next_message(
    tmp_path: Path, tg: FakeTelegramServer, llm: FakeLLM
) -> None:
    extra = {"skills": {"review_after_tool_calls": 3, "bundled": False}}
    async with running_daemon(tmp_path, llm, "telegram", section(tg), extra=extra) as herald:
        content = skill_text("find-cheap-flights", "Find cheap flights for a route.", "1. Go.")
        llm.script(
            Reply(tool_calls=[("skills_list", {})] * 3),
            Reply(text="Cheapest is TAP at 89 EUR."),
            # The review, after the reply is out:
            Reply(
                tool_calls=[
                    (
                        "skill_manage",
                        {"action": "create", "name": "find-cheap-flights", "content": content},
                    )
                ]
            ),
            Reply(text="saved"),
        )
        tg.inject_message(ANN, "find me a cheap flight to Lisbon", sender_id=ANN)
        await tg.wait_for_sent(lambda s: s.chat_id == ANN and "89 EUR" in s.text)
        requests = await llm.wait_for_requests(4)
        assert REVIEW_MARKER in system_of(requests[2])
        assert "find me a cheap flight" in last_user(requests[2])
        ann = await herald.store.resolve_user("telegram", str(ANN))
        saved = (
            herald.config.state_dir
            / "memory"
            / person(UserId(ann))
            / "skills"
            / "find-cheap-flights"
            / "SKILL.md"
        )
        await herald.until(saved.is_file)

        # Bob never sees Ann's skill; and `skills.bundled: false` installed none of Herald's.
        tg.inject_message(BOB, "/skills", sender_id=BOB)
        bobs = await tg.wait_for_sent(lambda s: s.chat_id == BOB)
        assert "find-cheap-flights" not in bobs[0].text
        assert "daily-briefing" not in bobs[0].text
        shared = herald.config.state_dir / "skills"
        assert not (shared / "daily-briefing").exists()
        assert not (shared / ".bundled.json").exists()

        # A second long turn; its review hangs until Ann writes again, which cancels it.
        llm.script(
            Reply(tool_calls=[("skills_list", {})] * 3),
            Reply(text="Porto is 45 EUR."),
            Reply(hang=True),
        )
        tg.inject_message(ANN, "and to Porto?", sender_id=ANN)
        await tg.wait_for_sent(lambda s: s.chat_id == ANN and "45 EUR" in s.text)
        await herald.until(lambda: REVIEW_MARKER in system_of(llm.requests[-1]))
        # It is shown the skill it wrote before, to patch rather than duplicate.
        assert "- find-cheap-flights: Find cheap flights" in last_user(llm.requests[-1])
        tg.inject_message(ANN, "thanks", sender_id=ANN)
        await tg.wait_for_sent(lambda s: s.chat_id == ANN and "You said: thanks" in s.text)
        await herald.until(lambda: llm.abandoned >= 1)
