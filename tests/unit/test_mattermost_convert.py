"""Mattermost payloads → InboundMessage / Reaction, button presses and slash commands
(signatures and tokens), errors → Herald errors, against recorded v4 websocket events and
integration requests (tests/data/mattermost)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from adapters.inbound import FileRef, Incoming, Skipped
from adapters.mattermost import SPEC
from adapters.mattermost.config import MattermostConfig
from adapters.mattermost.convert import (
    NOT_ADDRESSED,
    OWN_POST,
    Me,
    button_props,
    embedded,
    error_from,
    mentions_of,
    pending_post_id,
    pressed,
    reaction_from,
    send_mark,
    signature,
    slash_command,
    to_inbound,
)
from gateway.contracts.errors import AuthError, NotReady, PermanentSendError, RateLimited
from gateway.contracts.ids import AccountId
from gateway.contracts.messages import Button, InboundMessage, Reaction
from gateway.contracts.platform import ChatAddress, Host

DATA = Path(__file__).parents[1] / "data" / "mattermost"
NOW = datetime(2025, 11, 29, 5, 0, 10, tzinfo=UTC)
ME = Me("b0tb0tb0tb0tb0tb0tb0tb0t0a", "herald")
ACCOUNT = AccountId("default")
SECRET = "button-secret-0123456789"
TOKEN = "cmdtokencmdtokencmdtoken1a"
CONFIG = MattermostConfig.model_validate(
    {"url": "https://chat.example.com/", "token": "t" * 26, "backlog_max_age": 10**9}
)


def event(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text())
    return loaded


def convert(
    name: str, config: MattermostConfig = CONFIG, channel_type: str | None = None
) -> Incoming[FileRef] | Skipped:
    """The recorded event `name` converted (`channel_type`: what the adapter knows of the
    channel, for events that do not say)."""
    frame = event(name)
    data = frame["data"]
    return to_inbound(
        embedded(data, "post"),
        channel_type=data.get("channel_type", channel_type),
        mentions=mentions_of(data),
        me=ME,
        account=ACCOUNT,
        config=config,
        now=NOW,
        edit=frame["event"] == "post_edited",
    )


def test_a_direct_message() -> None:
    incoming = convert("posted_dm")
    assert isinstance(incoming, Incoming)
    message = incoming.message
    assert message.text == "hello herald"
    assert message.is_direct
    assert str(message.chat_id) == "dmdmdmdmdmdmdmdmdmdmdmdma1"
    assert message.platform_message_id == "dmdmdmdmdmdmdmdmdmdmdmdma1:p1p1p1p1p1p1p1p1p1p1p1p1p1"
    assert str(message.sender.id) == "annannannannannannannanna1"
    assert message.thread_id is None
    assert message.received_at == datetime.fromtimestamp(1764392401, UTC)


def test_a_mention_in_a_thread_with_a_file() -> None:
    incoming = convert("posted_channel_mention")
    assert isinstance(incoming, Incoming)
    message = incoming.message
    assert (message.text, message.is_direct, message.mentions_bot) == (
        "what does the report say?",
        False,
        True,
    )
    assert message.thread_id == "rootrootrootrootrootroota1"
    (ref,) = incoming.files
    assert ref == FileRef(
        "https://chat.example.com/api/v4/files/filefilefilefilefilefilea1",
        "application/pdf",
        5120,
        "report.pdf",
    )


def test_a_file_of_a_type_not_allowed_is_a_note() -> None:
    config = CONFIG.model_copy(update={"attachment_types": ("image/*",)})
    incoming = convert("posted_channel_mention", config)
    assert isinstance(incoming, Incoming)
    assert incoming.files == ()
    assert "[file report.pdf (application/pdf) not downloaded: type not allowed]" in (
        incoming.message.text
    )


def test_channel_chatter_is_skipped_unless_the_channel_is_listed() -> None:
    assert convert("posted_channel_plain") == Skipped(NOT_ADDRESSED)
    listed = CONFIG.model_copy(update={"channels": ("towntowntowntowntowntowna1",)})
    incoming = convert("posted_channel_plain", listed)
    assert isinstance(incoming, Incoming)
    assert incoming.message.text == "lunch anyone?"


def test_system_posts_own_posts_and_old_posts_are_skipped() -> None:
    assert isinstance(convert("posted_system"), Skipped)
    post = dict(embedded(event("posted_dm")["data"], "post") or {})
    own = to_inbound(
        {**post, "user_id": ME.user_id},
        channel_type="D",
        mentions=None,
        me=ME,
        account=ACCOUNT,
        config=CONFIG,
        now=NOW,
    )
    assert own == Skipped(OWN_POST)
    fresh = CONFIG.model_copy(update={"backlog_max_age": 60.0})
    old = to_inbound(
        post,
        channel_type="D",
        mentions=None,
        me=ME,
        account=ACCOUNT,
        config=fresh,
        now=datetime.fromtimestamp(1764392401, UTC) + timedelta(hours=2),
    )
    assert isinstance(old, Skipped)
    assert "older than backlog_max_age" in old.reason


def test_an_edit_names_the_post_it_changes() -> None:
    assert convert("post_edited") == Skipped(NOT_ADDRESSED)  # in a channel: no mention
    incoming = convert("post_edited", channel_type="D")
    assert isinstance(incoming, Incoming)
    message = incoming.message
    assert message.text == "hello herald, again"
    assert message.edit_of == "dmdmdmdmdmdmdmdmdmdmdmdma1:p1p1p1p1p1p1p1p1p1p1p1p1p1"
    assert message.platform_message_id == f"{message.edit_of}:e1764392405000"


def test_a_reaction() -> None:
    frame = event("reaction_added")
    reaction = reaction_from(
        embedded(frame["data"], "reaction"),
        channel_id=frame["broadcast"]["channel_id"],
        channel_type="D",
        me=ME,
        account=ACCOUNT,
        now=NOW,
    )
    assert isinstance(reaction, Reaction)
    assert (reaction.emoji, reaction.is_direct) == ("+1", True)
    assert reaction.message == "dmdmdmdmdmdmdmdmdmdmdmdma1:p5p5p5p5p5p5p5p5p5p5p5p5p5"
    assert (
        reaction.event_id
        == "p5p5p5p5p5p5p5p5p5p5p5p5p5:annannannannannannannanna1:+1:1764392406000"
    )
    own = reaction_from(
        {**(embedded(frame["data"], "reaction") or {}), "user_id": ME.user_id},
        channel_id=None,
        channel_type="D",
        me=ME,
        account=ACCOUNT,
        now=NOW,
    )
    assert isinstance(own, Skipped)


def press(context: dict[str, Any]) -> InboundMessage | Skipped:
    return pressed(
        {**event("action_request"), "context": context}, secret=SECRET, me=ME, account=ACCOUNT
    )


def test_a_signed_press_is_the_pressers_command() -> None:
    message = press({"command": "/approve 7", "signature": signature(SECRET, "/approve 7")})
    assert isinstance(message, InboundMessage)
    assert (message.text, str(message.sender.id)) == ("/approve 7", "bobbobbobbobbobbobbobbobb1")
    key = str(message.platform_message_id)
    assert key.startswith("towntowntowntowntowntowna1:p6p6p6p6p6p6p6p6p6p6p6p6p6:b")


@pytest.mark.parametrize(
    "context",
    [
        {"command": "/approve 7", "signature": "SIGNATURE"},
        {"command": "/approve 7"},
        {"command": "/approve 8", "signature": signature(SECRET, "/approve 7")},
        {"command": "/approve 7", "signature": signature("another secret", "/approve 7")},
        {"command": "/stop", "signature": signature(SECRET, "/stop")},
        {},
    ],
)
def test_a_forged_or_foreign_press_is_refused(context: dict[str, Any]) -> None:
    assert isinstance(press(context), Skipped)


def test_button_props_sign_each_command() -> None:
    props = button_props(
        (Button("Approve", "/approve 7"), Button("Deny", "/deny 7")),
        url="https://herald.example.com/webhooks/mattermost/actions",
        secret=SECRET,
    )
    approve, deny = props["attachments"][0]["actions"]
    assert (approve["type"], approve["style"], deny["style"]) == ("button", "success", "danger")
    assert approve["integration"]["context"] == {
        "command": "/approve 7",
        "signature": signature(SECRET, "/approve 7"),
    }
    assert approve["id"].isalnum()  # the server's action ids are letters and digits


def test_a_slash_command_with_its_token() -> None:
    body = (DATA / "slash_command.txt").read_bytes().strip()
    message = slash_command(body, token=TOKEN, me=ME, account=ACCOUNT)
    assert isinstance(message, InboundMessage)
    assert (message.text, str(message.chat_id)) == ("/deny 7", "dmdmdmdmdmdmdmdmdmdmdmdma1")
    assert isinstance(slash_command(body, token="x" * 26, me=ME, account=ACCOUNT), Skipped)
    assert isinstance(slash_command(b"\xff\xfe", token=TOKEN, me=ME, account=ACCOUNT), Skipped)
    plain = body.replace(b"text=deny+7", b"text=what+is+up")
    said = slash_command(plain, token=TOKEN, me=ME, account=ACCOUNT)
    assert isinstance(said, InboundMessage)
    assert said.text == "what is up"


@pytest.mark.parametrize(
    ("name", "kind"),
    [("error_429", RateLimited), ("error_401", AuthError)],
)
def test_recorded_errors(name: str, kind: type[Exception]) -> None:
    recorded = event(name)
    error = error_from(recorded["status"], recorded["body"], recorded["headers"], "POST /posts")
    assert isinstance(error, kind)
    if isinstance(error, RateLimited):
        assert error.retry_after == 3


def test_other_errors() -> None:
    assert isinstance(error_from(503, None, {}, "x"), NotReady)
    assert isinstance(error_from(403, {"message": "no"}, {}, "x"), PermanentSendError)
    assert isinstance(error_from(404, None, {}, "x"), PermanentSendError)


def test_pending_post_ids_and_marks_are_stable_per_chunk() -> None:
    first = pending_post_id(ME, "turn-1:0")
    assert first == pending_post_id(ME, "turn-1:0") != pending_post_id(ME, "turn-1:1")
    user, _, digits = first.partition(":")
    assert (user, len(digits), digits.isdigit()) == (ME.user_id, 13, True)
    assert send_mark("turn-1:0") == send_mark("turn-1:0") != send_mark("turn-1:1")


def test_mentions_of_reads_the_json_list() -> None:
    assert mentions_of(event("posted_channel_mention")["data"]) == (ME.user_id,)
    assert mentions_of({"mentions": "not json"}) == ()


def test_targets_and_validation() -> None:
    assert SPEC.parse_target is not None
    channel = "4xp9fdt7pbgium38k5k6w95oaa"
    assert SPEC.parse_target("mattermost", channel) == ChatAddress(channel)
    root = "rootrootrootrootrootroota1"
    assert SPEC.parse_target("mattermost", f"{channel}:{root}") == ChatAddress(channel, root)
    with pytest.raises(ValueError, match="26 letters"):
        SPEC.parse_target("mattermost", "town-square")
    assert SPEC.validate is not None
    buttons = CONFIG.model_copy(update={"public_url": "https://h.example.com"})
    with pytest.raises(ValueError, match="HTTP server"):
        SPEC.validate(buttons, Host(http_enabled=False))
    SPEC.validate(buttons, Host(http_enabled=True))
    with pytest.raises(ValueError, match="API path"):
        MattermostConfig.model_validate({"url": "https://chat.example.com/api/v4", "token": "t"})
    assert CONFIG.url == "https://chat.example.com"
