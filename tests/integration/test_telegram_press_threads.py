"""A press of one of Herald's buttons goes to the session a message in the same place would
go to: python-telegram-bot unmodified against the fake Bot API, the session key derived as
the daemon derives it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

import adapters.telegram  # noqa: F401  (sets PTB_TIMEDELTA before python-telegram-bot is used)
from adapters.telegram.adapter import TelegramAdapter
from adapters.telegram.config import TelegramConfig
from gateway.contracts.config import GroupSessions
from gateway.sessions.keys import derive_session_key
from tests.fakes.sink import ListSink, receiving
from tests.fakes.telegram import FakeTelegramServer

pytestmark = pytest.mark.timeout(60)

TOKEN = "123456:press-test-token"
BOT_USERNAME = "herald_bot"
ANN = 111111111
GROUP = -1001234567890
FORUM = -1009876543210
THREAD = 4200


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer(TOKEN, bot_username=BOT_USERNAME) as server:
        yield server


@pytest.fixture
async def adapter(tg: FakeTelegramServer, tmp_path: Path) -> AsyncIterator[TelegramAdapter]:
    config = TelegramConfig.model_validate(
        {
            "token": SecretStr(TOKEN),
            "base_url": tg.base_url,
            "base_file_url": tg.base_file_url,
            "poll_timeout": 5.0,
            "min_send_interval": 0,
            "group_trigger": ["all"],
        }
    )
    async with TelegramAdapter(config, tmp_path / "files") as connected:
        yield connected


def press(tg: FakeTelegramServer, chat: int, *, topic: bool) -> None:
    """ANN presses /approve 1 under a bot message in thread THREAD of `chat`."""
    message: dict[str, Any] = {
        "message_id": 77,
        "date": int(time.time()),
        "chat": {"id": chat, "type": "supergroup", "title": "team", "is_forum": topic},
        "text": "Approval needed",
        "message_thread_id": THREAD,
    }
    if topic:
        message["is_topic_message"] = True
    tg.inject_update(
        {
            "callback_query": {
                "id": f"q{chat}",
                "from": {"id": ANN, "is_bot": False, "first_name": "Ann"},
                "chat_instance": "ci",
                "data": "/approve 1",
                "message": message,
            }
        }
    )


@pytest.mark.parametrize("forum", [False, True], ids=["reply-thread", "forum-topic"])
async def test_a_press_goes_where_a_message_in_its_thread_goes(
    tg: FakeTelegramServer, adapter: TelegramAdapter, forum: bool
) -> None:
    """In an ordinary group a reply thread is the group's session for messages; a press
    there is too (it was routed to a thread session nobody talks in). In a forum, both go
    to the topic's session."""
    chat = FORUM if forum else GROUP
    tg.inject_message(
        chat,
        "in the thread",
        sender_id=ANN,
        chat_type="supergroup",
        is_forum=forum,
        thread_id=THREAD,
    )
    press(tg, chat, topic=forum)
    sink = ListSink()
    async with receiving(adapter, sink):
        await sink.until(lambda: any(m.text == "/approve 1" for m in sink.messages))
    said = next(m for m in sink.messages if m.text == "in the thread")
    pressed = next(m for m in sink.messages if m.text == "/approve 1")
    assert pressed.thread_id == said.thread_id
    assert derive_session_key(pressed, GroupSessions.CHAT) == derive_session_key(
        said, GroupSessions.CHAT
    )
    assert (said.thread_id is not None) is forum
