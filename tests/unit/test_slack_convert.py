"""Slack event callbacks → InboundMessage, against recorded payloads (tests/data/slack)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from adapters.inbound import FileRef, Incoming, Skipped, message_key
from adapters.slack import PLATFORM as SLACK
from adapters.slack.config import SlackConfig
from adapters.slack.convert import (
    NOT_ADDRESSED,
    BotIdentity,
    error_from,
    reaction_from,
    split_message_key,
    to_inbound,
)
from gateway.contracts.errors import AuthError, NotReady, PermanentSendError, RateLimited
from gateway.contracts.ids import AccountId

DATA = Path(__file__).resolve().parents[1] / "data" / "slack"
BOT = BotIdentity("UBOT", "B0HERALD")
SENT = datetime.fromtimestamp(1795000000, UTC)


def config(**changes: Any) -> SlackConfig:
    return SlackConfig(
        bot_token=SecretStr("xoxb-1"), app_token=SecretStr("xapp-1"), account="ws", **changes
    )


def convert(
    name: str, *, now: datetime = SENT + timedelta(seconds=5), **changes: Any
) -> Incoming[FileRef] | Skipped:
    body = json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))
    return to_inbound(body, bot=BOT, account=AccountId("ws"), config=config(**changes), now=now)


def accepted(name: str, **changes: Any) -> Incoming[FileRef]:
    result = convert(name, **changes)
    assert isinstance(result, Incoming), result
    return result


def test_direct_message() -> None:
    message = accepted("dm").message
    assert message.platform is SLACK
    assert (message.chat_id, message.sender.id) == ("D0ANN", "U0ANN")
    assert message.platform_message_id == "D0ANN:1795000000.000100"
    assert message.text == "What's on my calendar & why?"
    assert message.is_direct
    assert message.thread_id is None  # a top-level DM is answered top-level
    assert message.received_at == SENT + timedelta(microseconds=100)
    assert message.session_key == "slack:ws:D0ANN"


def test_mention_in_a_channel_is_answered_in_a_thread_under_it() -> None:
    message = accepted("app_mention").message
    assert not message.is_direct
    assert message.mentions_bot
    assert message.thread_id == "1795000000.000200"
    assert message.text == "summarise #general for @U0BOB"


def test_a_thread_reply_stays_in_its_thread() -> None:
    message = accepted("thread_reply").message
    assert message.thread_id == "1795000000.000200"
    assert message.platform_message_id == "C0GEN:1795000000.000500"


def test_a_reply_in_a_direct_thread_keeps_the_thread() -> None:
    assert accepted("dm_thread").message.thread_id == "1795000000.000100"


def test_channel_messages_without_a_mention_need_a_configured_channel() -> None:
    assert convert("channel_plain") == Skipped(NOT_ADDRESSED)
    message = accepted("channel_plain", channels=["C0GEN"]).message
    assert (message.text, message.mentions_bot) == ("lunch?", False)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("bot_message", "message subtype 'bot_message' ignored"),
        ("own_message", "a bot's message"),
        ("deleted", "deleted message (an answer already sent stays)"),
        ("reaction_added", "event type 'reaction_added' is not a message"),
    ],
)
def test_events_that_do_not_reach_the_agent(name: str, reason: str) -> None:
    assert convert(name) == Skipped(reason)


def test_an_edit_names_the_message_it_changes() -> None:
    message = accepted("edited").message
    assert message.text == "What's on my calendar tomorrow?"
    assert message.platform_message_id == "D0ANN:1795000000.000100:e1795000040.000000"
    assert message.edit_of == "D0ANN:1795000000.000100"
    assert message.received_at == SENT + timedelta(seconds=40)


def test_shared_files_are_downloaded_within_the_limits() -> None:
    incoming = accepted("file_share")
    assert incoming.message.text == "see attached"
    assert incoming.files == (
        FileRef(
            "https://files.slack.com/files-pri/T0TEAM-F0PDF/download/report_q3.pdf",
            "application/pdf",
            183402,
            "report Q3.pdf",
        ),
    )
    small = accepted("file_share", attachment_max_bytes=1000)
    assert small.files == ()
    assert "not downloaded: larger than 1000 bytes" in small.message.text


def test_old_events_are_skipped() -> None:
    result = convert("dm", now=SENT + timedelta(hours=2))
    assert isinstance(result, Skipped)
    assert result.reason.startswith("older than backlog_max_age")


@pytest.mark.parametrize("body", [None, {}, {"event": "x"}, {"event": {"type": "message"}}])
def test_junk_is_skipped_not_raised(body: Any) -> None:
    result = to_inbound(body, bot=BOT, account=AccountId("ws"), config=config(), now=SENT)
    assert isinstance(result, Skipped)


def test_message_keys_round_trip() -> None:
    key = message_key("C1", "1795000000.000100")
    assert split_message_key(key) == ("C1", "1795000000.000100")
    assert split_message_key(f"{key}:e1.2") == ("C1", "1795000000.000100")
    assert split_message_key("nonsense") is None


@pytest.mark.parametrize(
    ("status", "error", "retry_after", "expected"),
    [
        (429, "ratelimited", "7", RateLimited),
        (200, "invalid_auth", None, AuthError),
        (200, "missing_scope", None, AuthError),
        (200, "channel_not_found", None, PermanentSendError),
        (200, "msg_too_long", None, PermanentSendError),
        (503, None, None, NotReady),
        (200, "internal_error", None, NotReady),
    ],
)
def test_errors_say_what_to_do_next(
    status: int, error: str | None, retry_after: str | None, expected: type[Exception]
) -> None:
    mapped = error_from(status, error, retry_after, "chat.postMessage")
    assert type(mapped) is expected
    assert str(mapped).startswith("slack: chat.postMessage:")
    if isinstance(mapped, RateLimited):
        assert mapped.retry_after == 7.0


def test_socket_mode_needs_the_app_token_and_events_the_signing_secret() -> None:
    with pytest.raises(ValueError, match="app_token"):
        SlackConfig(bot_token=SecretStr("xoxb-1"))
    with pytest.raises(ValueError, match="signing_secret"):
        SlackConfig(bot_token=SecretStr("xoxb-1"), mode="events")


def test_a_reaction_to_a_message() -> None:
    body = json.loads((DATA / "reaction_added.json").read_text(encoding="utf-8"))
    reaction = reaction_from(body, bot=BOT, account=AccountId("ws"))
    assert not isinstance(reaction, Skipped)
    assert (reaction.message, reaction.emoji, reaction.event_id) == (
        "D0ANN:1795000000.000100",
        "thumbsup",
        "Ev11",
    )
    assert (reaction.sender.id, reaction.is_direct) == ("U0ANN", True)
    own = {**body, "event": {**body["event"], "user": "UBOT"}}
    assert reaction_from(own, bot=BOT, account=AccountId("ws")) == Skipped("the bot's own reaction")
    on_file = {**body, "event": {**body["event"], "item": {"type": "file", "file": "F1"}}}
    assert isinstance(reaction_from(on_file, bot=BOT, account=AccountId("ws")), Skipped)
