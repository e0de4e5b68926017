"""signal-cli events → InboundMessage / Reaction, Markdown → Signal text styles, JSON-RPC
errors → Herald errors, targets, against payloads shaped as signal-cli's JSON writes them
(tests/data/signal: its `JsonMessageEnvelope`, `JsonDataMessage`, … records)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from adapters.inbound import Incoming, Skipped
from adapters.signal import SPEC
from adapters.signal.config import SignalConfig
from adapters.signal.convert import (
    NOT_ADDRESSED,
    OWN,
    AttachmentRef,
    error_from,
    is_group,
    message_id,
    recipient,
    split_message_id,
    to_event,
    to_signal,
)
from gateway.contracts.errors import NotReady, PermanentSendError, RateLimited
from gateway.contracts.ids import AccountId
from gateway.contracts.messages import Reaction
from gateway.contracts.platform import ChatAddress

DATA = Path(__file__).parents[1] / "data" / "signal"
ME = "+15550009999"
ANN = "+15551230001"
GROUP = "Pmpi+EfPWmsxiomLe9Nx2XF9HOE483p6iKiFj65iMwI="
T = 1764392400000
NOW = datetime.fromtimestamp(T / 1000, UTC) + timedelta(seconds=2)
CONFIG = SignalConfig(number=ME, allowed_users=(ANN,))
ACCOUNT = AccountId("default")


def event(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DATA / name).read_text())
    return loaded


def convert(
    name: str, config: SignalConfig = CONFIG
) -> Incoming[AttachmentRef] | Reaction | Skipped:
    return to_event(event(name), config=config, account=ACCOUNT, now=NOW)


def incoming(name: str, config: SignalConfig = CONFIG) -> Incoming[AttachmentRef]:
    found = convert(name, config)
    assert isinstance(found, Incoming), found
    return found


def test_a_direct_message() -> None:
    found = incoming("dm_text.json")
    message = found.message
    assert message.text == "hello Herald"
    assert message.chat_id == ANN
    assert message.sender.id == ANN
    assert message.sender.display_name == "Ann"
    assert message.is_direct
    assert message.platform_message_id == f"{ANN}:{ANN}:{T}"
    assert found.files == ()


def test_group_chatter_is_skipped_unless_the_group_is_listed() -> None:
    assert convert("group_chatter.json") == Skipped(NOT_ADDRESSED)
    listed = SignalConfig(number=ME, groups=(GROUP,))
    message = incoming("group_chatter.json", listed).message
    assert message.chat_id == GROUP
    assert not message.is_direct
    assert message.platform_message_id == f"{GROUP}:{ANN}:{T}"


def test_a_mention_of_the_account_addresses_it_and_is_written_out() -> None:
    message = incoming("group_mention.json").message
    assert message.mentions_bot
    assert message.text == f"@{ME} what is on today?"


def test_an_attachment_is_a_file_to_fetch_and_a_refused_type_a_note() -> None:
    found = incoming("attachment.json")
    assert found.files == (
        AttachmentRef("gV2Zx0uAq4ku6ycr6fQa.pdf", "application/pdf", 48213, "report.pdf"),
    )
    images_only = SignalConfig(number=ME, attachment_types=("image/*",))
    refused = incoming("attachment.json", images_only)
    assert refused.files == ()
    assert "not downloaded: type not allowed" in refused.message.text


def test_a_voice_note_without_a_name_gets_one_with_its_extension() -> None:
    [ref] = incoming("voice_note.json").files
    assert ref.mime_type == "audio/aac"
    assert ref.filename.startswith("n3iFtq0S4hXH7bl0wQ9v")
    assert ref.filename.endswith(".aac")


def test_a_quote_of_the_bot_is_a_reply_to_its_message() -> None:
    message = incoming("quote.json").message
    assert message.reply_to == f"{ANN}:{ME}:{T - 60000}"
    assert message.mentions_bot
    assert message.text == "[replying to: Today: nothing planned.]\nand tomorrow?"


def test_an_edit_names_the_message_it_changes() -> None:
    message = incoming("edit.json").message
    assert message.edit_of == f"{ANN}:{ANN}:{T - 30000}"
    assert message.platform_message_id == f"{ANN}:{ANN}:{T - 30000}:e{T}"
    assert message.text == "hello Herald, again"
    assert split_message_id(message.platform_message_id) == split_message_id(message.edit_of)


def test_a_reaction_names_the_message_reacted_to() -> None:
    found = convert("reaction.json")
    assert isinstance(found, Reaction)
    assert found.emoji == "👍"
    assert found.message == f"{ANN}:{ME}:{T - 5000}"
    assert found.event_id == f"{ANN}:{T}"
    assert convert("reaction_removed.json") == Skipped("a reaction taken back")


@pytest.mark.parametrize("name", ["typing.json", "receipt.json"])
def test_envelopes_that_are_no_message_are_skipped(name: str) -> None:
    found = convert(name)
    assert isinstance(found, Skipped)
    assert found.reason.startswith("no message")


def test_the_accounts_own_messages_are_skipped() -> None:
    assert convert("sync_sent.json") == Skipped(OWN)


def test_an_old_message_is_skipped() -> None:
    later = NOW + timedelta(days=2)
    found = to_event(event("dm_text.json"), config=CONFIG, account=ACCOUNT, now=later)
    assert found == Skipped("older than backlog_max_age")


def test_markdown_becomes_text_styles_in_utf16_units() -> None:
    styled = to_signal("👋 **bold** and `code` and [docs](https://example.org)")
    assert styled.text == "👋 bold and code and docs (https://example.org)"
    assert styled.styles == ("3:4:BOLD", "12:4:MONOSPACE")
    assert to_signal("> quoted\n\nplain").text == "> quoted\n\nplain"


def test_rpc_errors_say_what_to_do_next() -> None:
    limited = event("rate_limited_error.json")["error"]
    found = error_from(limited["code"], limited["message"], limited["data"], "send")
    assert isinstance(found, RateLimited)
    assert found.retry_after == 3600
    gone = event("unregistered_error.json")["error"]
    assert isinstance(
        error_from(gone["code"], gone["message"], gone["data"], "send"), PermanentSendError
    )
    assert isinstance(error_from(-3, "network", None, "send"), NotReady)
    assert isinstance(error_from(-32603, "internal", None, "send"), NotReady)


def test_chats_are_addressed_as_a_recipient_or_a_group() -> None:
    assert recipient(ANN) == {"recipient": [ANN]}
    assert recipient(GROUP) == {"groupId": GROUP}
    assert is_group(GROUP)
    assert not is_group("a1b2c3d4-0000-4000-8000-00000000a001")
    assert split_message_id(message_id(GROUP, ANN, T)) is not None
    assert split_message_id("not:a:key") is None


def test_targets_take_numbers_as_twilio_does() -> None:
    assert SPEC.parse_target is not None
    assert SPEC.parse_target("signal", "+1 555 123-0001") == ChatAddress(ANN)
    assert SPEC.parse_target("signal", GROUP) == ChatAddress(GROUP)
    with pytest.raises(ValueError, match=r"E\.164"):
        SPEC.parse_target("signal", "+12")
    with pytest.raises(ValueError, match="Signal target"):
        SPEC.parse_target("signal", "#general")


def test_numbers_in_the_config_are_read_as_e164() -> None:
    config = SignalConfig.model_validate(
        {"number": 15550009999, "allowed_users": ["+1 (555) 123-0001", "*"]}
    )
    assert config.number == ME
    assert config.allowed_users == (ANN, "*")
    with pytest.raises(ValueError, match=r"E\.164"):
        SignalConfig.model_validate({"number": "555-0199"})
    with pytest.raises(ValueError, match="API path"):
        SignalConfig.model_validate({"number": ME, "url": "http://127.0.0.1:8080/api/v1/rpc"})
