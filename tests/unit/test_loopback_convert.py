"""Loopback payloads ⇄ normalized messages, and HTTP answers ⇄ Herald errors."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from adapters.inbound import Skipped
from adapters.loopback import PLATFORM as TEST
from adapters.loopback.convert import (
    DEFAULT_RETRY_AFTER,
    parse_error,
    to_edit_payload,
    to_inbound,
    to_send_payload,
    to_typing_payload,
    update_id_of,
)
from gateway.contracts.errors import (
    AuthError,
    MarkupRejected,
    NotReady,
    PermanentSendError,
    RateLimited,
)
from gateway.contracts.ids import (
    AccountId,
    ChatId,
    ExternalUserId,
    PlatformMessageId,
    SessionKey,
    ThreadId,
)
from gateway.contracts.messages import (
    Attachment,
    InboundMessage,
    OutboundMessage,
    Sender,
    TextFormat,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "loopback"
ACCOUNT = AccountId("bot1")


def recorded(name: str) -> Any:
    return json.loads((DATA / name).read_text(encoding="utf-8"))


def inbound(name: str) -> InboundMessage:
    message = to_inbound(recorded(name), ACCOUNT)
    assert isinstance(message, InboundMessage), message
    return message


def test_direct_message() -> None:
    message = inbound("dm.json")
    assert message == InboundMessage(
        platform=TEST,
        account=ACCOUNT,
        chat_id=ChatId("dm-alice"),
        sender=Sender(ExternalUserId("u-alice"), "Alice Liddell", is_bot=False),
        text="Hi Herald, what's on my calendar today?",
        platform_message_id=PlatformMessageId("m41"),
        is_direct=True,
        mentions_bot=False,
        thread_id=None,
        reply_to=None,
        received_at=datetime(2026, 1, 1, 0, 0, 0, 250000, tzinfo=UTC),
        raw=recorded("dm.json"),
    )
    assert message.session_key == SessionKey("test:bot1:dm-alice")


def test_group_message_that_mentions_the_bot() -> None:
    message = inbound("group_mention.json")
    assert not message.is_direct
    assert message.mentions_bot
    assert message.reply_to == PlatformMessageId("s7")
    assert message.sender == Sender(ExternalUserId("u-bob"), "Bob")
    assert message.received_at == datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
    assert message.session_key == SessionKey("test:bot1:g-team")


def test_message_in_a_thread() -> None:
    message = inbound("thread.json")
    assert message.thread_id == ThreadId("t-release")
    assert message.text == "Release notes: 🚀 v2 ships Friday"
    assert message.session_key == SessionKey("test:bot1:g-team:t-release")
    assert message.received_at.tzinfo is UTC


def test_integer_ids_and_missing_optional_fields_are_accepted() -> None:
    update = {
        "update_id": 5,
        "message": {
            "message_id": 77,
            "chat": {"id": -100, "type": "group"},
            "from": {"id": 9},
            "text": "",
            "date": 0,
        },
    }
    message = to_inbound(update, ACCOUNT)
    assert isinstance(message, InboundMessage)
    assert (message.platform_message_id, message.chat_id) == ("77", "-100")
    assert message.sender == Sender(ExternalUserId("9"), "", is_bot=False)
    assert (message.thread_id, message.reply_to, message.mentions_bot) == (None, None, False)
    assert message.received_at == datetime(1970, 1, 1, tzinfo=UTC)


JUNK: list[dict[str, Any]] = recorded("junk.json")


@pytest.mark.parametrize("case", JUNK, ids=[case["update"] for case in JUNK])
def test_junk_is_skipped_with_a_reason(case: dict[str, Any]) -> None:
    assert to_inbound(case["payload"], ACCOUNT) == Skipped(case["reason"])


@pytest.mark.parametrize(
    ("update", "expected"),
    [
        ({"update_id": 3}, 3),
        ({"update_id": "3"}, None),
        ({"update_id": True}, None),
        ({}, None),
        ([], None),
        (None, None),
    ],
)
def test_update_id_of(update: Any, expected: int | None) -> None:
    assert update_id_of(update) == expected


def outbound(**changes: Any) -> OutboundMessage:
    fields: dict[str, Any] = {
        "platform": TEST,
        "account": ACCOUNT,
        "chat_id": ChatId("dm-alice"),
        "text": "**Done.** See `notes.md`.",
        "idempotency_key": "s1:t2:0",
    }
    fields.update(changes)
    return OutboundMessage(**fields)


def test_send_payload_keeps_markdown_as_is() -> None:
    assert to_send_payload(outbound()) == {
        "chat_id": "dm-alice",
        "thread_id": None,
        "text": "**Done.** See `notes.md`.",
        "format": "markdown",
        "reply_to": None,
        "idempotency_key": "s1:t2:0",
        "recovered": False,
    }


def test_send_payload_of_a_recovered_plain_reply_in_a_thread() -> None:
    message = outbound(
        chat_id=ChatId("g-team"),
        thread_id=ThreadId("t-release"),
        format=TextFormat.PLAIN,
        reply_to=PlatformMessageId("m43"),
        recovered=True,
    )
    payload = to_send_payload(message)
    assert payload["thread_id"] == "t-release"
    assert payload["format"] == "plain"
    assert payload["reply_to"] == "m43"
    assert payload["recovered"] is True
    assert json.loads(json.dumps(payload)) == payload


def test_attachments_become_lines_of_text(tmp_path: Path) -> None:
    attachment = Attachment(tmp_path / "report.pdf", "application/pdf", 2048)
    payload = to_send_payload(outbound(text="Here it is.", attachments=(attachment,)))
    assert payload["text"] == "Here it is.\n[attachment: report.pdf (application/pdf, 2048 bytes)]"


def test_edit_and_typing_payloads() -> None:
    assert to_edit_payload(PlatformMessageId("s9"), outbound(text="v2")) == {
        "chat_id": "dm-alice",
        "message_id": "s9",
        "text": "v2",
        "format": "markdown",
    }
    assert to_typing_payload(ChatId("g"), ThreadId("t")) == {"chat_id": "g", "thread_id": "t"}
    assert to_typing_payload(ChatId("g"), None) == {"chat_id": "g", "thread_id": None}


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (401, {"ok": False, "error": "unauthorized"}, AuthError),
        (400, {"ok": False, "error": "bad request: can't parse entities"}, MarkupRejected),
        (400, {"ok": False, "error": "message not found"}, PermanentSendError),
        (400, None, PermanentSendError),
        (403, {"ok": False, "error": "bot was blocked by the user"}, PermanentSendError),
        (404, {"ok": False, "error": "not found"}, PermanentSendError),
        (408, None, NotReady),
        (500, {"ok": False, "error": "internal server error"}, NotReady),
        (502, "<html>bad gateway</html>", NotReady),
        (503, None, NotReady),
    ],
)
def test_parse_error(status: int, body: Any, kind: type[Exception]) -> None:
    error = parse_error(status, body, {})
    assert type(error) is kind
    assert f"HTTP {status}" in str(error)


def test_markup_rejection_is_a_permanent_error_with_its_own_class() -> None:
    error = parse_error(400, {"ok": False, "error": "bad request: can't parse entities"}, {})
    assert isinstance(error, PermanentSendError)
    assert "can't parse entities" in str(error)


@pytest.mark.parametrize(
    ("body", "headers", "retry_after"),
    [
        ({"ok": False, "retry_after": 2.5}, {}, 2.5),
        ({"ok": False, "retry_after": 7}, {"Retry-After": "1"}, 7.0),
        ({"ok": False}, {"Retry-After": "3"}, 3.0),
        ({"ok": False}, {"retry-after": "0.25"}, 0.25),
        ({"ok": False, "retry_after": "soon"}, {"Retry-After": "4"}, 4.0),
        (None, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, DEFAULT_RETRY_AFTER),
        ({"ok": False, "retry_after": -5}, {}, DEFAULT_RETRY_AFTER),
        (None, {}, DEFAULT_RETRY_AFTER),
    ],
)
def test_rate_limited_carries_retry_after(
    body: Any, headers: dict[str, str], retry_after: float
) -> None:
    error = parse_error(429, body, headers)
    assert isinstance(error, RateLimited)
    assert error.retry_after == retry_after
