"""Discord MESSAGE_CREATE payloads → InboundMessage, against recorded payloads
(tests/data/discord), and Discord's errors → Herald's."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from adapters.discord import PLATFORM as DISCORD
from adapters.discord.config import DiscordConfig
from adapters.discord.convert import (
    NOT_ADDRESSED,
    Channel,
    ChannelKind,
    channel_from,
    error_from,
    newer,
    reaction_from,
    snowflake_time,
    split_message_key,
    to_inbound,
)
from adapters.inbound import FileRef, Incoming, Skipped, message_key
from gateway.contracts.errors import AuthError, NotReady, PermanentSendError, RateLimited
from gateway.contracts.ids import AccountId
from gateway.contracts.messages import InboundMessage, Reaction

NOW = datetime(2026, 11, 29, 7, 0, tzinfo=UTC)
DATA = Path(__file__).resolve().parents[1] / "data" / "discord"
BOT = "1199857218124726272"
GUILD_CHANNEL = "1199859387204829226"
THREAD = "1311230000000000000"
DM = "1311228000000000001"
CHANNELS = {
    GUILD_CHANNEL: Channel(GUILD_CHANNEL, ChannelKind.GUILD),
    THREAD: Channel(THREAD, ChannelKind.THREAD, GUILD_CHANNEL),
    DM: Channel(DM, ChannelKind.DIRECT),
}


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))
    return data


def config(**changes: Any) -> DiscordConfig:
    return DiscordConfig(token=SecretStr("t"), account="srv", **changes)


def convert(
    name: str, *, late: float = 5.0, channel: Channel | None = None, **changes: Any
) -> Incoming[FileRef] | Skipped:
    data = load(name)
    sent = snowflake_time(data["id"])
    assert sent is not None
    if channel is None and data.get("guild_id"):
        channel = CHANNELS[data["channel_id"]]
    return to_inbound(
        data,
        bot_id=BOT,
        account=AccountId("srv"),
        config=config(**changes),
        channel=channel,
        now=sent + timedelta(seconds=late),
    )


def accepted(name: str, **changes: Any) -> InboundMessage:
    result = convert(name, **changes)
    assert isinstance(result, Incoming), result
    return result.message


def test_a_direct_message() -> None:
    message = accepted("dm")
    assert message.platform is DISCORD
    assert (message.chat_id, message.thread_id, message.is_direct) == (DM, None, True)
    assert message.text == "hello there"
    assert message.sender.id == "80351110224678912"
    assert message.sender.display_name == "Ann Example"
    assert message.platform_message_id == f"{DM}:1311234567890123777"
    assert message.received_at == snowflake_time("1311234567890123777")
    assert message.session_key == f"discord:srv:{DM}"
    assert message.raw["content"] == "hello there"


def test_a_mention_in_a_server_channel() -> None:
    message = accepted("guild_mention")
    assert (message.is_direct, message.mentions_bot) == (False, True)
    assert message.text == "what's the plan with @Bob?"
    assert message.sender.display_name == "annie"  # the server nickname
    assert message.chat_id == GUILD_CHANNEL


def test_plain_server_chatter_is_for_no_one_unless_the_channel_is_configured() -> None:
    assert convert("guild_plain") == Skipped(NOT_ADDRESSED)
    message = accepted("guild_plain", channels=[GUILD_CHANNEL])
    assert (message.text, message.mentions_bot) == ("lunch anyone?", False)


def test_a_thread_message_goes_to_the_thread_of_its_parent_channel() -> None:
    message = accepted("thread_message")
    assert (message.chat_id, message.thread_id) == (GUILD_CHANNEL, THREAD)
    assert message.platform_message_id == f"{THREAD}:1311234620000000000"
    assert message.session_key == f"discord:srv:{GUILD_CHANNEL}:{THREAD}"
    assert message.text == "and in the thread?"
    # Threads of a configured channel are answered without a mention too.
    data = load("thread_message")
    data["content"], data["mentions"] = "no mention", []
    result = to_inbound(
        data,
        bot_id=BOT,
        account=AccountId("srv"),
        config=config(channels=[GUILD_CHANNEL]),
        channel=CHANNELS[THREAD],
        now=snowflake_time(data["id"]) or datetime.now(UTC),
    )
    assert isinstance(result, Incoming)


def test_a_reply_to_the_bot_addresses_it() -> None:
    message = accepted("reply_to_bot")
    assert message.mentions_bot
    assert message.reply_to == f"{GUILD_CHANNEL}:1311234605000000000"
    assert message.text == "why?"


def test_attachments_are_listed_and_oversized_ones_noted() -> None:
    result = convert("attachment")
    assert isinstance(result, Incoming)
    assert result.files == (
        FileRef(
            "https://cdn.discordapp.com/attachments/1311228000000000001/1311234639000000000/"
            "notes.pdf?ex=6746&is=6745&hm=ab",
            "application/pdf",
            52311,
            "notes.pdf",
        ),
    )
    assert result.message.text == (
        "summarise this\n[file huge.mov (524288000 bytes) not downloaded: larger than "
        "26214400 bytes]"
    )
    only_images = convert("attachment", attachment_types=["image/*"])
    assert isinstance(only_images, Incoming)
    assert only_images.files == ()


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("own_message", "the bot's own message"),
        ("bot_message", "a bot's message"),
        ("member_join", "message type 7 ignored"),
    ],
)
def test_skipped(name: str, reason: str) -> None:
    assert convert(name) == Skipped(reason)


def test_old_messages_are_skipped() -> None:
    result = convert("dm", late=7200)
    assert isinstance(result, Skipped)
    assert result.reason.startswith("older than backlog_max_age")


def test_a_history_entry_needs_its_channel_to_be_a_server_message() -> None:
    # History entries have no guild_id: without the channel they would look like DMs.
    message = accepted("history_entry", channel=CHANNELS[GUILD_CHANNEL])
    assert (message.is_direct, message.mentions_bot, message.text) == (False, True, "missed me?")


def test_a_server_message_in_an_unknown_channel_is_skipped() -> None:
    data = load("guild_mention")
    result = to_inbound(
        data,
        bot_id=BOT,
        account=AccountId("srv"),
        config=config(),
        channel=None,
        now=snowflake_time(data["id"]) or datetime.now(UTC),
    )
    assert result == Skipped("server message in a channel Herald cannot see")


@pytest.mark.parametrize("junk", [None, [], "text", {"id": "x"}, {"id": "1", "channel_id": "2"}])
def test_junk_is_skipped_not_raised(junk: Any) -> None:
    result = to_inbound(
        junk,
        bot_id=BOT,
        account=AccountId("srv"),
        config=config(),
        channel=None,
        now=datetime.now(UTC),
    )
    assert isinstance(result, Skipped)


def test_message_keys_and_snowflakes() -> None:
    assert message_key("12", "34") == "12:34"
    assert split_message_key("12:34") == ("12", "34")
    assert split_message_key("12:34:e1732616160500") == ("12", "34")  # an edit of it
    assert split_message_key("nope") is None
    assert split_message_key("12:abc") is None
    assert newer("9", "10") == "10"
    assert newer(None, "5") == "5"
    assert newer("5", None) == "5"
    when = snowflake_time("175928847299117063")
    assert when == datetime(2016, 4, 30, 11, 18, 25, 796000, tzinfo=UTC)


def test_channels_from_rest() -> None:
    assert channel_from({"id": "1", "type": 1}) == Channel("1", ChannelKind.DIRECT)
    assert channel_from({"id": "2", "type": 0, "guild_id": "9"}) == Channel("2", ChannelKind.GUILD)
    assert channel_from({"id": "3", "type": 11, "parent_id": "2"}) == Channel(
        "3", ChannelKind.THREAD, "2"
    )
    assert channel_from({"type": 0}) is None
    assert channel_from("junk") is None


def test_errors() -> None:
    limited = error_from(429, None, 2.5, "send")
    assert isinstance(limited, RateLimited)
    assert limited.retry_after == 2.5
    assert isinstance(error_from(401, 0, None, "login"), AuthError)
    assert isinstance(error_from(403, 50013, None, "send"), PermanentSendError)
    assert isinstance(error_from(404, 10003, None, "send"), PermanentSendError)
    assert isinstance(error_from(502, None, None, "send"), NotReady)
    assert isinstance(error_from(None, None, None, "send"), NotReady)


def test_an_edit_names_the_message_it_changes() -> None:
    data = load("message_update")
    edited = to_inbound(
        data,
        bot_id=BOT,
        account=AccountId("srv"),
        config=config(),
        channel=None,
        now=datetime(2024, 11, 26, 10, 16, 5, tzinfo=UTC),
        edit=True,
    )
    assert isinstance(edited, Incoming), edited
    original = message_key(DM, "1311234567890123777")
    assert edited.message.text == "hello there, edited"
    assert edited.message.edit_of == original
    assert edited.message.platform_message_id == f"{original}:e1732616160500"
    assert accepted("dm").edit_of is None
    not_an_edit = {**data, "edited_timestamp": None}
    assert isinstance(
        to_inbound(
            not_an_edit,
            bot_id=BOT,
            account=AccountId("srv"),
            config=config(),
            channel=None,
            now=datetime(2024, 11, 26, 10, 16, 5, tzinfo=UTC),
            edit=True,
        ),
        Skipped,
    )


def test_a_reaction_in_a_thread_belongs_to_the_thread() -> None:
    data = load("reaction_add")
    reaction = reaction_from(
        data, bot_id=BOT, account=AccountId("srv"), channel=CHANNELS[THREAD], now=NOW
    )
    assert not isinstance(reaction, Skipped)
    assert (reaction.chat_id, reaction.thread_id, reaction.emoji) == (GUILD_CHANNEL, THREAD, "👍")
    assert reaction.message == message_key(THREAD, "1311234567890123999")
    assert (reaction.sender.display_name, reaction.is_direct) == ("Ann Example", False)
    own = {**data, "user_id": BOT}
    assert reaction_from(
        own, bot_id=BOT, account=AccountId("srv"), channel=None, now=NOW
    ) == Skipped("the bot's own reaction")
    # Another bot's reaction is skipped like its messages are (two bots must not loop).
    member = {**data["member"], "user": {**data["member"]["user"], "bot": True}}
    other = reaction_from(
        {**data, "member": member}, bot_id=BOT, account=AccountId("srv"), channel=None, now=NOW
    )
    assert other == Skipped("a bot's reaction")


def test_a_reaction_taken_back_and_added_again_counts_again() -> None:
    """Discord sends no id for a reaction event and never redelivers one: the same person's
    same emoji on the same message, added again later (after "not all here yet" on an
    approval question), is a new reaction, not a duplicate of the first."""
    data, account = load("reaction_add"), AccountId("srv")
    first = reaction_from(data, bot_id=BOT, account=account, channel=None, now=NOW)
    again = reaction_from(
        data, bot_id=BOT, account=account, channel=None, now=NOW + timedelta(seconds=30)
    )
    assert isinstance(first, Reaction)
    assert isinstance(again, Reaction)
    assert first.event_id != again.event_id
    assert again.received_at == NOW + timedelta(seconds=30)
