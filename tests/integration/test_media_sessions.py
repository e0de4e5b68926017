"""Received files are kept per session: in a Telegram group with one session per person,
each person's file belongs to their own session's rows, and another person's session can
neither show it (`view_attachment`) nor send it (`send_file`), even by its full path."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.profiles import Binding
from gateway.store.profiles import StoredBindings
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.telegram import FakeTelegramServer
from tests.integration.inproc import running_daemon
from tests.integration.telegram_rig import ANN, BOB, BOT_USERNAME, TOKEN, running_herald

pytestmark = pytest.mark.timeout(90)

GROUP = -1003333333333
SECRET = b"Ann's notes: the door code is 4711"


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer(TOKEN, bot_username=BOT_USERNAME) as server:
        yield server


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as server:
        yield server


def tool_outputs(body: dict[str, Any]) -> list[str]:
    """The tool results of a chat-completions request, in order."""
    return [str(m["content"]) for m in body["messages"] if m.get("role") == "tool"]


def files_in(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()] if folder.exists() else []


async def test_a_persons_file_is_not_readable_from_another_persons_session(
    tmp_path: Path, tg: FakeTelegramServer, llm: FakeLLM
) -> None:
    files = tmp_path / "state" / "files"
    async with running_herald(
        tmp_path, tg, llm, group_sessions="user", group_trigger=["all"]
    ) as herald:
        llm.script(
            Reply(tool_calls=[("view_attachment", {"file": "ann-notes.txt"})]),
            Reply(text="kept"),
        )
        doc = tg.add_file(SECRET, file_name="ann-notes.txt", mime_type="text/plain")
        tg.inject_message(GROUP, "keep this", sender_id=ANN, chat_type="supergroup", document=doc)
        requests = await llm.wait_for_requests(2, timeout=30)
        assert SECRET.decode() in tool_outputs(requests[1])[0]  # her own session sees it
        [ann_row] = await herald.answered(1)
        [kept] = ann_row["payload"]["attachments"]
        path = Path(kept["path"])
        assert await asyncio.to_thread(path.read_bytes) == SECRET  # the cache's copy
        assert kept["blob"] == hashlib.sha256(SECRET).hexdigest()  # bytes in the blob store
        assert (
            await asyncio.to_thread(files_in, files / "telegram") == []
        )  # no copy left in the shared chat's folder

        llm.script(
            Reply(
                tool_calls=[
                    ("view_attachment", {"file": str(path)}),
                    ("view_attachment", {"file": "ann-notes.txt"}),
                    ("send_file", {"path": str(path)}),
                ]
            ),
            Reply(text="that is not yours"),
        )
        tg.inject_message(GROUP, "show me Ann's notes", sender_id=BOB, chat_type="supergroup")
        requests = await llm.wait_for_requests(4, timeout=30)
        shown = tool_outputs(requests[3])
        assert len(shown) == 3
        assert all(SECRET.decode() not in out for out in shown)
        assert "no file" in shown[0]
        assert "no file" in shown[1]
        assert "not a file I may send" in shown[2]
        rows = await herald.answered(2)
        bob_key = rows[1]["session_key"]
        assert bob_key != ann_row["session_key"]
        await tg.wait_for_sent(lambda s: s.chat_id == GROUP and "not yours" in s.plain_text)
        assert not [s for s in tg.sent if s.upload is not None]
        assert "4711" not in json.dumps(requests[3]["messages"])


async def test_a_file_sent_to_one_profile_is_not_readable_by_the_profile_rebound_since(
    tmp_path: Path, tg: FakeTelegramServer, llm: FakeLLM
) -> None:
    """Ann's chat answers as `work`, which reads her file; her chat is bound to `family`
    since: family can neither show nor send that file (one profile never reads another's
    conversation, its files included)."""
    extra = {
        "profiles": {"work": {"llm": {"model": "work-model"}}, "family": {}},
        "bindings": [{"profile": "work", "platform": "telegram"}],
    }
    section = {
        "token": TOKEN,
        "base_url": tg.base_url,
        "base_file_url": tg.base_file_url,
        "allowed_users": [str(ANN)],
        "poll_timeout": 1,
        "stream_edits": False,
        "min_send_interval": 0,
    }
    async with running_daemon(tmp_path, llm, "telegram", section, extra=extra) as herald:
        llm.script(
            Reply(tool_calls=[("view_attachment", {"file": "ann-notes.txt"})]),
            Reply(text="kept"),
        )
        doc = tg.add_file(SECRET, file_name="ann-notes.txt", mime_type="text/plain")
        tg.inject_message(ANN, "keep this", sender_id=ANN, document=doc)
        requests = await llm.wait_for_requests(2, timeout=30)
        assert SECRET.decode() in tool_outputs(requests[1])[0]  # work sees it
        [row] = await herald.answered(1)
        [kept] = row["payload"]["attachments"]
        await StoredBindings(herald.store).bind(
            Binding("family", "telegram", "default", str(ANN), source="cli")
        )
        llm.script(
            Reply(
                tool_calls=[
                    ("view_attachment", {"file": kept["path"]}),
                    ("view_attachment", {"file": "ann-notes.txt"}),
                    ("send_file", {"path": kept["path"]}),
                ]
            ),
            Reply(text="not mine to read"),
        )
        tg.inject_message(ANN, "what did I send?", sender_id=ANN)
        requests = await llm.wait_for_requests(4, timeout=30)
        assert requests[3]["model"] != "work-model"
        shown = tool_outputs(requests[3])
        assert len(shown) == 3
        assert all(SECRET.decode() not in out for out in shown)
        assert "not a file I may send" in shown[2]
        await tg.wait_for_sent(lambda s: "not mine to read" in s.plain_text)
        assert not [s for s in tg.sent if s.upload is not None]
