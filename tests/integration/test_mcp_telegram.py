"""Approval on Telegram: the question comes with inline Approve / Deny buttons, and a press is
the presser's own /approve (another person's press is refused like their /approve)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.llm import FakeLLM, Reply, last_user_text, you_said
from tests.fakes.telegram import FakeTelegramServer
from tests.integration.inproc import running_daemon
from tests.integration.mcp_rig import SERVER_SCRIPT, until
from tests.integration.telegram_rig import ANN, BOB, TOKEN

pytestmark = pytest.mark.timeout(90)

GROUP = -100123


def responder(body: dict[str, Any]) -> Reply:
    """Asks for `t__pid` on "run pid"; answers with the tool's result once it has one."""
    results = [m for m in body.get("messages", []) if m.get("role") == "tool"]
    if results:
        return Reply(text=f"done: {results[-1]['content']}")
    if last_user_text(body).endswith("run pid"):
        return Reply(tool_calls=[("t__pid", {})])
    return you_said(body)


def press(tg: FakeTelegramServer, query_id: str, who: int, message_id: int, data: str) -> None:
    tg.inject_update(
        {
            "callback_query": {
                "id": query_id,
                "from": {"id": who, "is_bot": False, "first_name": f"user{who}"},
                "chat_instance": "ci",
                "data": data,
                "message": {
                    "message_id": message_id,
                    "date": int(time.time()),
                    "chat": {"id": GROUP, "type": "group", "title": "team"},
                    "text": "Approval needed",
                },
            }
        }
    )


async def test_approval_buttons_on_telegram(tmp_path: Path) -> None:
    section = {
        "token": TOKEN,
        "allowed_users": [str(ANN), str(BOB)],
        "poll_timeout": 1,
        "stream_edits": False,
        "min_send_interval": 0,
        "group_trigger": ["all"],
    }
    mcp = {
        "servers": {
            "t": {"command": sys.executable, "args": ["-P", SERVER_SCRIPT], "approval": "always"}
        }
    }
    async with FakeTelegramServer(TOKEN, bot_username="herald_bot") as tg, FakeLLM() as llm:
        llm.responder = responder
        section["base_url"] = tg.base_url
        section["base_file_url"] = tg.base_file_url
        async with running_daemon(tmp_path, llm, "telegram", section, extra={"mcp": mcp}) as herald:

            async def ready() -> bool:
                async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
                    health = (await client.get(f"{herald.url}/health")).json()
                return bool(health["mcp"]["t"]["state"] == "ready")

            await until(ready, 30)
            tg.inject_message(GROUP, "run pid", sender_id=ANN, chat_type="group")
            [question] = await tg.wait_for_sent(lambda s: "Approval needed" in s.plain_text, 30)
            [row] = question.reply_markup["inline_keyboard"]  # type: ignore[index]
            assert [(b["text"], b["callback_data"]) for b in row] == [
                ("✅ Approve", "/approve 1"),
                ("❌ Deny", "/deny 1"),
            ]
            press(tg, "q-bob", BOB, question.message_id, "/approve 1")
            await tg.wait_for_sent(lambda s: "Only the person who asked" in s.plain_text, 30)
            press(tg, "q-ann", ANN, question.message_id, "/approve 1")
            [done] = await tg.wait_for_sent(lambda s: s.plain_text.startswith("done:"), 30)
            assert f"[approved by telegram:{ANN}]" in done.plain_text
            await until(lambda: {"q-bob", "q-ann"} <= set(tg.answered_queries))
