"""The Telegram adapter in the running daemon, against the fake Bot API (python-telegram-bot
unmodified) and a fake LLM: what a person chatting with the bot sees."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.contracts.adapter import AdapterState
from tests.e2e.daemon import free_port
from tests.fakes.llm import FakeLLM, Reply, last_user_text
from tests.fakes.telegram import FakeTelegramServer, utf16_len
from tests.integration.telegram_rig import (
    ANN,
    BOB,
    BOT_USERNAME,
    TOKEN,
    running_herald,
)

pytestmark = pytest.mark.timeout(90)

GROUP = -1001234567890
FORUM = -1009876543210


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer(TOKEN, bot_username=BOT_USERNAME) as server:
        yield server


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as server:
        yield server


def to(chat: int) -> Any:
    return lambda s: s.chat_id == chat


async def test_direct_message_round_trip(
    tmp_path: Path, tg: FakeTelegramServer, llm: FakeLLM
) -> None:
    async with running_herald(tmp_path, tg, llm) as herald:
        asked = tg.inject_message(ANN, "hello **there**", sender_id=ANN, sender_name="Ann")
        [reply] = await tg.wait_for_sent(to(ANN))
        assert reply.plain_text == "You said: hello there"
        assert reply.parse_mode == "HTML"
        assert {"type": "bold", "offset": 16, "length": 5}.items() <= reply.entities[0].items()
        assert reply.reply_to_message_id is None  # direct chats are not quoted
        assert any(a.chat_id == ANN and a.action == "typing" for a in tg.actions)
        await tg.wait_until_confirmed(asked.update_id)
        rows = await herald.answered(1)
        assert [(r["platform_message_id"], r["outcome"]) for r in rows] == [
            (f"{ANN}:{asked.message_id}", "answered")
        ]
        assert rows[0]["session_key"] == f"telegram:default:{ANN}"


async def test_a_typing_indicator_in_flight_when_the_answer_is_ready_is_not_cut_off(
    tmp_path: Path, tg: FakeTelegramServer, llm: FakeLLM
) -> None:
    """The reply does not wait for a slow "typing…", and that request is let finish, not
    cancelled (a cancelled request can cost the connection pool a connection for good)."""
    tg.hold("sendChatAction")
    async with running_herald(tmp_path, tg, llm):
        tg.inject_message(ANN, "hello", sender_id=ANN)
        await tg.wait_for_sent(to(ANN))
        assert tg.calls_held == 1
        tg.hold("sendChatAction", False)
        await tg.wait_for(lambda: tg.calls_held == 0)
        assert tg.calls_abandoned == []
        assert [a.action for a in tg.actions if a.chat_id == ANN] == ["typing"]


async def test_groups_answer_mentions_replies_and_commands_only(
    tmp_path: Path, tg: FakeTelegramServer, llm: FakeLLM
) -> None:
    async with running_herald(tmp_path, tg, llm) as herald:
        kw: dict[str, Any] = {"chat_type": "supergroup", "sender_id": BOB, "sender_name": "Bob"}
        ignored = tg.inject_message(GROUP, "lunch, anyone?", **kw)
        other_bot = tg.inject_message(GROUP, "/start@other_bot", **kw)
        mention = tg.inject_message(GROUP, f"@{BOT_USERNAME} what time is it?", **kw)
        [first] = await tg.wait_for_sent(to(GROUP))
        assert first.plain_text == "You said: [Bob] what time is it?"
        assert first.reply_to_message_id == mention.message_id  # threaded to the question
        reply = tg.inject_message(GROUP, "and tomorrow?", reply_to=first.message_id, **kw)
        command = tg.inject_message(GROUP, f"/help@{BOT_USERNAME}", **kw)
        await tg.wait_for_sent(
            lambda s: s.chat_id == GROUP and s.reply_to_message_id == reply.message_id
        )
        await tg.wait_for_sent(lambda s: s.chat_id == GROUP and "/mode" in s.plain_text)
        await tg.wait_until_confirmed()
        rows = await herald.answered(3)
        stored = {r["platform_message_id"] for r in rows}
        assert stored == {f"{GROUP}:{m.message_id}" for m in (mention, reply, command)}
        assert f"{GROUP}:{ignored.message_id}" not in stored
        assert f"{GROUP}:{other_bot.message_id}" not in stored
        assert "replying to Herald" in last_user_text(llm.requests[-1])


async def test_forum_topics_are_separate_sessions(
    tmp_path: Path, tg: FakeTelegramServer, llm: FakeLLM
) -> None:
    async with running_herald(tmp_path, tg, llm) as herald:
        kw: dict[str, Any] = {"chat_type": "supergroup", "is_forum": True, "sender_id": ANN}
        tg.inject_message(FORUM, f"@{BOT_USERNAME} release?", thread_id=4200, **kw)
        tg.inject_message(FORUM, f"@{BOT_USERNAME} budget?", thread_id=4300, **kw)
        sent = await tg.wait_for_sent(lambda s: s.chat_id == FORUM and len(tg.sent) >= 2)
        await tg.wait_for(lambda: len([s for s in tg.sent if s.chat_id == FORUM]) == 2)
        by_thread = {s.message_thread_id: s.plain_text for s in tg.sent if s.chat_id == FORUM}
        assert by_thread == {
            4200: "You said: [User 111111111] release?",
            4300: "You said: [User 111111111] budget?",
        }
        assert sent
        rows = await herald.answered(2)
        assert sorted(r["session_key"] for r in rows) == [
            f"telegram:default:{FORUM}:4200",
            f"telegram:default:{FORUM}:4300",
        ]


def long_answer() -> str:
    paragraph = "Herald keeps **every** message 🎉 and _never_ drops one. " * 12
    code = "\n".join(f"    value_{i} = compute({i})  # step {i}" for i in range(40))
    parts = [paragraph.strip() for _ in range(6)]
    parts.insert(3, f"```python\n{code}\n```")
    parts += [f"- item {i} with `code` and a [link](https://example.org/{i})" for i in range(30)]
    text = "\n\n".join(parts)
    while len(text) < 10_000:
        text += "\n\n" + paragraph.strip()
    return text


async def test_a_10000_character_answer_is_split_and_formatted(
    tmp_path: Path, tg: FakeTelegramServer, llm: FakeLLM
) -> None:
    answer = long_answer()
    assert len(answer) >= 10_000
    llm.responder = lambda body: Reply(text=answer)
    async with running_herald(tmp_path, tg, llm):
        tg.inject_message(ANN, "tell me everything", sender_id=ANN)
        await tg.wait_for(lambda: sum(utf16_len(s.plain_text) for s in tg.sent) > 8_000)
        await tg.wait_for(lambda: "item 29" in "".join(s.plain_text for s in tg.sent))
        sent = [s for s in tg.sent if s.chat_id == ANN]
        assert len(sent) >= 3
        assert all(s.parse_mode == "HTML" for s in sent)
        assert all(utf16_len(s.plain_text) <= 4096 for s in sent)
        code_blocks = [e for s in sent for e in s.entities if e["type"] == "pre"]
        assert len(code_blocks) == 1  # the fence was kept whole, in one message
        [holder] = [s for s in sent if any(e["type"] == "pre" for e in s.entities)]
        assert "value_0 = compute(0)" in holder.plain_text
        assert "value_39 = compute(39)" in holder.plain_text
        assert any(e["type"] == "bold" for s in sent for e in s.entities)
        assert any(e.get("url") == "https://example.org/29" for s in sent for e in s.entities)


async def test_markup_refused_by_telegram_is_resent_as_plain_text(
    tmp_path: Path, tg: FakeTelegramServer, llm: FakeLLM
) -> None:
    async with running_herald(tmp_path, tg, llm):
        tg.reject_markup(1)
        tg.inject_message(ANN, "hello **there**", sender_id=ANN)
        [reply] = await tg.wait_for_sent(to(ANN))
        assert reply.parse_mode is None
        assert reply.plain_text == "You said: hello there"
        refused = [r for r in tg.rejected if r.method == "sendMessage"]
        assert [r.params.get("parse_mode") for r in refused] == ["HTML"]
        assert "can't parse entities" in refused[0].description


async def test_webhook_mode_checks_the_secret_and_answers(
    tmp_path: Path, tg: FakeTelegramServer, llm: FakeLLM
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/webhooks/telegram"
    secret = "s3cret-Token_1"
    async with running_herald(
        tmp_path, tg, llm, port=port, mode="webhook", webhook_url=url, webhook_secret=secret
    ) as herald:
        assert tg.webhook is not None
        assert (tg.webhook.url, tg.webhook.secret_token) == (url, secret)
        update = {
            "update_id": 9_000_001,
            "message": {
                "message_id": 900,
                "from": {"id": ANN, "is_bot": False, "first_name": "Mallory"},
                "chat": {"id": ANN, "type": "private"},
                "date": int(time.time()),
                "text": "forged",
            },
        }
        async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
            wrong = await client.post(
                url, json=update, headers={"X-Telegram-Bot-Api-Secret-Token": "guess"}
            )
            missing = await client.post(url, json=update)
            garbage = await client.post(
                url, content=b"{not json", headers={"X-Telegram-Bot-Api-Secret-Token": secret}
            )
        assert (wrong.status_code, missing.status_code, garbage.status_code) == (403, 403, 400)
        assert await herald.rows() == []

        asked = tg.inject_message(ANN, "via webhook", sender_id=ANN)
        [reply] = await tg.wait_for_sent(to(ANN))
        assert reply.plain_text == "You said: via webhook"
        await tg.wait_until_confirmed(asked.update_id)
        assert not [c for c in tg.calls if c.method == "getUpdates"]
        rows = await herald.answered(1)
        assert [r["text"] for r in rows] == ["via webhook"]


async def test_a_stalled_poll_is_restarted_and_ready_reflects_it(
    tmp_path: Path, tg: FakeTelegramServer, llm: FakeLLM
) -> None:
    async with running_herald(tmp_path, tg, llm) as herald:
        tg.stall_polls(1_000)
        await herald.until(lambda: herald.adapter_state() is not AdapterState.RECEIVING, 30)
        assert await herald.ready() == 503
        tg.clear_faults()
        await herald.until(lambda: herald.adapter_state() is AdapterState.RECEIVING, 30)
        await herald.until(lambda: herald.supervisor.runners["telegram"].restarts >= 1)
        tg.inject_message(ANN, "still there?", sender_id=ANN)
        [reply] = await tg.wait_for_sent(to(ANN), timeout=30)
        assert reply.plain_text == "You said: still there?"
        assert await herald.ready() == 200


async def test_messages_sent_while_down_are_answered_unless_too_old(
    tmp_path: Path, tg: FakeTelegramServer, llm: FakeLLM
) -> None:
    stale = tg.inject_message(ANN, "from yesterday", sender_id=ANN, date=time.time() - 86_400)
    fresh = tg.inject_message(BOB, "from a minute ago", sender_id=BOB, date=time.time() - 60)
    async with running_herald(tmp_path, tg, llm) as herald:
        [reply] = await tg.wait_for_sent(to(BOB))
        assert reply.plain_text == "You said: from a minute ago"
        await tg.wait_until_confirmed(stale.update_id, fresh.update_id)
        rows = await herald.answered(1)
        assert [r["text"] for r in rows] == ["from a minute ago"]
    assert not [s for s in tg.sent if s.chat_id == ANN]


async def test_the_backlog_can_be_skipped_on_start(
    tmp_path: Path, tg: FakeTelegramServer, llm: FakeLLM
) -> None:
    old = tg.inject_message(ANN, "while you were away", sender_id=ANN, date=time.time() - 30)
    async with running_herald(tmp_path, tg, llm, process_backlog_on_start=False) as herald:
        await tg.wait_for(lambda: old.update_id in tg.discarded or old.update_id in tg.confirmed)
        tg.inject_message(ANN, "now", sender_id=ANN)
        [reply] = await tg.wait_for_sent(to(ANN))
        assert reply.plain_text == "You said: now"
        assert [r["text"] for r in await herald.answered(1)] == ["now"]


async def test_photos_are_downloaded_and_shown_to_the_agent(
    tmp_path: Path, tg: FakeTelegramServer, llm: FakeLLM
) -> None:
    jpeg = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 8
    photo = tg.add_file(jpeg, file_path="photos/file_7.jpg")
    async with running_herald(tmp_path, tg, llm) as herald:
        tg.inject_message(ANN, "what is this?", sender_id=ANN, photo=photo)
        await tg.wait_for_sent(to(ANN))
        seen = last_user_text(llm.requests[0])
        assert seen.startswith("what is this?\n[attached file: photo_")
        assert f"(image/jpeg, {len(jpeg)} bytes)" in seen
        assert list((await herald.kept_files()).values()) == [jpeg]


async def test_too_large_documents_are_not_downloaded(
    tmp_path: Path, tg: FakeTelegramServer, llm: FakeLLM
) -> None:
    doc = tg.add_file(b"%PDF" + b"x" * 5000, file_name="big.pdf", mime_type="application/pdf")
    async with running_herald(tmp_path, tg, llm, attachment_max_bytes=1000):
        tg.inject_message(ANN, "", sender_id=ANN, document=doc)
        await tg.wait_for_sent(to(ANN))
        assert "not downloaded: larger than 1000 bytes" in last_user_text(llm.requests[0])
        assert not (tmp_path / "state" / "files").exists()


async def test_a_group_that_became_a_supergroup_is_followed(
    tmp_path: Path, tg: FakeTelegramServer, llm: FakeLLM
) -> None:
    old, new = -4001, -1004001
    async with running_herald(tmp_path, tg, llm):
        tg.inject_message(old, f"@{BOT_USERNAME} ping", chat_type="group", sender_id=BOB)
        tg.migrate_chat(old, new)
        [reply] = await tg.wait_for_sent(to(new))
        assert reply.plain_text == "You said: [User 222222222] ping"
        assert not [s for s in tg.sent if s.chat_id == old]


async def test_a_429_on_the_preview_or_typing_holds_the_chats_reply(
    tmp_path: Path, tg: FakeTelegramServer, llm: FakeLLM
) -> None:
    """Any 429 from a chat, whatever the request, holds that chat's next send."""
    words = " ".join(f"word{i}" for i in range(30))
    llm.responder = lambda body: Reply(text=words, chunk_delay=0.02)
    async with running_herald(tmp_path, tg, llm, stream_edits=True, min_edit_interval=0.2):
        tg.rate_limit(ANN, count=1, retry_after=2)
        tg.inject_message(ANN, "stream please", sender_id=ANN)
        await tg.wait_for(lambda: tg.texts_in(ANN) == [words])
        [refused] = [r for r in tg.rejected if r.status == 429]
        later = [
            c
            for c in tg.calls
            if c.method in ("sendMessage", "editMessageText")
            and str(c.params.get("chat_id")) == str(ANN)
            and c.received_at > refused.received_at
        ]
        assert later, tg.calls
        assert min(c.received_at for c in later) - refused.received_at >= 1.9  # retry_after


async def test_webhook_routes_of_polling_or_absent_platforms_are_not_found(
    tmp_path: Path, tg: FakeTelegramServer, llm: FakeLLM
) -> None:
    async with running_herald(tmp_path, tg, llm) as herald:
        async with httpx.AsyncClient(base_url=herald.url, trust_env=False, timeout=5) as client:
            polling = await client.post("/webhooks/telegram", json={"update_id": 1})
            absent = await client.post("/webhooks/slack/events", json={})
        assert (polling.status_code, absent.status_code) == (404, 404)
        assert polling.text == "this bot receives by polling"
        assert await herald.rows() == []
