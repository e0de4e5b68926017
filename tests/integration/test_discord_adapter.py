"""The real DiscordAdapter (discord.py unmodified but for its addresses) against the fake
Discord.

Adapter level: no daemon, no store (checkpoints in memory). What the daemon makes of it is in
`test_discord.py`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from adapters.discord import PLATFORM as DISCORD
from adapters.discord.adapter import DiscordAdapter
from adapters.discord.config import DiscordConfig
from gateway.checkpoints import MemoryCheckpoints
from gateway.contracts.adapter import (
    Adapter,
    AdapterState,
    MessageEditor,
    SelfCheck,
    TypingIndicator,
)
from gateway.contracts.errors import AuthError, NotReady, PermanentSendError
from gateway.contracts.ids import AccountId, ChatId, PlatformMessageId, ThreadId
from gateway.contracts.messages import Attachment, OutboundMessage, TextFormat
from tests.fakes.discord_server import BOT_ID, DEFAULT_TOKEN, QUIET_HEARTBEAT, FakeDiscordServer
from tests.fakes.sink import ListSink, receiving, refusing_socket, run_until_error

pytestmark = pytest.mark.timeout(60)

ANN = "2000000000000000001"
BOB = "2000000000000000002"
DM = "3000000000000000001"
GENERAL = "3000000000000000002"
RANDOM = "3000000000000000003"
THREAD = "3000000000000000004"


@pytest.fixture
async def discord() -> AsyncIterator[FakeDiscordServer]:
    async with FakeDiscordServer(heartbeat_interval=QUIET_HEARTBEAT) as server:
        server.add_user(ANN, "ann")
        server.add_user(BOB, "bob")
        server.add_channel(DM, dm=True)
        server.add_channel(GENERAL)
        server.add_channel(RANDOM)
        server.add_channel(THREAD, parent=GENERAL)
        yield server


def discord_config(discord: FakeDiscordServer, **changes: Any) -> DiscordConfig:
    settings: dict[str, Any] = {
        "token": SecretStr(DEFAULT_TOKEN),
        "api_base": discord.api_base,
        "allowed_users": [ANN, BOB],
        "min_send_interval": 0,
        "activity_check_interval": 1.0,
    }
    settings.update(changes)
    return DiscordConfig.model_validate(settings)


def adapter_for(
    discord: FakeDiscordServer,
    tmp_path: Path,
    checkpoints: MemoryCheckpoints | None = None,
    **changes: Any,
) -> DiscordAdapter:
    return DiscordAdapter(
        discord_config(discord, **changes),
        tmp_path / "files",
        checkpoints if checkpoints is not None else MemoryCheckpoints(),
    )


def outbound(chat: str, text: str, **fields: Any) -> OutboundMessage:
    return OutboundMessage(
        platform=DISCORD,
        account=AccountId("default"),
        chat_id=ChatId(chat),
        text=text,
        idempotency_key=f"k-{time.monotonic_ns()}",
        **fields,
    )


async def until_receiving(adapter: DiscordAdapter) -> None:
    async with asyncio.timeout(10):
        while adapter.liveness() is not AdapterState.RECEIVING:
            await asyncio.sleep(0.02)


async def test_the_adapter_speaks_herald_protocols(
    discord: FakeDiscordServer, tmp_path: Path
) -> None:
    adapter = adapter_for(discord, tmp_path)
    assert isinstance(adapter, Adapter)
    assert isinstance(adapter, TypingIndicator)
    assert isinstance(adapter, MessageEditor)
    assert isinstance(adapter, SelfCheck)
    assert adapter.limits.max_chunk == 2000


async def test_dm_mention_thread_and_not_addressed(
    discord: FakeDiscordServer, tmp_path: Path
) -> None:
    sink = ListSink()
    async with adapter_for(discord, tmp_path) as adapter, receiving(adapter, sink):
        await until_receiving(adapter)
        dm = discord.inject_message(DM, "hello there", author=ANN)
        discord.inject_message(GENERAL, "lunch anyone?", author=BOB)
        mention = discord.inject_message(GENERAL, "what's up?", author=BOB, mention_bot=True)
        in_thread = discord.inject_message(THREAD, "and here?", author=ANN, mention_bot=True)
        await sink.until_stored(3)
        first, second, third = sink.messages
        assert (first.text, first.is_direct, first.chat_id, first.thread_id) == (
            "hello there",
            True,
            DM,
            None,
        )
        assert first.platform_message_id == f"{DM}:{dm['id']}"
        assert first.sender.display_name == "Ann"
        assert (second.text, second.is_direct, second.mentions_bot) == ("what's up?", False, True)
        assert second.platform_message_id == f"{GENERAL}:{mention['id']}"
        assert (third.chat_id, third.thread_id) == (GENERAL, THREAD)
        assert third.platform_message_id == f"{THREAD}:{in_thread['id']}"
        assert third.session_key == f"discord:default:{GENERAL}:{THREAD}"
        assert adapter.liveness() is AdapterState.RECEIVING
    assert adapter.liveness() is AdapterState.STOPPED


async def test_send_reply_edit_typing_and_files(discord: FakeDiscordServer, tmp_path: Path) -> None:
    asked = discord.inject_message(GENERAL, "q", author=BOB, mention_bot=True)
    report = tmp_path / "report.txt"
    report.write_text("numbers", encoding="utf-8")
    async with adapter_for(discord, tmp_path) as adapter:
        receipt = await adapter.send(
            outbound(GENERAL, "**yes**", reply_to=PlatformMessageId(f"{GENERAL}:{asked['id']}"))
        )
        [posted] = discord.posted
        assert (posted.content, posted.reference) == ("**yes**", asked["id"])
        assert receipt.platform_message_id == f"{GENERAL}:{posted.id}"
        assert receipt.platform_message_id is not None
        await adapter.edit(receipt.platform_message_id, outbound(GENERAL, "**yes!**"))
        assert [e.content for e in discord.edits] == ["**yes!**"]
        await adapter.typing(ChatId(GENERAL), ThreadId(THREAD))
        assert discord.typing == [THREAD]
        await adapter.send(outbound(GENERAL, "in thread", thread_id=ThreadId(THREAD)))
        assert discord.texts_in(THREAD) == ["in thread"]
        await adapter.send(
            outbound(
                DM,
                "",
                attachments=(Attachment(report, "text/plain", 7, "report.txt"),),
            )
        )
        assert discord.posted[-1].files == (("report.txt", 7),)
        await adapter.send(outbound(DM, "*not bold*", format=TextFormat.PLAIN))
        assert discord.posted[-1].content == "\\*not bold\\*"
        with pytest.raises(PermanentSendError):
            await adapter.send(outbound("3999999999999999999", "nowhere"))


async def test_a_wrong_token_is_an_auth_error(discord: FakeDiscordServer, tmp_path: Path) -> None:
    with pytest.raises(AuthError):
        async with adapter_for(discord, tmp_path, token=SecretStr("wrong")):
            pass
    with pytest.raises(AuthError):
        await adapter_for(discord, tmp_path, token=SecretStr("wrong")).check()


async def test_message_content_intent_off_is_an_auth_error(tmp_path: Path) -> None:
    async with (
        FakeDiscordServer(message_content=False) as discord,
        adapter_for(discord, tmp_path) as adapter,
    ):
        with pytest.raises(AuthError, match="Message Content"):
            await run_until_error(adapter, ListSink())


async def test_unreachable_discord_is_not_ready(tmp_path: Path) -> None:
    with refusing_socket() as url:
        config = DiscordConfig.model_validate({"token": DEFAULT_TOKEN, "api_base": f"{url}/api"})
        with pytest.raises(NotReady):
            async with DiscordAdapter(config, tmp_path, MemoryCheckpoints()):
                pass


async def test_check_names_the_bot(discord: FakeDiscordServer, tmp_path: Path) -> None:
    detail = await adapter_for(discord, tmp_path).check()
    assert detail == f"herald ({BOT_ID}) of application Herald, 1000 gateway sessions left today"
    assert discord.connections == 0


async def test_a_dropped_connection_resumes_and_the_gap_is_read_from_history(
    tmp_path: Path,
) -> None:
    sink = ListSink()
    checkpoints = MemoryCheckpoints()
    async with FakeDiscordServer(
        heartbeat_interval=QUIET_HEARTBEAT, replay_on_resume=False
    ) as discord:
        discord.add_channel(DM, dm=True)
        async with adapter_for(discord, tmp_path, checkpoints) as adapter, receiving(adapter, sink):
            await until_receiving(adapter)
            discord.inject_message(DM, "one", author=ANN)
            await sink.until_stored(1)
            discord.drop_connections()
            discord.inject_message(DM, "two (in the gap)", author=ANN)
            discord.inject_message(DM, "three (in the gap)", author=ANN)
            await sink.until_stored(3)
            discord.inject_message(DM, "four", author=ANN)
            await sink.until_stored(4)
            assert sink.texts == ["one", "two (in the gap)", "three (in the gap)", "four"]
            assert discord.kept_its_session
            assert DM in discord.history_reads
        assert await checkpoints.get(f"last:{DM}") == discord.channels[DM].messages[-1]["id"]


async def test_a_silent_socket_is_replaced_and_backfilled(
    discord: FakeDiscordServer, tmp_path: Path
) -> None:
    sink = ListSink()
    async with adapter_for(discord, tmp_path) as adapter, receiving(adapter, sink):
        await until_receiving(adapter)
        discord.inject_message(DM, "one", author=ANN)
        await sink.until_stored(1)
        discord.silence()
        discord.inject_message(DM, "two (unheard)", author=ANN)
        await discord.wait_for(lambda: len(discord.resumes) == 2)
        discord.silence(False)
        await until_receiving(adapter)  # RESUMED, and the backfill after it, are done
        # The resume replays what the silent socket withheld and the backfill reads it from
        # history too: the inbox (not this stand-in) drops the second copy.
        assert sorted(set(sink.texts)) == ["one", "two (unheard)"]
        assert DM in discord.history_reads


async def test_missing_heartbeat_acks_replace_the_socket(tmp_path: Path) -> None:
    """The one test here with a short heartbeat: acks are missed on purpose."""
    sink = ListSink()
    async with FakeDiscordServer(heartbeat_interval=0.5) as discord:
        discord.add_channel(DM, dm=True)
        async with adapter_for(discord, tmp_path) as adapter, receiving(adapter, sink):
            await until_receiving(adapter)
            discord.stop_acking()
            await discord.wait_for(lambda: discord.connections == 2)
            discord.stop_acking(False)
            await until_receiving(adapter)
            discord.inject_message(DM, "still here", author=ANN)
            await sink.until_stored(1)
            assert discord.kept_its_session


async def test_close_codes_4000_resumes_and_invalid_session_identifies(
    discord: FakeDiscordServer, tmp_path: Path
) -> None:
    sink = ListSink()
    async with adapter_for(discord, tmp_path) as adapter, receiving(adapter, sink):
        await until_receiving(adapter)
        await discord.close_connections(4000)
        await discord.wait_for(lambda: len(discord.resumes) == 2)
        assert discord.kept_its_session
        before = len(discord.resumes)  # a stalled machine may have added a resume
        await discord.invalidate_sessions()
        await discord.wait_for(lambda: any(not r for _, r in discord.resumes[before:]), timeout=15)
        resumed = [r for _, r in discord.resumes]
        assert resumed[-1] is False  # identified anew, after only resumes
        assert resumed.count(False) == 2
        discord.inject_message(DM, "after all that", author=ANN)
        await sink.until_stored(1)
