"""The whole daemon in-process, with Telegram pointed at the fake Bot API and a fake LLM."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from tests.fakes.llm import FakeLLM
from tests.fakes.telegram import FakeTelegramServer
from tests.integration.inproc import Herald, running_daemon

TOKEN = "123456:herald-test-token"
BOT_USERNAME = "herald_bot"
ANN = 111111111
"""An allowed user; her direct chat has the same id."""
BOB = 222222222
"""Another allowed user."""


@contextlib.asynccontextmanager
async def running_herald(
    tmp_path: Path,
    tg: FakeTelegramServer,
    llm: FakeLLM,
    *,
    wait_ready: bool = True,
    port: int | None = None,
    **telegram: Any,
) -> AsyncIterator[Herald]:
    """The daemon with Telegram at the fake (settings overridden by `telegram`)."""
    section: dict[str, Any] = {
        "token": TOKEN,
        "base_url": tg.base_url,
        "base_file_url": tg.base_file_url,
        "allowed_users": [str(ANN), str(BOB)],
        "poll_timeout": 1,
        "stream_edits": False,
        "min_send_interval": 0,
        "min_edit_interval": 0.2,
    }
    section.update(telegram)
    async with running_daemon(
        tmp_path, llm, "telegram", section, wait_ready=wait_ready, port=port
    ) as herald:
        yield herald
