"""Telegram updates → InboundMessage, against recorded Bot API payloads (tests/data/telegram)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Conflict,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TimedOut,
)

from adapters.inbound import Incoming, Skipped, message_key
from adapters.telegram import PLATFORM as TELEGRAM
from adapters.telegram.config import TelegramConfig
from adapters.telegram.convert import (
    BotIdentity,
    FileRef,
    error_from,
    parse_update,
    split_message_key,
    to_inbound,
)
from gateway.contracts.errors import (
    AuthError,
    MarkupRejected,
    NotReady,
    PermanentSendError,
    RateLimited,
)
from gateway.contracts.ids import AccountId

DATA = Path(__file__).resolve().parents[1] / "data" / "telegram"
BOT = BotIdentity(5000000001, "herald_bot")
SENT = datetime.fromtimestamp(1795000000, UTC)


def payload(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))
    return data


def config(**changes: Any) -> TelegramConfig:
    return TelegramConfig(token=SecretStr("1:x"), account="bot", **changes)


def convert(
    name: str, *, now: datetime = SENT + timedelta(seconds=5), **changes: Any
) -> Incoming[FileRef] | Skipped:
    update = parse_update(payload(name))
    assert not isinstance(update, Skipped)
    return to_inbound(update, bot=BOT, account=AccountId("bot"), config=config(**changes), now=now)


def accepted(name: str, **changes: Any) -> Incoming[FileRef]:
    result = convert(name, **changes)
    assert isinstance(result, Incoming), result
    return result


def test_direct_message() -> None:
    message = accepted("dm_text").message
    assert message.platform is TELEGRAM
    assert message.account == "bot"
    assert message.chat_id == "111111111"
    assert message.platform_message_id == "111111111:11"
    assert (message.sender.id, message.sender.display_name, message.sender.is_bot) == (
        "111111111",
        "Ann Lee",
        False,
    )
    assert message.text == "Hello Herald, what's on today?"
    assert message.is_direct
    assert message.thread_id is None
    assert message.reply_to is None
    assert message.received_at == SENT
    assert message.raw["update_id"] == 900000001


def test_group_mention_after_an_emoji_uses_utf16_offsets() -> None:
    message = accepted("group_mention").message
    assert not message.is_direct
    assert message.mentions_bot
    assert message.chat_id == "-1001234567890"
    assert message.text == "👋 @herald_bot summarise the thread"


def test_group_message_not_addressed_to_the_bot_is_skipped() -> None:
    assert convert("group_not_addressed") == Skipped("group message that does not address the bot")


def test_group_trigger_all_takes_every_message() -> None:
    assert isinstance(convert("group_not_addressed", group_trigger="all"), Incoming)


def test_group_trigger_reply_only_ignores_mentions() -> None:
    assert isinstance(convert("group_mention", group_trigger=["reply"]), Skipped)
    assert isinstance(convert("group_reply_to_bot", group_trigger=["reply"]), Incoming)


def test_group_trigger_mention_only_ignores_replies() -> None:
    assert isinstance(convert("group_reply_to_bot", group_trigger="mention"), Skipped)


def test_command_addressed_to_the_bot_loses_its_suffix() -> None:
    message = accepted("group_command_for_bot").message
    assert message.text == "/status"
    assert message.mentions_bot


def test_command_for_another_bot_is_skipped() -> None:
    assert convert("group_command_other_bot") == Skipped("a command for another bot")


def test_command_in_a_direct_chat_keeps_its_argument() -> None:
    assert accepted("dm_command").message.text == "/mode steer"


def test_reply_to_the_bot_in_a_group_triggers_and_quotes() -> None:
    message = accepted("group_reply_to_bot").message
    assert message.reply_to == "-1001234567890:505"
    assert message.mentions_bot
    assert message.text == (
        "> (replying to Herald)\n> Here is the long summary you asked for.\n\nmake it shorter"
    )


def test_reply_in_a_direct_chat_quotes_the_replied_text() -> None:
    message = accepted("dm_reply_to_own").message
    assert message.reply_to == "111111111:9"
    assert message.text.endswith("> I'd skip the 3 pm meeting.\n\nwhy?")


def test_forum_topic_is_the_thread_and_the_topic_root_is_not_a_reply() -> None:
    message = accepted("forum_topic").message
    assert message.thread_id == "42"
    assert message.reply_to is None
    assert message.text == "status of the release?"  # the leading mention is removed
    assert message.session_key == "telegram:bot:-1009876543210:42"


def test_photo_takes_the_largest_size_and_the_caption() -> None:
    incoming = accepted("photo_caption")
    assert incoming.message.text == "What is in this picture?"
    assert incoming.files == (FileRef("AgAD-large", "image/jpeg", 48210, "photo_Lg1.jpg"),)


def test_document_without_text_is_accepted_for_its_file() -> None:
    incoming = accepted("document")
    assert incoming.message.text == ""
    assert incoming.files == (FileRef("BQAD-doc", "application/pdf", 183402, "report Q3.pdf"),)


def test_files_over_the_size_limit_become_a_note() -> None:
    incoming = accepted("document", attachment_max_bytes=1000)
    assert incoming.files == ()
    assert "not downloaded: larger than 1000 bytes" in incoming.message.text


def test_files_of_other_types_become_a_note() -> None:
    incoming = accepted("document", attachment_types=["image/*"])
    assert incoming.files == ()
    assert "type not allowed" in incoming.message.text
    assert accepted("photo_caption", attachment_types=["image/*"]).files


def test_an_edit_names_the_message_it_changes() -> None:
    message = accepted("edited").message
    assert message.text == "Hello Herald, what's on tomorrow?"
    update_id = payload("edited")["update_id"]
    assert message.platform_message_id == f"111111111:11:e{1795000030}-{update_id}"
    assert message.edit_of == "111111111:11"
    assert message.received_at == SENT + timedelta(seconds=30)
    assert accepted("dm_text").message.edit_of is None


def test_two_edits_in_one_second_are_two_edits() -> None:
    """`edit_date` counts seconds: a second edit within the same second is not a redelivery
    of the first (whose text it would then lose); a redelivery keeps its update id."""
    data = payload("edited")
    second = parse_update({**data, "update_id": data["update_id"] + 1})
    assert not isinstance(second, Skipped)
    now = SENT + timedelta(seconds=35)
    again = to_inbound(second, bot=BOT, account=AccountId("bot"), config=config(), now=now)
    assert isinstance(again, Incoming)
    first = accepted("edited").message
    assert again.message.platform_message_id != first.platform_message_id
    assert accepted("edited").message.platform_message_id == first.platform_message_id


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("sticker", "nothing Herald can read (sticker)"),
        ("channel_post", "no message in the update"),
    ],
)
def test_updates_without_a_readable_message_are_skipped(name: str, reason: str) -> None:
    assert convert(name) == Skipped(reason)


def test_messages_older_than_the_backlog_limit_are_skipped() -> None:
    late = SENT + timedelta(hours=2)
    result = convert("dm_text", now=late)
    assert isinstance(result, Skipped)
    assert result.reason.startswith("older than backlog_max_age")
    assert isinstance(convert("dm_text", now=late, backlog_max_age=3 * 3600), Incoming)


@pytest.mark.parametrize("data", [None, [], {"message": {}}, {"update_id": "7"}, "text"])
def test_junk_is_not_an_update(data: Any) -> None:
    assert parse_update(data) == Skipped("not an update object")


def test_message_keys_round_trip() -> None:
    key = message_key(-100123, 55)
    assert key == "-100123:55"
    assert split_message_key(key) == ("-100123", 55)
    assert split_message_key("55") == ("", 55)
    assert split_message_key("chat:abc") is None
    assert split_message_key(f"{key}:e1795000030") == ("-100123", 55)  # an edit of it


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (RetryAfter(7), RateLimited),
        (InvalidToken("Unauthorized"), AuthError),
        (BadRequest("Can't parse entities: unclosed tag"), MarkupRejected),
        (BadRequest("Bad Request: chat not found"), PermanentSendError),
        (Forbidden("Forbidden: bot was blocked by the user"), PermanentSendError),
        (ChatMigrated(-1009), PermanentSendError),
        (Conflict("terminated by other getUpdates request"), NotReady),
        (TimedOut(), NotReady),
        (NetworkError("Bad Gateway"), NotReady),
    ],
)
def test_errors_say_what_to_do_next(error: Exception, expected: type[Exception]) -> None:
    assert isinstance(
        error,
        BadRequest | ChatMigrated | Conflict | Forbidden | NetworkError | InvalidToken | RetryAfter,
    )
    mapped = error_from(error, "sendMessage")
    assert type(mapped) is expected
    assert "telegram: sendMessage" in str(mapped)
    if isinstance(mapped, RateLimited):
        assert mapped.retry_after == 7.0


def test_an_error_quoting_the_token_keeps_only_the_bot_id() -> None:
    # A base_url without `/bot` makes httpx read the token as the port.
    token = "8101123456789:AAH-convert-secret-token-0123456789"
    error = NetworkError(f"Unknown error in HTTP implementation: Invalid port: '1{token}'")

    mapped = error_from(error, "getMe")

    assert token.split(":")[1] not in str(mapped)
    assert "Invalid port: '18101123456789:***'" in str(mapped)
