"""Hostile payloads through the running daemon: each is refused or normalised, and the
message after it is answered (a payload Herald cannot store must not hold up the platform's
queue of updates behind it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.chat_server import FakeChatServer
from tests.fakes.llm import FakeLLM
from tests.fakes.telegram import FakeTelegramServer
from tests.integration.inproc import running_daemon
from tests.integration.telegram_rig import ANN, running_herald

pytestmark = pytest.mark.timeout(90)

TOKEN = "4242:hostile"

HOSTILE_TEXTS = [
    "lone \ud800 surrogate",
    "nul \x00 and \x1b[31m escapes \x7f",
    "x" * 300_000,
    "\u202e\u200b\ufeff bidi and zero width",
]
"""Texts a platform may well deliver (JSON allows a lone surrogate escape)."""


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as server:
        yield server


def deep(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"a": [value]}
    return value


async def test_loopback_hostile_updates_never_block_the_next(tmp_path: Path, llm: FakeLLM) -> None:
    async with FakeChatServer(TOKEN) as chat:
        section = {
            "url": chat.base_url,
            "token": TOKEN,
            "allowed_users": ["*"],
            "stream_edits": False,
            "poll_timeout": 1,
        }
        async with running_daemon(tmp_path, llm, "test", section) as herald:
            junk: list[Any] = [
                None,
                [],
                "text",
                deep(400),
                {"message_id": {"x": 1}, "chat": {"id": "c"}, "text": "wrong types"},
                {"message_id": "h1", "chat": {"id": "c", "type": "private"}, "text": 5},
            ]
            for payload in junk:
                chat.inject_raw(payload)
            for n, text in enumerate(HOSTILE_TEXTS):
                chat.inject("u1", text, sender_id="u1", sender_name=f"\ud800{n}\x00")
            chat.inject("u2", "after the junk", sender_id="u2")
            await chat.wait_for_sent(lambda s: s.chat_id == "u2", timeout=30)
            await chat.wait_until_acknowledged(timeout=30)
            rows = await herald.answered(len(HOSTILE_TEXTS) + 1)
            assert {r["outcome"] for r in rows} == {"answered"}
            stored = {r["text"] for r in rows}
            assert "after the junk" in stored
            assert "lone \ufffd surrogate" in stored  # normalised, not refused
            assert len(rows) == len(HOSTILE_TEXTS) + 1


async def test_telegram_hostile_updates_never_block_the_next(tmp_path: Path, llm: FakeLLM) -> None:
    async with (
        FakeTelegramServer("123456:hostile") as tg,
        running_herald(tmp_path, tg, llm, token="123456:hostile") as herald,
    ):
        tg.inject_update({"update_id": 10_000, "message": deep(150)})
        tg.inject_update({"update_id": 10_001, "message": {"chat": "nope", "text": ["x"]}})
        for text in HOSTILE_TEXTS:
            tg.inject_message(ANN, text, sender_id=ANN, sender_name="Ann \ud800")
        last = tg.inject_message(ANN, "after the junk", sender_id=ANN)
        await tg.wait_for_sent(lambda s: s.plain_text == "You said: after the junk", timeout=30)
        await tg.wait_until_confirmed(last.update_id)
        rows = await herald.answered(len(HOSTILE_TEXTS) + 1)
        assert {r["outcome"] for r in rows} == {"answered"}
        assert "lone \ufffd surrogate" in {r["text"] for r in rows}
