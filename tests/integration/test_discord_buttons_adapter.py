"""Discord buttons at the adapter level: a message sent with buttons carries them as
components, and a press reaches a fresh adapter (as after a restart: nothing is kept in memory)
as the presser's own command, answered with a deferred update."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from pydantic import SecretStr

from adapters.discord import PLATFORM as DISCORD
from adapters.discord.adapter import DiscordAdapter
from adapters.discord.config import DiscordConfig
from gateway.checkpoints import MemoryCheckpoints
from gateway.contracts.adapter import AdapterState
from gateway.contracts.ids import AccountId, ChatId
from gateway.contracts.messages import Button, OutboundMessage
from tests.fakes.discord_server import DEFAULT_TOKEN, QUIET_HEARTBEAT, FakeDiscordServer
from tests.fakes.sink import ListSink, receiving

pytestmark = pytest.mark.timeout(60)

ANN = "2000000000000000001"
DM = "3000000000000000001"
BUTTONS = (Button("✅ Approve", "/approve 7"), Button("❌ Deny", "/deny 7"))


async def until_receiving(adapter: DiscordAdapter) -> None:
    async with asyncio.timeout(10):
        while adapter.liveness() is not AdapterState.RECEIVING:
            await asyncio.sleep(0.02)


def adapter_for(discord: FakeDiscordServer, tmp_path: Path) -> DiscordAdapter:
    config = DiscordConfig(
        token=SecretStr(DEFAULT_TOKEN),
        api_base=discord.api_base,
        allowed_users=(ANN,),
        min_send_interval=0,
        activity_check_interval=1.0,
    )
    return DiscordAdapter(config, tmp_path / "files", MemoryCheckpoints())


async def test_a_press_after_a_restart_is_the_pressers_command(tmp_path: Path) -> None:
    async with FakeDiscordServer(heartbeat_interval=QUIET_HEARTBEAT) as discord:
        discord.add_user(ANN, "ann")
        discord.add_channel(DM, dm=True)
        async with adapter_for(discord, tmp_path) as first:
            question = OutboundMessage(
                platform=DISCORD,
                account=AccountId("default"),
                chat_id=ChatId(DM),
                text="Approval needed #7",
                idempotency_key=f"k-{time.monotonic_ns()}",
                buttons=BUTTONS,
            )
            await first.send(question)
            plain = OutboundMessage(
                platform=DISCORD,
                account=AccountId("default"),
                chat_id=ChatId(DM),
                text="no buttons",
                idempotency_key=f"k-{time.monotonic_ns()}",
            )
            await first.send(plain)
        sent, without = discord.posted
        assert [c["custom_id"] for row in sent.components for c in row["components"]] == [
            "herald:/approve 7",
            "herald:/deny 7",
        ]
        assert without.components == ()

        sink = ListSink()
        async with adapter_for(discord, tmp_path) as second, receiving(second, sink):
            await until_receiving(second)
            pressed = discord.press_button(DM, sent.id, "herald:/deny 7", user=ANN)
            await sink.until_stored(1)
            [message] = sink.messages
            assert (message.text, message.chat_id, message.sender.id) == ("/deny 7", DM, ANN)
            assert message.is_direct
            assert message.platform_message_id == f"{DM}:i{pressed.id}"
            await discord.wait_for(lambda: len(discord.interaction_responses) == 1)
            [response] = discord.interaction_responses
            assert (response.interaction_id, response.type) == (pressed.id, 6)
