"""Discord approval buttons: Button → components (the same as discord.py's view sends), and an
INTERACTION_CREATE press → the presser's own command message, against a recorded payload
(tests/data/discord/button_press.json)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import discord

from adapters.discord import PLATFORM as DISCORD
from adapters.discord.adapter import _view
from adapters.discord.convert import (
    Channel,
    ChannelKind,
    button_components,
    custom_id,
    interaction_channel,
    pressed,
)
from adapters.inbound import Incoming, Skipped
from gateway.contracts.ids import AccountId
from gateway.contracts.messages import Button

DATA = Path(__file__).resolve().parents[1] / "data" / "discord"
BOT = "1199857218124726272"
PARENT = "1199859387204829226"
THREAD = "1199859387204829300"
BUTTONS = (Button("✅ Approve", "/approve 1"), Button("❌ Deny", "/deny 1"))


def payload() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / "button_press.json").read_text(encoding="utf-8"))
    return data


def press(data: Any, channel: Channel | None = None) -> Incoming[Any] | Skipped:
    known = channel if channel is not None else interaction_channel(data)
    return pressed(data, bot_id=BOT, account=AccountId("srv"), channel=known)


def test_buttons_carry_their_command_in_the_custom_id() -> None:
    assert button_components(BUTTONS) == [
        {
            "type": 1,
            "components": [
                {"type": 2, "style": 3, "label": "✅ Approve", "custom_id": "herald:/approve 1"},
                {"type": 2, "style": 4, "label": "❌ Deny", "custom_id": "herald:/deny 1"},
            ],
        }
    ]
    assert button_components(()) == []
    assert len(custom_id(Button("x", "/approve " + "9" * 200))) == 100


async def test_the_view_sent_is_those_components() -> None:
    view = _view(BUTTONS)
    assert view.timeout is None
    sent = view.to_components()
    assert [
        [{k: c[k] for k in ("type", "style", "label", "custom_id")} for c in row["components"]]
        for row in sent
    ] == [row["components"] for row in button_components(BUTTONS)]
    assert isinstance(view, discord.ui.View)


def test_a_press_in_a_thread_is_the_pressers_command_in_the_threads_session() -> None:
    result = press(payload())
    assert isinstance(result, Incoming)
    message = result.message
    assert message.platform is DISCORD
    assert message.text == "/approve 1"
    assert (message.chat_id, message.thread_id) == (PARENT, THREAD)
    assert (message.sender.id, message.sender.display_name) == ("80351110224678912", "annie")
    assert message.mentions_bot
    assert not message.is_direct
    assert message.platform_message_id == f"{THREAD}:i1311234700000000000"
    assert message.session_key == f"discord:srv:{PARENT}:{THREAD}"


def test_a_press_in_a_direct_message() -> None:
    data = payload()
    member = data.pop("member")
    data.pop("guild_id")
    data["user"] = member["user"]
    data["channel"] = {"id": "1311228000000000001", "type": 1}
    data["channel_id"] = "1311228000000000001"
    result = press(data)
    assert isinstance(result, Incoming)
    assert result.message.is_direct
    assert result.message.sender.display_name == "Ann Example"
    assert result.message.chat_id == "1311228000000000001"


def test_without_a_channel_object_the_known_channel_decides() -> None:
    data = payload()
    del data["channel"]
    result = press(data, Channel(THREAD, ChannelKind.THREAD, PARENT))
    assert isinstance(result, Incoming)
    assert (result.message.chat_id, result.message.thread_id) == (PARENT, THREAD)


def test_presses_herald_did_not_offer_are_skipped() -> None:
    foreign = payload()
    foreign["data"]["custom_id"] = "someone-else:/approve 1"
    not_a_command = payload()
    not_a_command["data"]["custom_id"] = "herald:/forget everything"
    command = payload()
    command["type"] = 2
    by_bot = payload()
    by_bot["member"]["user"]["id"] = BOT
    nobody = payload()
    del nobody["member"]
    for data in (foreign, not_a_command, command, by_bot, nobody, {}, None):
        assert isinstance(press(copy.deepcopy(data)), Skipped), data
