"""The Discord adapter in the running daemon, against the fake Discord (discord.py unmodified
but for its REST base) and a fake LLM: what a person in a server or a DM sees."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.contracts.adapter import AdapterState
from gateway.store.outbox import Outbox
from tests.fakes.discord_server import DEFAULT_TOKEN, QUIET_HEARTBEAT, FakeDiscordServer
from tests.fakes.llm import FakeLLM, Reply, last_user_text
from tests.integration.inproc import Herald, running_daemon

pytestmark = pytest.mark.timeout(90)

ANN = "2000000000000000001"
BOB = "2000000000000000002"
CAROL = "2000000000000000003"
"""Not on the allowlist; has the `helpers` role."""
HELPERS = "5000000000000000001"
DM = "3000000000000000001"
BOB_DM = "3000000000000000005"
GENERAL = "3000000000000000002"
RANDOM = "3000000000000000003"
THREAD = "3000000000000000004"


@pytest.fixture
async def discord() -> AsyncIterator[FakeDiscordServer]:
    async with FakeDiscordServer(heartbeat_interval=QUIET_HEARTBEAT) as server:
        server.add_user(ANN, "ann")
        server.add_user(BOB, "bob")
        server.add_user(CAROL, "carol")
        server.add_channel(DM, dm=True)
        server.add_channel(BOB_DM, dm=True)
        server.add_channel(GENERAL)
        server.add_channel(RANDOM)
        server.add_channel(THREAD, parent=GENERAL)
        yield server


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as server:
        yield server


@contextlib.asynccontextmanager
async def running_herald(
    tmp_path: Path, discord: FakeDiscordServer, llm: FakeLLM, **changes: Any
) -> AsyncIterator[Herald]:
    section: dict[str, Any] = {
        "token": DEFAULT_TOKEN,
        "api_base": discord.api_base,
        "allowed_users": [ANN, BOB],
        "stream_edits": False,
        "min_send_interval": 0,
        "min_edit_interval": 0.2,
        "activity_check_interval": 1.0,
    }
    section.update(changes)
    async with running_daemon(tmp_path, llm, "discord", section) as herald:
        yield herald


async def test_direct_message_round_trip(
    tmp_path: Path, discord: FakeDiscordServer, llm: FakeLLM
) -> None:
    async with running_herald(tmp_path, discord, llm) as herald:
        asked = discord.inject_message(DM, "hello **there**", author=ANN)
        [reply] = await discord.wait_for_posted(lambda p: p.channel_id == DM)
        assert reply.content == "You said: hello **there**"
        assert reply.reference is None
        rows = await herald.answered(1)
        assert [(r["platform_message_id"], r["outcome"]) for r in rows] == [
            (f"{DM}:{asked['id']}", "answered")
        ]
        assert rows[0]["session_key"] == f"discord:default:{DM}:u={ANN}"
        assert DM in discord.typing


async def test_a_mention_is_answered_as_a_reply_and_chatter_is_not(
    tmp_path: Path, discord: FakeDiscordServer, llm: FakeLLM
) -> None:
    async with running_herald(tmp_path, discord, llm) as herald:
        discord.inject_message(GENERAL, "lunch anyone?", author=BOB)
        mention = discord.inject_message(GENERAL, "what's the plan?", author=BOB, mention_bot=True)
        [reply] = await discord.wait_for_posted(lambda p: p.channel_id == GENERAL)
        assert reply.content == "You said: [Bob] what's the plan?"
        assert reply.reference == mention["id"]
        rows = await herald.answered(1)
        assert [r["platform_message_id"] for r in rows] == [f"{GENERAL}:{mention['id']}"]
        # A reply to the bot's answer addresses it too, without a mention.
        discord.inject_message(GENERAL, "and then?", author=BOB, reply_to=reply.id)
        await discord.wait_for_posted(lambda p: p.content == "You said: [Bob] and then?")


async def test_thread_messages_are_answered_in_the_thread_in_their_own_session(
    tmp_path: Path, discord: FakeDiscordServer, llm: FakeLLM
) -> None:
    async with running_herald(tmp_path, discord, llm) as herald:
        discord.inject_message(THREAD, "first in thread", author=ANN, mention_bot=True)
        await discord.wait_for_posted(lambda p: p.channel_id == THREAD)
        discord.inject_message(THREAD, "second in thread", author=ANN, mention_bot=True)
        await discord.wait_for_posted(lambda p: p.content.endswith("second in thread"))
        # (A slow first turn may still be running: the second then gets a "queued" note.)
        assert [t for t in discord.texts_in(THREAD) if t.startswith("You said")] == [
            "You said: [Ann] first in thread",
            "You said: [Ann] second in thread",
        ]
        assert discord.texts_in(GENERAL) == []
        rows = await herald.answered(2)
        assert {r["session_key"] for r in rows} == {f"discord:default:{GENERAL}:{THREAD}"}


async def test_configured_channels_and_allowed_roles(
    tmp_path: Path, discord: FakeDiscordServer, llm: FakeLLM
) -> None:
    async with running_herald(
        tmp_path, discord, llm, channels=[RANDOM], allowed_roles=[HELPERS]
    ) as herald:
        discord.inject_message(RANDOM, "status?", author=ANN)
        await discord.wait_for_posted(lambda p: p.content == "You said: [Ann] status?")
        discord.inject_message(GENERAL, "no role", author=CAROL, mention_bot=True)
        discord.inject_message(
            GENERAL, "with role", author=CAROL, mention_bot=True, roles=[HELPERS]
        )
        await discord.wait_for_posted(lambda p: p.content == "You said: [Carol] with role")
        rows = await herald.answered(3)
        assert [r["outcome"] for r in rows] == ["answered", "rejected", "answered"]
        assert not any("no role" in t for t in discord.texts_in(GENERAL))


async def test_a_strangers_attachments_are_never_downloaded(
    tmp_path: Path, discord: FakeDiscordServer, llm: FakeLLM
) -> None:
    def pdf(n: int) -> dict[str, Any]:
        url = discord.add_file(b"%PDF" + bytes([n]) * 100)
        name, mime = f"d{n}.pdf", "application/pdf"
        return {"id": str(n), "filename": name, "size": 104, "url": url, "content_type": mime}

    async with running_herald(tmp_path, discord, llm) as herald:
        strangers = [pdf(n) for n in range(5)]
        discord.inject_message(GENERAL, "hi", author=CAROL, mention_bot=True, attachments=strangers)
        discord.inject_message(DM, "mine", author=ANN, attachments=[pdf(9)])
        await discord.wait_for_posted(lambda p: p.channel_id == DM)
        rows = await herald.answered(2)
        assert [r["outcome"] for r in rows] == ["rejected", "answered"]
        assert len(discord.downloads) == 1  # Ann's only
        assert len(await herald.kept_files()) == 1  # Ann's only


async def test_a_long_answer_is_chunked_with_code_blocks_intact(
    tmp_path: Path, discord: FakeDiscordServer, llm: FakeLLM
) -> None:
    code = "\n".join(f"step_{i} = run({i})" for i in range(40))
    prose = "Discord keeps *every* word of this answer in order. " * 30
    answer = f"{prose}\n\n```python\n{code}\n```\n\n{prose}\n\n{prose}"
    llm.responder = lambda body: Reply(text=answer)
    async with running_herald(tmp_path, discord, llm):
        discord.inject_message(DM, "tell me everything", author=ANN)
        await discord.wait_for(
            lambda: "step_39" in "".join(p.content for p in discord.posted), timeout=20
        )
        await discord.wait_for(
            lambda: sum(len(p.content) for p in discord.posted) > 4500, timeout=20
        )
        posts = discord.texts_in(DM)
        assert len(posts) >= 3
        assert all(len(p) <= 2000 for p in posts)
        holders = [p for p in posts if "step_0 = run(0)" in p]
        assert len(holders) == 1
        assert "step_39 = run(39)" in holders[0]
        assert holders[0].count("```") == 2


async def test_a_dropped_connection_during_a_burst_loses_nothing_and_answers_once(
    tmp_path: Path, llm: FakeLLM
) -> None:
    async with FakeDiscordServer(
        heartbeat_interval=QUIET_HEARTBEAT, replay_on_resume=False
    ) as discord:
        discord.add_channel(DM, dm=True)
        async with running_herald(tmp_path, discord, llm) as herald:
            discord.inject_message(DM, "before", author=ANN)
            await discord.wait_for_posted(lambda p: p.content == "You said: before")
            texts = [f"burst {i}" for i in range(12)]
            for i, text in enumerate(texts):
                discord.inject_message(DM, text, author=ANN)
                if i == 4:
                    discord.drop_connections()
            rows = await herald.answered(13)
            assert sorted(r["text"] for r in rows) == sorted(["before", *texts])
            assert len({r["platform_message_id"] for r in rows}) == 13
            await herald.until(lambda: herald.adapter_state() is AdapterState.RECEIVING)
            assert discord.kept_its_session
            assert DM in discord.history_reads
            # Nothing was answered twice.
            said = [p.content for p in discord.posted if p.content.startswith("You said:")]
            assert len(said) == len(set(said))
            assert {t for r in llm.requests for t in [last_user_text(r)]} <= {
                "before",
                *texts,
            }


async def test_a_silent_connection_fails_ready_until_it_is_replaced(
    tmp_path: Path, discord: FakeDiscordServer, llm: FakeLLM
) -> None:
    async with running_herald(tmp_path, discord, llm) as herald:
        assert await herald.ready() == 200
        discord.inject_message(DM, "one", author=ANN)
        await discord.wait_for_posted(lambda p: p.content == "You said: one")
        discord.silence()
        discord.refuse_connections(1_000_000)
        discord.inject_message(DM, "two", author=ANN)
        await herald.until(lambda: herald.adapter_state() is not AdapterState.RECEIVING)

        async def not_ready() -> bool:
            return await herald.ready() == 503

        await herald.until(not_ready)
        discord.silence(False)
        discord.refuse_connections(0)
        await discord.wait_for_posted(lambda p: p.content == "You said: two", timeout=30)

        async def ready() -> bool:
            return await herald.ready() == 200

        await herald.until(ready, timeout=30)
        assert len(await herald.answered(2)) == 2


async def test_edits_reactions_and_the_working_mark(
    tmp_path: Path, discord: FakeDiscordServer, llm: FakeLLM
) -> None:
    async with running_herald(tmp_path, discord, llm) as herald:
        asked = discord.inject_message(DM, "helo", author=ANN)
        [reply] = await discord.wait_for_posted(lambda p: p.channel_id == DM)
        # 👀 on the message while it was answered, taken off after.
        await herald.until(lambda: len(discord.bot_reactions) == 2)
        assert discord.bot_reactions == [
            ("PUT", DM, asked["id"], "👀"),
            ("DELETE", DM, asked["id"], "👀"),
        ]
        discord.edit_message(asked, "hello")
        await discord.wait_for_posted(lambda p: p.content.endswith("it now reads:] hello"))
        await herald.answered(2)
        await herald.until(
            lambda: Outbox(herald.store).sent_as("discord", "default", f"{DM}:{reply.id}")
        )
        discord.react(DM, reply.id, "🎉", user=CAROL)  # not allowed: nothing
        discord.react(DM, reply.id, "🎉", user=ANN)
        rows = await herald.answered(3)
        assert [r["sender_id"] for r in rows] == [ANN, ANN, ANN]
        assert rows[2]["text"].startswith("[reaction 🎉 to your message «You said: helo»]")
        assert len(discord.posted) == 2
