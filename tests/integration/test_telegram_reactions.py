"""Edits and reactions on Telegram, the whole daemon against the fake Bot API: an edit of an
answered message is answered again; the bot marks the message it answers with 👀 and takes it
off; a 👍 on an approval question approves it (the asker's; another person's, or a stranger's,
does nothing and says nothing in the chat); another reaction to the bot is a note its next
turn reads."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from gateway.profiles import Binding
from gateway.sessions.admission import EDIT_OF_ANSWERED
from gateway.store.inbox import Outcome
from gateway.store.outbox import Outbox
from gateway.store.profiles import StoredBindings
from gateway.store.tables import messages
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.telegram import FakeTelegramServer
from tests.integration.button_rig import MCP, mcp_ready, responder, tool_runs
from tests.integration.inproc import Herald, running_daemon
from tests.integration.telegram_rig import ANN, BOB, TOKEN, running_herald

pytestmark = pytest.mark.timeout(90)

GROUP = -100123
EVE = 333333333
"""Not allowed."""


async def receipt(herald: Herald, message: str) -> bool:
    """Whether Herald stored the receipt of its message (a reaction before that finds no
    message of Herald's; a person reacts to what they see, after the send)."""
    return await Outbox(herald.store).sent_as("telegram", "default", message) is not None


async def test_an_edit_of_an_answered_message_is_answered_again(tmp_path: Path) -> None:
    async with (
        FakeTelegramServer(TOKEN, bot_username="herald_bot") as tg,
        FakeLLM() as llm,
        running_herald(tmp_path, tg, llm, working_reaction=""),
    ):
        first = tg.inject_message(ANN, "helo", sender_id=ANN)
        await tg.wait_for_sent(1, 30)
        tg.inject_message(ANN, "hello", sender_id=ANN, edit_of=first.message_id)
        sent = await tg.wait_for_sent(2, 30)
        assert EDIT_OF_ANSWERED in sent[1].plain_text
        assert not tg.reactions  # working_reaction: "" puts none


async def test_reactions_approve_mark_and_note(tmp_path: Path) -> None:
    async with FakeTelegramServer(TOKEN, bot_username="herald_bot") as tg, FakeLLM() as llm:
        llm.responder = responder
        section = {
            "token": TOKEN,
            "base_url": tg.base_url,
            "base_file_url": tg.base_file_url,
            "allowed_users": [str(ANN), str(BOB)],
            "pairing": False,
            "poll_timeout": 1,
            "stream_edits": False,
            "min_send_interval": 0,
            "group_trigger": ["all"],
        }
        async with running_daemon(tmp_path, llm, "telegram", section, extra={"mcp": MCP}) as herald:
            await mcp_ready(herald.url)
            asked = tg.inject_message(GROUP, "run pid", sender_id=ANN, chat_type="group")
            [question] = await tg.wait_for_sent(lambda s: "Approval needed" in s.plain_text, 30)
            # The message being answered carries 👀 while the turn runs.
            await herald.until(
                lambda: any(r.message_id == asked.message_id and r.emoji for r in tg.reactions)
            )

            tg.inject_reaction(GROUP, question.message_id, "👍", sender_id=EVE)
            tg.inject_reaction(GROUP, question.message_id, "👍", sender_id=BOB)  # not his
            tg.inject_reaction(GROUP, question.message_id, "🤔", sender_id=ANN)  # neither
            tg.inject_reaction(GROUP, question.message_id, "👍", sender_id=ANN, old=["🤔"])
            [done] = await tg.wait_for_sent(lambda s: s.plain_text.startswith("done:"), 30)
            assert f"[approved by telegram:{ANN}]" in done.plain_text
            # Bob's 👍 was not a command answered with a refusal in the group.
            assert not [s for s in tg.sent if "Only the person who asked" in s.plain_text]
            assert tool_runs(llm) == 1
            await herald.until(lambda: tg.reactions[-1].emoji == ())  # taken off when done
            assert {r.message_id for r in tg.reactions} == {asked.message_id}

            # A reaction to another of the bot's messages: a note, no turn of its own.
            requests = len(llm.requests)
            await herald.until(lambda: receipt(herald, f"{GROUP}:{done.message_id}"))
            tg.inject_reaction(GROUP, done.message_id, "❤", sender_id=ANN)

            async def noted() -> bool:
                rows = await herald.rows()
                return any(r["outcome"] == Outcome.MERGED and "❤" in r["text"] for r in rows)

            await herald.until(noted, 30)
            assert len(llm.requests) == requests
            tg.inject_message(GROUP, "thanks", sender_id=ANN, chat_type="group")
            await herald.until(lambda: len(llm.requests) > requests, 30)
            last = llm.requests[-1]["messages"]
            assert any("[reaction ❤ to your message «done:" in str(m["content"]) for m in last)
            # The stranger's reaction left no trace.
            assert not [r for r in await herald.rows() if r["sender_id"] == str(EVE)]


WORK_THEN_FAMILY = {
    "profiles": {"work": {"llm": {"model": "work-model"}}, "family": {}},
    "bindings": [{"profile": "work", "platform": "telegram"}],
}
"""Two profiles; every Telegram chat answered as `work` until a test binds it elsewhere."""


def ann_only(tg: FakeTelegramServer) -> dict[str, Any]:
    """The Telegram section of the rebinding tests: Ann alone, answers sent whole at once."""
    return {
        "token": TOKEN,
        "base_url": tg.base_url,
        "base_file_url": tg.base_file_url,
        "allowed_users": [str(ANN)],
        "pairing": False,
        "poll_timeout": 1,
        "stream_edits": False,
        "min_send_interval": 0,
        "working_reaction": "",
    }


@pytest.mark.parametrize("rule", ["note", "turn"])
async def test_a_reaction_after_a_rebinding_is_no_note_in_the_old_profiles_conversation(
    tmp_path: Path, rule: str
) -> None:
    """Ann's chat answered as `work`, then bound to `family`: her reaction to work's answer
    is no note in work's conversation (one profile never gets another's words), and family's
    new conversation does not have it either, nor a turn quoting it (family never said that
    message, and reads nothing of work's conversation)."""
    async with FakeTelegramServer(TOKEN, bot_username="herald_bot") as tg, FakeLLM() as llm:
        section = {**ann_only(tg), "reactions": rule}
        extra = WORK_THEN_FAMILY
        async with running_daemon(tmp_path, llm, "telegram", section, extra=extra) as herald:
            tg.inject_message(ANN, "hello", sender_id=ANN)
            [answer] = await tg.wait_for_sent(1, 30)
            await herald.until(lambda: receipt(herald, f"{ANN}:{answer.message_id}"))
            await StoredBindings(herald.store).bind(
                Binding("family", "telegram", "default", str(ANN), source="cli")
            )
            tg.inject_reaction(ANN, answer.message_id, "❤", sender_id=ANN)
            tg.inject_message(ANN, "and now?", sender_id=ANN)  # after the reaction, in order
            await tg.wait_for_sent(2, 30)
            assert llm.requests[-1]["model"] != "work-model"
            async with herald.store.read() as conn:
                stored = (await conn.execute(select(messages.c.content))).scalars().all()
            assert not [c for c in stored if "[reaction" in c]
            assert not [b for b in llm.requests if "[reaction" in str(b["messages"])]


async def test_an_edit_after_a_rebinding_never_reaches_the_old_profiles_turn(
    tmp_path: Path,
) -> None:
    """Busy mode steer: Ann's message waits to be steered into a turn of `work`; her chat is
    bound to `family`, and she edits that message. Work's turn never reads the edited words:
    the message is answered in a turn of its own, by family."""
    async with FakeTelegramServer(TOKEN, bot_username="herald_bot") as tg, FakeLLM() as llm:
        section = {**ann_only(tg), "busy_mode": "steer"}
        extra = WORK_THEN_FAMILY
        async with running_daemon(tmp_path, llm, "telegram", section, extra=extra) as herald:
            gate = asyncio.Event()
            llm.script(
                Reply(tool_calls=[("session_search", {"query": "anything"})], gate=gate),
                Reply("work is done"),
                Reply("family answers"),
            )
            tg.inject_message(ANN, "start some work", sender_id=ANN)
            await llm.wait_for_requests(1, 30)
            also = tg.inject_message(ANN, "also this", sender_id=ANN)

            async def text_is(text: str) -> bool:
                return any(r["text"] == text and r["steer"] for r in await herald.rows())

            await herald.until(lambda: text_is("also this"), 30)
            await StoredBindings(herald.store).bind(
                Binding("family", "telegram", "default", str(ANN), source="cli")
            )
            tg.inject_message(ANN, "edited after rebinding", sender_id=ANN, edit_of=also.message_id)

            async def edited() -> bool:
                return any(r["text"] == "edited after rebinding" for r in await herald.rows())

            await herald.until(edited, 30)
            gate.set()
            await tg.wait_for_sent(lambda s: "work is done" in s.plain_text, 30)
            work = [b for b in llm.requests if b["model"] == "work-model"]
            assert len(work) == 2
            assert not any("edited after rebinding" in str(b["messages"]) for b in work)
            await tg.wait_for_sent(lambda s: "family answers" in s.plain_text, 30)
            assert "edited after rebinding" in str(llm.requests[-1]["messages"])
