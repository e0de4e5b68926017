"""Twilio webhook forms → Herald messages and reports, Markdown → SMS / WhatsApp text, and the
config section, against recorded form bodies (tests/data/twilio)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from twilio.request_validator import RequestValidator

from adapters.inbound import Skipped
from adapters.twilio import PLATFORM as TWILIO
from adapters.twilio.config import TwilioConfig
from adapters.twilio.convert import (
    MAX_PART,
    Incoming,
    Keyword,
    StatusReport,
    error_from,
    keyword,
    parse_form,
    parts,
    to_inbound,
    to_sms,
    to_status,
    to_whatsapp,
)
from adapters.twilio.http import rest_url, retry_after
from gateway.contracts.errors import AuthError, NotReady, PermanentSendError, RateLimited
from gateway.contracts.ids import AccountId
from tests.fakes.twilio_server import DEFAULT_ACCOUNT_SID, DEFAULT_AUTH_TOKEN, sign

DATA = Path(__file__).resolve().parents[1] / "data" / "twilio"
NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def form(name: str) -> dict[str, str]:
    return dict(parse_form((DATA / f"{name}.form").read_bytes()))


def inbound(name: str) -> Incoming:
    result = to_inbound(form(name), account=AccountId("main"), now=NOW)
    assert isinstance(result, Incoming), result
    return result


def config(**changes: Any) -> TwilioConfig:
    values: dict[str, Any] = {
        "account_sid": DEFAULT_ACCOUNT_SID,
        "auth_token": DEFAULT_AUTH_TOKEN,
        "from_number": "+15550001111",
        "public_url": "https://herald.example.com/",
    }
    values.update(changes)
    return TwilioConfig.model_validate(values)


def test_sms() -> None:
    found = inbound("sms")
    message = found.message
    assert message.platform is TWILIO
    assert message.account == "main"
    assert (message.chat_id, message.sender.id) == ("+15551234567", "+15551234567")
    assert message.platform_message_id == "SMaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa1"
    assert message.text == "Hi Herald, what's on today? 😀"
    assert message.is_direct
    assert message.thread_id is None
    assert message.session_key == "twilio:main:+15551234567"
    assert found.media == ()
    assert found.keyword is None
    assert message.raw["ToCountry"] == "US"


def test_whatsapp_is_its_own_chat_with_the_profile_name() -> None:
    message = inbound("whatsapp").message
    assert message.chat_id == "whatsapp:+15551234567"
    assert message.sender.id == "whatsapp:+15551234567"
    assert message.sender.display_name == "Ann Example"
    assert message.text == "*Hello* from WhatsApp"


def test_mms_media_in_order() -> None:
    found = inbound("mms")
    assert [m.mime_type for m in found.media] == ["image/jpeg", "application/pdf"]
    assert found.media[0].url.endswith("/Media/ME000000000000000000000000000000a0")
    assert found.media[0].filename.endswith("-0.jpg")
    assert found.media[1].filename.endswith("-1.pdf")
    assert found.message.text == "Two files"


def test_keywords() -> None:
    assert inbound("stop").keyword is Keyword.STOP  # OptOutType from Advanced Opt-Out
    assert inbound("start").keyword is Keyword.START  # "unstop", by the body
    for word in ("STOP", "stopall", " Unsubscribe ", "cancel", "END", "quit", "stop!"):
        assert keyword(word) is Keyword.STOP, word
    for word in ("start", "YES", "unstop"):
        assert keyword(word) is Keyword.START, word
    assert keyword("help") is Keyword.HELP
    assert keyword("info.") is Keyword.HELP
    for text in ("please stop", "stop it", "", "starting", "yes please"):
        assert keyword(text) is None, text


def test_a_form_without_a_sid_or_sender_is_skipped() -> None:
    assert isinstance(to_inbound(form("no_sid"), account=AccountId("a"), now=NOW), Skipped)
    bad = {**form("sms"), "From": "client:anna"}
    assert isinstance(to_inbound(bad, account=AccountId("a"), now=NOW), Skipped)
    too_many = {**form("sms"), "NumMedia": "11"}
    assert isinstance(to_inbound(too_many, account=AccountId("a"), now=NOW), Skipped)
    missing = {**form("sms"), "NumMedia": "1"}
    assert isinstance(to_inbound(missing, account=AccountId("a"), now=NOW), Skipped)


def test_malformed_bodies() -> None:
    with pytest.raises(ValueError, match="bad query"):
        parse_form(b"just text")
    with pytest.raises(UnicodeDecodeError):
        parse_form(b"Body=\xff")
    assert parse_form(b"") == []


def test_status_reports() -> None:
    assert to_status(form("status_delivered")) == StatusReport(
        "SMfffffffffffffffffffffffffffff6", "delivered"
    )
    failed = to_status(form("status_undelivered"))
    assert isinstance(failed, StatusReport)
    assert failed.status == "undelivered"
    assert failed.error == "twilio undelivered: error 30003 (unreachable destination handset)"
    assert isinstance(to_status({"MessageSid": "SM1"}), Skipped)


def test_the_fake_signs_with_twilios_algorithm() -> None:
    fields = parse_form((DATA / "sms.form").read_bytes())
    url = "https://herald.example.com/webhooks/twilio/sms"
    signature = sign(DEFAULT_AUTH_TOKEN, url, fields)
    validator = RequestValidator(DEFAULT_AUTH_TOKEN)
    assert signature == validator.compute_signature(url, dict(fields))
    assert validator.validate(url, dict(fields), signature)
    assert not validator.validate(url + "x", dict(fields), signature)


def test_errors() -> None:
    assert isinstance(error_from(429, 20429, "Too Many Requests", "send"), RateLimited)
    assert isinstance(error_from(401, 20003, "Authenticate", "send"), AuthError)
    assert isinstance(error_from(503, None, "", "send"), NotReady)
    invalid = error_from(400, 21211, "Invalid 'To' Phone Number", "send")
    assert isinstance(invalid, PermanentSendError)
    assert "error 21211" in str(invalid)
    assert isinstance(error_from(400, 21610, "unsubscribed", "send"), PermanentSendError)
    assert retry_after({"Retry-After": "7"}) == 7.0
    assert retry_after({}) == 1.0
    assert retry_after({"Retry-After": "soon"}) == 1.0


def test_the_rest_base_is_replaced_in_one_place() -> None:
    api = "https://api.twilio.com/2010-04-01/Accounts/AC1/Messages.json"
    assert (
        rest_url(api, "http://127.0.0.1:9")
        == "http://127.0.0.1:9/2010-04-01/Accounts/AC1/Messages.json"
    )
    assert rest_url(api, "https://api.twilio.com") == api
    other = "https://media.example.com/x"
    assert rest_url(other, "http://127.0.0.1:9") == other
    assert rest_url("https://api.twilio.com.evil/x", "http://h") == "https://api.twilio.com.evil/x"


# -- outbound text ----------------------------------------------------------------------------

ANSWER = """# Plan

Some **bold**, _italic_, ~~old~~ and `code`. See [the docs](https://example.com/d).

* one
* **two**

```python
x = 1
```"""


def test_sms_is_readable_plain_text() -> None:
    assert (
        to_sms(ANSWER)
        == (
            "Plan\n\nSome bold, italic, old and code. See the docs (https://example.com/d).\n\n"
            "- one\n- two\n\nx = 1\n"
        ).strip()
    )


def test_whatsapp_has_its_own_styles() -> None:
    assert to_whatsapp(ANSWER) == (
        "*Plan*\n\nSome *bold*, _italic_, ~old~ and ```code```. "
        "See the docs (https://example.com/d).\n\n• one\n• *two*\n\n```x = 1```"
    )
    assert to_whatsapp("> **said**") == "> *said*"
    assert to_whatsapp("<https://a.example/x>") == "https://a.example/x"
    assert to_whatsapp("   ") == ""


def test_long_text_is_cut_at_sentences_and_paragraphs() -> None:
    sentence = "This sentence is part of a long answer. "
    text = (sentence * 30).strip() + "\n\n" + (sentence * 60).strip()
    pieces = parts(to_sms(text))
    assert len(pieces) >= 3
    assert all(len(p) <= MAX_PART for p in pieces)
    assert all(p.endswith(".") for p in pieces)
    assert " ".join(pieces).split() == text.split()
    assert parts("  ") == []


# -- config -----------------------------------------------------------------------------------


def test_config_numbers_and_urls() -> None:
    section = config(
        whatsapp_from="+1 (555) 000-2222",
        allowed_numbers=["+1 555 123 4567"],
        allowed_users=["+15559990000"],
    )
    assert section.whatsapp_from == "whatsapp:+15550002222"
    assert section.allowed_numbers == ("+15551234567",)
    assert section.allowed_users == (
        "+15559990000",
        "+15551234567",
        "whatsapp:+15551234567",
    )
    assert section.public_url == "https://herald.example.com"
    assert section.webhook_url("sms") == "https://herald.example.com/webhooks/twilio/sms"
    assert not section.pairing
    assert config(allowed_numbers="*").allowed_users == ("*",)


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"account_sid": "XY123"}, "account_sid"),
        ({"from_number": "5551234"}, "E.164"),
        ({"from_number": None}, "from_number"),
        ({"allowed_numbers": ["12"]}, "E.164"),
        ({"api_key": "SK" + "0" * 32}, "api_secret"),
        ({"public_url": "herald.example.com"}, "public_url"),
        ({"public_url": "https://h.example.com/?x=1"}, "public_url"),
    ],
)
def test_config_errors(changes: dict[str, Any], error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        config(**changes)
