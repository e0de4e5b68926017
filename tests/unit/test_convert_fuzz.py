"""Property-based fuzzing of every platform's `convert.py` with malformed and hostile payloads:
junk of every JSON type, recorded payloads with parts swapped for wrong types, huge or deeply
nested values, control characters, lone surrogates, and bytes that are not UTF-8. Each is
refused (`Skipped`, or a mail refused with a reason) or normalised into a message Herald can
store; none raises, and a good payload converted after it still converts (the functions keep
no state). The outbound converters (Markdown to each platform's markup) take any text too.

Bounded: few examples per property and no deadline (the machine is shared);
`HERALD_FUZZ_EXAMPLES=2000 pytest tests/unit/test_convert_fuzz.py` looks deeper.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from adapters.discord.config import DiscordConfig
from adapters.discord.convert import Channel, ChannelKind
from adapters.discord.convert import to_inbound as discord_inbound
from adapters.email.config import REFUSED, EmailConfig
from adapters.email.convert import (
    ReceivedMail,
    markdown_to_html,
    to_received,
    unreadable,
)
from adapters.inbound import Incoming, Skipped
from adapters.loopback.convert import render_markdown
from adapters.loopback.convert import to_inbound as loopback_inbound
from adapters.slack.config import SlackConfig
from adapters.slack.convert import BotIdentity as SlackBot
from adapters.slack.convert import to_inbound as slack_inbound
from adapters.slack.markup import to_mrkdwn
from adapters.telegram.config import TelegramConfig
from adapters.telegram.convert import BotIdentity as TelegramBot
from adapters.telegram.convert import parse_update
from adapters.telegram.convert import to_inbound as telegram_inbound
from adapters.telegram.markup import to_html, to_markdown_v2
from adapters.twilio.convert import parse_form, parts, to_sms, to_status, to_whatsapp
from adapters.twilio.convert import to_inbound as twilio_inbound
from gateway.contracts.ids import AccountId
from gateway.contracts.messages import InboundMessage
from gateway.storable import storable

DATA = Path(__file__).resolve().parents[1] / "data"
NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
FUZZ = settings(
    max_examples=int(os.environ.get("HERALD_FUZZ_EXAMPLES", "40")),  # more for a deeper look
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

HOSTILE = [
    "\ud800",
    "a\udfffb",
    "\x00",
    "\x1b[2J\x07\x08\x7f",
    "\u202e\u200b\ufeff",
    "\r\n\r\n",
    "😀" * 3,
    "<b><script>alert(1)</script>",
    "**[](javascript:alert(1))**`\\",
]
texts = st.one_of(
    st.text(max_size=40),
    st.text(st.characters(codec=None, exclude_categories=()), max_size=20),
    st.sampled_from(HOSTILE),
    st.integers(100_000, 300_000).map(lambda n: "x" * n),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    texts,
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(texts, children, max_size=4),
    max_leaves=16,
)


def nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"message": [value]}
    return value


def recorded(platform: str) -> list[Any]:
    return [
        json.loads(path.read_text(encoding="utf-8"))
        for path in sorted((DATA / platform).glob("*.json"))
    ]


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside `value` (keys and indexes)."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += paths(item, (*prefix, index))
    return found


def replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: replaced(value[head], rest, new)}
    copy = list(value)
    copy[head] = replaced(copy[head], rest, new)
    return copy


@st.composite
def mutated(draw: st.DrawFn, platform: str) -> Any:
    """A recorded payload of `platform` with one to three values swapped for hostile ones."""
    payload = draw(st.sampled_from(recorded(platform)))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths(payload)))
        payload = replaced(payload, path, draw(values))
    return payload


def payloads(platform: str) -> st.SearchStrategy[Any]:
    return st.one_of(values, mutated(platform))


def storable_result(result: object, expected: type) -> None:
    """The result is a refusal, or a message every store and encoder takes once normalised."""
    assert isinstance(result, Skipped | expected), result
    event(type(result).__name__)  # how many were refused, how many normalised
    message = getattr(result, "message", None)
    if isinstance(message, InboundMessage):
        cleaned = storable(message)
        for text in (cleaned.text, cleaned.chat_id, cleaned.sender.display_name):
            text.encode("utf-8")
        json.dumps(dict(cleaned.raw), ensure_ascii=False, default=str).encode("utf-8")


def still_converts(convert: Callable[[Any], object], good: Any) -> None:
    assert isinstance(convert(good), Incoming | InboundMessage)


# --- each platform ---------------------------------------------------------------------------


def loopback(update: Any) -> object:
    return loopback_inbound(update, AccountId("bot"))


@FUZZ
@given(payloads("loopback"))
@example(nested(400))
def test_loopback(update: Any) -> None:
    storable_result(loopback(update), InboundMessage)
    still_converts(loopback, recorded("loopback")[0])


TELEGRAM = TelegramConfig(token=SecretStr("1:x"), account="bot")


def telegram(data: Any) -> object:
    update = parse_update(data)
    if isinstance(update, Skipped):
        return update
    return telegram_inbound(
        update,
        bot=TelegramBot(5000000001, "herald_bot"),
        account=AccountId("bot"),
        config=TELEGRAM,
        now=NOW,
    )


@FUZZ
@given(payloads("telegram"))
@example({"update_id": 1, "message": nested(150)})
def test_telegram(data: Any) -> None:
    storable_result(telegram(data), Incoming)
    good = json.loads((DATA / "telegram" / "dm_text.json").read_text(encoding="utf-8"))
    assert not isinstance(parse_update(good), Skipped)


SLACK = SlackConfig(bot_token=SecretStr("xoxb-1"), app_token=SecretStr("xapp-1"), account="ws")


def slack(body: Any) -> object:
    return slack_inbound(
        body, bot=SlackBot("UBOT", "B0HERALD"), account=AccountId("ws"), config=SLACK, now=NOW
    )


@FUZZ
@given(payloads("slack"))
@example({"type": "event_callback", "event": nested(400)})
def test_slack(body: Any) -> None:
    storable_result(slack(body), Incoming)


DISCORD = DiscordConfig(token=SecretStr("t"), account="srv")


@FUZZ
@given(payloads("discord"), st.sampled_from(list(ChannelKind)) | st.none())
@example(nested(400), None)
@example({"id": "1311228000000000002", "channel_id": "1", "type": []}, None)  # was a TypeError
def test_discord(data: Any, kind: ChannelKind | None) -> None:
    channel = None if kind is None else Channel("1311228000000000001", kind)
    result = discord_inbound(
        data,
        bot_id="1199857218124726272",
        account=AccountId("srv"),
        config=DISCORD,
        channel=channel,
        now=NOW,
    )
    storable_result(result, Incoming)


@FUZZ
@given(
    st.one_of(
        st.binary(max_size=200),
        st.lists(st.tuples(texts, texts), max_size=6).map(
            lambda fields: "&".join(f"{k}={v}" for k, v in fields).encode("utf-8", "surrogatepass")
        ),
    )
)
@example(b"\xff\xfe not utf-8")
@example(b"Body=" + b"%00" * 10_000 + b"&From=%2B1555&MessageSid=SM1")
def test_twilio(body: bytes) -> None:
    try:
        form = parse_form(body)
    except ValueError:
        return  # refused as documented: the webhook answers 400
    fields = dict(form)
    storable_result(twilio_inbound(fields, account=AccountId("main"), now=NOW), Incoming)
    status = to_status(fields)
    assert status is not None


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "MessageSid",
                "From",
                "To",
                "Body",
                "NumMedia",
                "MediaUrl0",
                "MediaContentType0",
                "ProfileName",
                "OptOutType",
                "MessageStatus",
                "ErrorCode",
            ]
        ),
        texts,
    )
)
def test_twilio_form_values(fields: dict[str, str]) -> None:
    storable_result(twilio_inbound(fields, account=AccountId("main"), now=NOW), Incoming)
    to_status(fields)


EMAIL = EmailConfig.model_validate(
    {
        "imap_host": "imap.example.test",
        "smtp_host": "smtp.example.test",
        "username": "herald@example.test",
        "password": "secret",
        "address": "herald@example.test",
    }
)
MAILS = [path.read_bytes() for path in sorted((DATA / "email").glob("*.eml"))]


@st.composite
def mails(draw: st.DrawFn) -> bytes:
    """A recorded mail with a slice replaced by junk bytes, or junk alone."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=400))
    mail = draw(st.sampled_from(MAILS))
    start = draw(st.integers(0, len(mail)))
    end = draw(st.integers(start, min(len(mail), start + 200)))
    junk = draw(st.binary(max_size=80) | st.sampled_from([b"\x00", b"\xff\xfe", b"\r\n\r\n"]))
    return mail[:start] + junk + mail[end:]


@FUZZ
@given(mails())
@example(b"From: a@example.com\r\nSubject: " + b"=?utf-8?b?7aCA?=" + b"\r\n\r\n\xed\xa0\x80")
@example(b"Content-Type: multipart/mixed; boundary=x\r\n\r\n" + b"--x\r\n" * 5000)
def test_email(data: bytes) -> None:
    try:
        received = to_received(
            data, config=EMAIL, account=AccountId("default"), uidvalidity=7, uid=3, now=NOW
        )
    except (ValueError, LookupError, TypeError, AttributeError, UnicodeError) as err:
        # The standard library's parser trips over some broken mail (a NUL in a charset name,
        # an unterminated header); the adapter records such a mail as refused, as here.
        received = unreadable(AccountId("default"), 7, 3, f"unreadable mail: {err!r}")
        assert received.message.raw.get(REFUSED)
    storable_result(received, ReceivedMail)


# --- outbound --------------------------------------------------------------------------------

OUTBOUND: list[Callable[[str], Any]] = [
    render_markdown,
    to_html,
    to_markdown_v2,
    to_mrkdwn,
    to_sms,
    to_whatsapp,
    parts,
    markdown_to_html,
]


@FUZZ
@given(st.one_of(texts, st.text(st.sampled_from("*_`[]()#>-~|\\!\n <>&"), max_size=60)))
@example("`" * 5000)
@example("[" * 3000 + "x" + "]" * 3000)
@example("> " * 2000)
def test_outbound_markup_takes_any_text(text: str) -> None:
    for convert in OUTBOUND:
        convert(text)
