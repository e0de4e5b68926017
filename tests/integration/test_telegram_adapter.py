"""The real TelegramAdapter (python-telegram-bot unmodified) against the fake Bot API.

Adapter level: no daemon, no store. What the daemon makes of it is in `test_telegram.py`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

import adapters.telegram  # noqa: F401  (sets PTB_TIMEDELTA before python-telegram-bot is used)
from adapters.telegram import PLATFORM as TELEGRAM
from adapters.telegram.adapter import SEND_POOL, FirstStart, TelegramAdapter
from adapters.telegram.config import ParseMode, TelegramConfig, TelegramMode
from gateway.contracts.adapter import (
    Adapter,
    AdapterState,
    MessageEditor,
    SelfCheck,
    TypingIndicator,
    WebhookAdapter,
)
from gateway.contracts.errors import (
    AuthError,
    MarkupRejected,
    NotReady,
    PermanentSendError,
    RateLimited,
    TransientError,
)
from gateway.contracts.ids import AccountId, ChatId, PlatformMessageId, ThreadId
from gateway.contracts.messages import (
    Attachment,
    OutboundMessage,
    SendLimits,
    TextFormat,
)
from tests.fakes.sink import ListSink, receiving, refusing_socket, run_until_error, until_or_ended
from tests.fakes.telegram import (
    CANT_PARSE,
    EDIT_NOT_FOUND,
    NOT_MODIFIED,
    FakeTelegramServer,
)

TOKEN = "123456:adapter-test-token"
BOT_USERNAME = "herald_bot"
WAIT = 10.0
"""Upper bound of every wait for a condition."""
ANN = 111111111
"""A user; her direct chat has the same id."""
GROUP = -1001234567890
FORUM = -1009876543210
TOPIC = 4200
SECRET = "webhook_secret-42"
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"


def telegram_config(tg: FakeTelegramServer, **changes: Any) -> TelegramConfig:
    settings: dict[str, Any] = {
        "token": SecretStr(TOKEN),
        "base_url": tg.base_url,
        "base_file_url": tg.base_file_url,
        "poll_timeout": 5.0,
        "min_send_interval": 0,
        "min_edit_interval": 0.2,
    }
    settings.update(changes)
    return TelegramConfig(**settings)


def outbound(chat_id: int = ANN, text: str = "Hello **there**", **changes: Any) -> OutboundMessage:
    fields: dict[str, Any] = {
        "platform": TELEGRAM,
        "account": AccountId("default"),
        "chat_id": ChatId(str(chat_id)),
        "text": text,
        "idempotency_key": "s1:t1:0",
    }
    fields.update(changes)
    return OutboundMessage(**fields)


def key(chat_id: int, message_id: int) -> PlatformMessageId:
    return PlatformMessageId(f"{chat_id}:{message_id}")


def calls(tg: FakeTelegramServer, method: str) -> list[dict[str, Any]]:
    """The decoded parameters of every `method` request the fake received, in order."""
    return [c.params for c in tg.calls if c.method == method]


def pending_ids(tg: FakeTelegramServer) -> list[int]:
    return [u.update_id for u in tg.pending]


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer(TOKEN, bot_username=BOT_USERNAME) as server:
        yield server


@pytest.fixture
async def adapter(tg: FakeTelegramServer, tmp_path: Path) -> AsyncIterator[TelegramAdapter]:
    async with TelegramAdapter(telegram_config(tg), tmp_path / "files") as connected:
        yield connected


@pytest.fixture
def webhook_url() -> Iterator[str]:
    """Where the webhook points: nothing answers there (tests call `handle_webhook`)."""
    with refusing_socket() as url:
        yield f"{url}/webhooks/telegram"


def webhook_config(tg: FakeTelegramServer, url: str, **changes: Any) -> TelegramConfig:
    return telegram_config(
        tg,
        mode=TelegramMode.WEBHOOK,
        webhook_url=url,
        webhook_secret=SecretStr(SECRET),
        **changes,
    )


async def set_webhook_elsewhere(tg: FakeTelegramServer, url: str) -> None:
    """Someone else (another deployment, a curl) points the bot's webhook at `url`."""
    async with httpx.AsyncClient(timeout=WAIT, trust_env=False) as client:
        response = await client.post(f"{tg.base_url}{TOKEN}/setWebhook", json={"url": url})
        response.raise_for_status()


def update_json(text: str = "hi", *, update_id: int = 500, message_id: int = 7) -> dict[str, Any]:
    """A private-chat text message update as Telegram posts it."""
    person = {"id": ANN, "is_bot": False, "first_name": "Ann"}
    return {
        "update_id": update_id,
        "message": {
            "message_id": message_id,
            "date": int(time.time()),
            "chat": {"id": ANN, "type": "private", "first_name": "Ann"},
            "from": person,
            "text": text,
        },
    }


# -- shape ------------------------------------------------------------------------------------


async def test_adapter_shape(tg: FakeTelegramServer, tmp_path: Path) -> None:
    adapter = TelegramAdapter(telegram_config(tg, account="bot1"), tmp_path)
    for protocol in (Adapter, TypingIndicator, MessageEditor, WebhookAdapter, SelfCheck):
        assert isinstance(adapter, protocol), protocol.__name__
    assert adapter.platform is TELEGRAM
    assert adapter.account == AccountId("bot1")
    assert adapter.limits == SendLimits(
        max_chunk=4096,
        count_utf16=True,
        min_edit_interval=0.2,
        min_send_interval=0.0,
        max_file_bytes=50 * 1024 * 1024,
        voice=True,
        voice_caption=1024,
    )
    with pytest.raises(NotReady, match="not connected"):  # before entering
        await adapter.send(outbound())
    with pytest.raises(NotReady, match="not connected"):
        await adapter.run(ListSink())


# -- entering ---------------------------------------------------------------------------------


async def test_wrong_token_is_an_auth_error_on_enter(
    tg: FakeTelegramServer, tmp_path: Path
) -> None:
    adapter = TelegramAdapter(telegram_config(tg, token=SecretStr("123456:wrong")), tmp_path)
    with pytest.raises(AuthError, match="the token was refused"):
        async with adapter:
            pass
    assert adapter.liveness() is AdapterState.STARTING
    assert [r.status for r in tg.rejected] == []  # the wrong token never reaches a method
    assert tg.calls == []


async def test_an_auth_error_does_not_reveal_the_token(
    tg: FakeTelegramServer, tmp_path: Path
) -> None:
    # A valid token sent to the wrong path: python-telegram-bot's InvalidToken (404).
    config = telegram_config(tg, base_url=f"{tg.url}/not-the-bot-api/bot")
    with pytest.raises(AuthError) as entering:
        async with TelegramAdapter(config, tmp_path):
            pass
    with pytest.raises(AuthError) as checking:
        await TelegramAdapter(config, tmp_path).check()
    for caught in (entering, checking):
        assert TOKEN.split(":", 1)[1] not in str(caught.value)


async def test_unreachable_server_is_not_ready_on_enter(tmp_path: Path) -> None:
    with refusing_socket() as url:
        config = TelegramConfig(
            token=SecretStr(TOKEN), base_url=f"{url}/bot", base_file_url=f"{url}/file/bot"
        )
        with pytest.raises(NotReady):
            async with TelegramAdapter(config, tmp_path):
                pass


async def test_entering_in_polling_mode_deletes_a_webhook(
    tg: FakeTelegramServer, tmp_path: Path, webhook_url: str
) -> None:
    await set_webhook_elsewhere(tg, webhook_url)
    assert tg.webhook_info()["url"] == webhook_url
    async with TelegramAdapter(telegram_config(tg), tmp_path):
        assert tg.webhook_info()["url"] == ""
    assert [c.method for c in tg.calls] == ["setWebhook", "getMe", "deleteWebhook"]


async def test_liveness_from_start_to_stop(tg: FakeTelegramServer, tmp_path: Path) -> None:
    adapter = TelegramAdapter(telegram_config(tg), tmp_path)
    assert adapter.liveness() is AdapterState.STARTING
    async with adapter:
        assert adapter.liveness() is AdapterState.RECEIVING
        sink = ListSink()
        async with receiving(adapter, sink):
            await tg.wait_for(lambda: tg.polls_waiting >= 1, WAIT)
            assert adapter.liveness() is AdapterState.RECEIVING
    assert adapter.liveness() is AdapterState.STOPPED


# -- receiving --------------------------------------------------------------------------------


async def test_updates_are_confirmed_only_after_accept_returned(
    tg: FakeTelegramServer, adapter: TelegramAdapter
) -> None:
    kw: dict[str, Any] = {"sender_id": ANN, "sender_name": "Ann"}
    first = tg.inject_message(ANN, "one", **kw)
    second = tg.inject_message(GROUP, f"@{BOT_USERNAME} two", chat_type="supergroup", **kw)
    third = tg.inject_message(ANN, "three", **kw)
    sink = ListSink()
    sink.gate.clear()
    async with receiving(adapter, sink) as task:
        await sink.until(lambda: len(sink.accepting) == 1)
        assert sink.accepting[0].platform_message_id == key(ANN, first.message_id)
        # Held in `accept`: nothing is confirmed, and no further update is handed over.
        assert tg.polls == 1  # no poll (which would carry the offset) while held
        assert tg.confirmed == []
        assert pending_ids(tg) == [first.update_id, second.update_id, third.update_id]
        assert len(sink.accepting) == 1
        sink.gate.set()
        await until_or_ended(tg, task, lambda: not tg.pending)
    assert tg.confirmed == [first.update_id, second.update_id, third.update_id]
    assert sink.texts == ["one", "two", "three"]
    one, two, three = sink.messages
    assert one.platform_message_id == key(ANN, first.message_id)
    assert (one.chat_id, one.sender.display_name, one.is_direct) == (str(ANN), "Ann", True)
    assert (two.chat_id, two.is_direct, two.mentions_bot) == (str(GROUP), False, True)
    assert three.platform_message_id == key(ANN, third.message_id)
    assert {(m.platform, m.account) for m in sink.messages} == {(TELEGRAM, AccountId("default"))}


async def test_a_failing_sink_leaves_the_update_unconfirmed(
    tg: FakeTelegramServer, tmp_path: Path
) -> None:
    kept = tg.inject_message(ANN, "kept", sender_id=ANN)
    refused = tg.inject_message(ANN, "refused", sender_id=ANN)
    failing = ListSink(fail_on=lambda message: message.text == "refused")
    config = telegram_config(tg)
    async with TelegramAdapter(config, tmp_path) as adapter:
        with pytest.raises(RuntimeError, match=f"inbox unavailable for {ANN}:"):
            await run_until_error(adapter, failing)
    assert failing.texts == ["kept"]
    assert refused.update_id not in tg.confirmed
    assert pending_ids(tg) == [kept.update_id, refused.update_id]

    # What the supervisor's runner does next: a new connection, which gets them again.
    sink = ListSink()
    async with TelegramAdapter(config, tmp_path) as adapter, receiving(adapter, sink) as task:
        await until_or_ended(tg, task, lambda: not tg.pending)
    assert sink.texts == ["kept", "refused"]
    assert tg.confirmed == [kept.update_id, refused.update_id]


def _message(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "message_id": 900,
        "date": int(time.time()),
        "chat": {"id": ANN, "type": "private", "first_name": "Ann"},
        "from": {"id": ANN, "is_bot": False, "first_name": "Ann"},
        "text": "garbage",
    }
    base.update(fields)
    return {key: value for key, value in base.items() if value is not None}


MALFORMED = [
    pytest.param(_message(chat="not a chat"), id="chat-not-an-object"),
    pytest.param(_message(date="yesterday"), id="date-not-a-number"),
    pytest.param(_message(entities=[{"type": "bold"}]), id="entity-without-offset"),
    pytest.param(_message(**{"from": {"first_name": "nobody"}}), id="sender-without-id"),
    pytest.param(_message(reply_to_message=5), id="reply-not-an-object"),
    pytest.param(_message(chat=None), id="no-chat"),
    pytest.param(_message(text=5), id="text-not-a-string"),
    pytest.param(_message(date=10**20), id="date-out-of-range"),
]


@pytest.mark.parametrize("message", MALFORMED)
async def test_a_malformed_update_is_passed_over(
    tg: FakeTelegramServer,
    adapter: TelegramAdapter,
    message: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = tg.inject_message(ANN, "before", sender_id=ANN)
    junk = tg.inject_update({"message": message})
    after = tg.inject_message(ANN, "after", sender_id=ANN)
    sink = ListSink()
    with caplog.at_level(logging.INFO, logger="adapters.telegram"):
        async with receiving(adapter, sink) as task:
            await until_or_ended(tg, task, lambda: not tg.pending)
    assert sink.texts == ["before", "after"]
    assert tg.confirmed == [before.update_id, junk, after.update_id]
    assert f"update {junk}" in caplog.text


@pytest.mark.parametrize(
    ("fault", "match"),
    [
        pytest.param(
            lambda tg: tg.fail("getUpdates", status=500), "Internal Server Error", id="500"
        ),
        pytest.param(lambda tg: tg.fail("getUpdates", status=502), "Bad Gateway", id="502"),
        pytest.param(lambda tg: tg.drop("getUpdates"), "getUpdates", id="dropped"),
    ],
)
async def test_a_failed_poll_is_not_ready_and_confirms_nothing(
    tg: FakeTelegramServer,
    adapter: TelegramAdapter,
    fault: Callable[[FakeTelegramServer], None],
    match: str,
) -> None:
    first = tg.inject_message(ANN, "accepted, not yet confirmed", sender_id=ANN)
    sink = ListSink()
    sink.gate.clear()
    task = asyncio.create_task(run_until_error(adapter, sink))
    await sink.until(lambda: len(sink.accepting) == 1)
    fault(tg)  # the poll that would confirm the first update
    sink.gate.set()
    with pytest.raises(NotReady, match=match):
        await task
    assert sink.texts == ["accepted, not yet confirmed"]
    assert pending_ids(tg) == [first.update_id]
    assert tg.confirmed == []


async def test_the_long_poll_does_not_wait_behind_busy_sends(
    tg: FakeTelegramServer, adapter: TelegramAdapter
) -> None:
    """Every send connection taken by a slow Telegram (more sends waiting for one): a message
    still arrives and is confirmed by the next poll, on the same connection (no restart)."""
    sink = ListSink()
    tg.hold("sendMessage")
    async with receiving(adapter, sink), asyncio.TaskGroup() as sends:
        await tg.wait_for(lambda: tg.polls_waiting == 1)
        for n in range(SEND_POOL + 4):
            sends.create_task(adapter.send(outbound(ANN, f"reply {n}", idempotency_key=f"k{n}")))
        await tg.wait_for(lambda: tg.calls_held == SEND_POOL)
        first = tg.inject_message(ANN, "while every connection is busy", sender_id=ANN)
        await tg.wait_until_confirmed(first.update_id)
        second = tg.inject_message(ANN, "and the next one", sender_id=ANN)
        await tg.wait_until_confirmed(second.update_id)
        assert sink.texts == ["while every connection is busy", "and the next one"]
        assert tg.calls_held >= SEND_POOL  # the sends were held all along
        assert len(calls(tg, "getMe")) == 1  # never reconnected
        tg.hold("sendMessage", False)
    assert len(tg.sent) == SEND_POOL + 4


async def test_a_webhook_set_elsewhere_while_polling_is_not_ready(
    tg: FakeTelegramServer, adapter: TelegramAdapter, webhook_url: str
) -> None:
    task = asyncio.create_task(run_until_error(adapter, ListSink()))
    await tg.wait_for(lambda: tg.polls_waiting >= 1 or task.done(), WAIT)
    await set_webhook_elsewhere(tg, webhook_url)
    with pytest.raises(NotReady, match=r"getUpdates: .*webhook is active"):
        await task
    assert [r.status for r in tg.rejected if r.method == "getUpdates"] == [409]


async def test_a_failed_download_is_retried_once_then_the_file_is_marked_unavailable(
    tg: FakeTelegramServer, tmp_path: Path
) -> None:
    # A file is the message's problem, never the adapter's: it keeps receiving throughout.
    content = b"%PDF-1.4 quarterly numbers"
    file_id = tg.add_file(content, file_name="report.pdf", mime_type="application/pdf")
    config = telegram_config(tg)
    files = tmp_path / "files"
    sink = ListSink()
    async with TelegramAdapter(config, files) as adapter, receiving(adapter, sink) as task:
        # One 503: the retry downloads it.
        tg.fail("getFile", status=503)
        first = tg.inject_message(ANN, "see attached", sender_id=ANN, document=file_id)
        await until_or_ended(tg, task, lambda: first.update_id in tg.confirmed)
        # 503 on the try and the retry: the message goes on, the file marked unavailable.
        tg.fail("getFile", count=2, status=503)
        second = tg.inject_message(ANN, "and again", sender_id=ANN, document=file_id)
        await until_or_ended(tg, task, lambda: second.update_id in tg.confirmed)
        assert not task.done()
    received, missing = sink.messages
    assert received.text == "see attached"
    (attachment,) = received.attachments
    assert (attachment.mime_type, attachment.filename, attachment.size) == (
        "application/pdf",
        "report.pdf",
        len(content),
    )
    assert attachment.path.read_bytes() == content
    assert attachment.path.is_relative_to(files)
    assert missing.attachments == ()
    assert missing.text.startswith("and again\n[file report.pdf unavailable: ")
    assert "downloading a file: Service Unavailable; ask the person to send it again]" in (
        missing.text
    )


# -- sending ----------------------------------------------------------------------------------


async def test_send_renders_markdown_as_html(
    tg: FakeTelegramServer, adapter: TelegramAdapter
) -> None:
    receipt = await adapter.send(outbound(ANN, "Hello **there** & <you>"))
    (sent,) = tg.sent
    assert receipt.platform_message_id == key(ANN, sent.message_id)
    assert sent.method == "sendMessage"
    assert sent.parse_mode == "HTML"
    assert sent.plain_text == "Hello there & <you>"
    assert {"type": "bold", "offset": 6, "length": 5}.items() <= sent.entities[0].items()
    assert (sent.message_thread_id, sent.reply_to_message_id) == (None, None)


async def test_plain_format_has_no_parse_mode(
    tg: FakeTelegramServer, adapter: TelegramAdapter
) -> None:
    await adapter.send(outbound(ANN, "Hello **there** & <you>", format=TextFormat.PLAIN))
    (sent,) = tg.sent
    assert sent.parse_mode is None
    assert sent.plain_text == "Hello **there** & <you>"
    assert "parse_mode" not in calls(tg, "sendMessage")[0]


async def test_markdown_v2_parse_mode(tg: FakeTelegramServer, tmp_path: Path) -> None:
    text = "Price: **1.5 + (2)** - _ok_! Use `a_b` or [docs](https://example.org/x_(y))."
    config = telegram_config(tg, parse_mode=ParseMode.MARKDOWN_V2)
    async with TelegramAdapter(config, tmp_path) as adapter:
        await adapter.send(outbound(ANN, text))
        receipt = await adapter.send(outbound(ANN, "draft"))
        assert receipt.platform_message_id is not None
        await adapter.edit(receipt.platform_message_id, outbound(ANN, "**final** 1.0!"))
    first, _ = tg.sent
    assert first.parse_mode == "MarkdownV2"
    assert first.plain_text.startswith("Price: 1.5 + (2) - ok! Use a_b or docs.")
    kinds = {e["type"] for e in first.entities}
    assert {"bold", "italic", "code", "text_link"} <= kinds
    assert [(e.parse_mode, e.plain_text) for e in tg.edits] == [("MarkdownV2", "final 1.0!")]
    assert tg.rejected == []


async def test_reply_to_a_message(tg: FakeTelegramServer, adapter: TelegramAdapter) -> None:
    question = tg.inject_message(GROUP, "question", sender_id=ANN, chat_type="supergroup")
    await adapter.send(outbound(GROUP, "answer", reply_to=key(GROUP, question.message_id)))
    (sent,) = tg.sent
    assert sent.reply_to_message_id == question.message_id
    (params,) = calls(tg, "sendMessage")
    assert params["reply_parameters"]["message_id"] == question.message_id
    assert params["reply_parameters"]["allow_sending_without_reply"] is True


async def test_reply_to_a_deleted_message_still_sends(
    tg: FakeTelegramServer, adapter: TelegramAdapter
) -> None:
    receipt = await adapter.send(outbound(GROUP, "answer", reply_to=key(GROUP, 9999)))
    (sent,) = tg.sent
    assert receipt.platform_message_id == key(GROUP, sent.message_id)
    assert sent.reply_to_message_id is None
    assert tg.rejected == []


async def test_send_and_typing_in_a_forum_topic(
    tg: FakeTelegramServer, adapter: TelegramAdapter
) -> None:
    tg.inject_message(
        FORUM, "in a topic", sender_id=ANN, chat_type="supergroup", is_forum=True, thread_id=TOPIC
    )
    await adapter.typing(ChatId(str(FORUM)), ThreadId(str(TOPIC)))
    await adapter.typing(ChatId(str(ANN)), None)
    await adapter.send(outbound(FORUM, "answer", thread_id=ThreadId(str(TOPIC))))
    (sent,) = tg.sent
    assert (sent.chat_id, sent.message_thread_id) == (FORUM, TOPIC)
    assert calls(tg, "sendMessage")[0]["message_thread_id"] == TOPIC
    assert [(a.chat_id, a.action, a.message_thread_id) for a in tg.actions] == [
        (FORUM, "typing", TOPIC),
        (ANN, "typing", None),
    ]


async def test_a_blocked_chat_is_a_permanent_error(
    tg: FakeTelegramServer, adapter: TelegramAdapter
) -> None:
    receipt = await adapter.send(outbound(ANN, "before"))
    assert receipt.platform_message_id is not None
    tg.block_chat(ANN)
    with pytest.raises(PermanentSendError, match="blocked by the user"):
        await adapter.send(outbound(ANN))
    with pytest.raises(PermanentSendError, match="blocked by the user"):
        await adapter.edit(receipt.platform_message_id, outbound(ANN, "after"))
    with pytest.raises(PermanentSendError, match="blocked by the user"):
        await adapter.typing(ChatId(str(ANN)), None)
    assert [r.status for r in tg.rejected] == [403, 403, 403]


async def test_a_deleted_topic_is_a_permanent_error(
    tg: FakeTelegramServer, adapter: TelegramAdapter
) -> None:
    tg.inject_message(
        FORUM, "in a topic", sender_id=ANN, chat_type="supergroup", is_forum=True, thread_id=TOPIC
    )
    tg.delete_topic(FORUM, TOPIC)
    with pytest.raises(PermanentSendError, match=r"(?i)message thread not found"):
        await adapter.send(outbound(FORUM, "answer", thread_id=ThreadId(str(TOPIC))))
    assert tg.sent == []


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(lambda tg: tg.fail("sendMessage", status=500), id="500"),
        pytest.param(lambda tg: tg.fail("sendMessage", status=502), id="502"),
        pytest.param(lambda tg: tg.drop("sendMessage"), id="dropped"),
    ],
)
async def test_a_failed_send_is_not_ready(
    tg: FakeTelegramServer,
    adapter: TelegramAdapter,
    fault: Callable[[FakeTelegramServer], None],
) -> None:
    fault(tg)
    with pytest.raises(NotReady, match="sendMessage"):
        await adapter.send(outbound())
    await adapter.send(outbound())
    assert len(tg.sent) == 1


async def test_rejected_markup_is_markup_rejected(
    tg: FakeTelegramServer, adapter: TelegramAdapter
) -> None:
    tg.reject_markup()
    with pytest.raises(MarkupRejected, match=r"(?i)can't parse entities"):
        await adapter.send(outbound(ANN, "**bold**"))
    assert [r.description.startswith(CANT_PARSE) for r in tg.rejected] == [True]
    await adapter.send(outbound(ANN, "**bold**", format=TextFormat.PLAIN))
    assert [(s.text, s.parse_mode) for s in tg.sent] == [("**bold**", None)]


async def test_a_migrated_chat_is_followed(
    tg: FakeTelegramServer, adapter: TelegramAdapter
) -> None:
    old, new = -4001, -1004001
    before = await adapter.send(outbound(old, "before the move"))
    tg.migrate_chat(old, new)
    moved = await adapter.send(outbound(old, "after the move"))
    again = await adapter.send(outbound(old, "and again"))
    assert before.platform_message_id is not None
    assert [(s.chat_id, s.plain_text) for s in tg.sent] == [
        (old, "before the move"),
        (new, "after the move"),
        (new, "and again"),
    ]
    assert moved.platform_message_id == key(new, tg.sent[1].message_id)
    assert again.platform_message_id == key(new, tg.sent[2].message_id)
    assert [p["chat_id"] for p in calls(tg, "sendMessage")] == [old, old, new, new]
    assert [(r.method, r.status) for r in tg.rejected] == [("sendMessage", 400)]
    await adapter.typing(ChatId(str(old)), None)
    assert [a.chat_id for a in tg.actions] == [new]


async def test_attachments(
    tg: FakeTelegramServer, adapter: TelegramAdapter, tmp_path: Path
) -> None:
    image = tmp_path / "chart.png"
    image.write_bytes(b"\x89PNG\r\n\x1a\n" + b"pixels" * 100)
    pdf = tmp_path / "report.pdf"
    pdf.write_bytes(b"%PDF-1.4 the report")
    photo = Attachment(image, "image/png", image.stat().st_size, "chart.png")
    document = Attachment(pdf, "application/pdf", pdf.stat().st_size, "q3 report.pdf")

    only_photo = await adapter.send(outbound(ANN, "", attachments=(photo,)))
    await adapter.send(outbound(ANN, "", attachments=(document,)))
    question = tg.inject_message(ANN, "chart please", sender_id=ANN)
    both = await adapter.send(
        outbound(
            ANN,
            "Here **they** are",
            attachments=(photo, document),
            reply_to=key(ANN, question.message_id),
        )
    )

    sent_photo, sent_document, text, photo_after, document_after = tg.sent
    assert only_photo.platform_message_id == key(ANN, sent_photo.message_id)
    assert sent_photo.method == "sendPhoto"
    assert sent_photo.upload is not None
    assert (sent_photo.upload.content, sent_photo.upload.filename) == (
        image.read_bytes(),
        "chart.png",
    )
    assert sent_document.method == "sendDocument"
    assert sent_document.upload is not None
    assert (sent_document.upload.content, sent_document.upload.filename) == (
        pdf.read_bytes(),
        "q3 report.pdf",
    )
    # Text first, then the files; the reply goes with the first message only.
    assert [s.method for s in (text, photo_after, document_after)] == [
        "sendMessage",
        "sendPhoto",
        "sendDocument",
    ]
    assert both.platform_message_id == key(ANN, text.message_id)
    assert text.plain_text == "Here they are"
    assert [s.reply_to_message_id for s in (text, photo_after, document_after)] == [
        question.message_id,
        None,
        None,
    ]


async def test_one_file_takes_its_text_as_caption_so_a_failed_upload_sent_nothing(
    tg: FakeTelegramServer, adapter: TelegramAdapter, tmp_path: Path
) -> None:
    pdf = tmp_path / "report.pdf"
    pdf.write_bytes(b"%PDF-1.4 the report")
    document = Attachment(pdf, "application/pdf", pdf.stat().st_size, "report.pdf")
    message = outbound(ANN, "The **Q3** report", attachments=(document,))

    tg.fail("sendDocument")
    with pytest.raises(TransientError):
        await adapter.send(message)
    assert tg.sent == []  # no caption went out alone: the retry cannot repeat it

    receipt = await adapter.send(message)
    [sent] = tg.sent
    assert sent.method == "sendDocument"
    assert sent.plain_text == "The Q3 report"
    assert receipt.platform_message_id == key(ANN, sent.message_id)
    # A caption over Telegram's 1,024 goes first as a message of its own.
    await adapter.send(outbound(ANN, "x" * 1025, attachments=(document,)))
    assert [s.method for s in tg.sent[1:]] == ["sendMessage", "sendDocument"]


async def test_a_voice_note_is_one_request_even_when_its_rendered_caption_is_too_long(
    tg: FakeTelegramServer, adapter: TelegramAdapter, tmp_path: Path
) -> None:
    ogg = tmp_path / "voice.ogg"
    ogg.write_bytes(b"OggS" + b"\x00" * 40 + b"OpusHead")
    voice = Attachment(ogg, "audio/ogg", ogg.stat().st_size, "voice.ogg", voice=True)
    # 1,000 characters of Markdown; as HTML (`&lt;`, `&amp;`) well over Telegram's 1,024.
    words = ("1 < 2 & 3 " * 100).strip()
    message = outbound(ANN, words, attachments=(voice,))

    tg.fail("sendVoice")
    with pytest.raises(TransientError):
        await adapter.send(message)
    assert tg.sent == []  # no text went ahead of the voice note: the retry cannot repeat it

    await adapter.send(message)
    [sent] = tg.sent
    assert (sent.method, sent.plain_text) == ("sendVoice", words)
    # Longer than any caption even as plain text: shortened, still one request.
    await adapter.send(outbound(ANN, "y" * 1500, attachments=(voice,)))
    [_, long] = tg.sent
    assert long.method == "sendVoice"
    assert long.plain_text == "y" * 1023 + "…"


async def test_nothing_to_send_is_a_permanent_error(adapter: TelegramAdapter) -> None:
    with pytest.raises(PermanentSendError, match="nothing to send"):
        await adapter.send(outbound(ANN, "  \n"))


# -- editing ----------------------------------------------------------------------------------


async def test_edit_replaces_the_text(tg: FakeTelegramServer, adapter: TelegramAdapter) -> None:
    receipt = await adapter.send(outbound(ANN, "Thinking…"))
    target = receipt.platform_message_id
    assert target is not None
    edited = await adapter.edit(target, outbound(ANN, "The answer is **42**."))
    assert edited.platform_message_id == target
    assert tg.texts_in(ANN) == ["The answer is 42."]
    assert [(e.parse_mode, e.plain_text) for e in tg.edits] == [("HTML", "The answer is 42.")]

    # The same text again: Telegram answers "message is not modified", which is success.
    again = await adapter.edit(target, outbound(ANN, "The answer is **42**."))
    assert again.platform_message_id == target
    assert [r.description for r in tg.rejected] == [NOT_MODIFIED]
    assert len(tg.edits) == 1
    assert tg.texts_in(ANN) == ["The answer is 42."]


async def test_editing_an_unknown_message_is_a_permanent_error(
    tg: FakeTelegramServer, adapter: TelegramAdapter
) -> None:
    with pytest.raises(PermanentSendError, match=r"(?i)message to edit not found"):
        await adapter.edit(key(ANN, 9999), outbound(ANN, "lost"))
    with pytest.raises(PermanentSendError, match="not a Telegram message id"):
        await adapter.edit(PlatformMessageId("m-1"), outbound(ANN, "lost"))
    assert [r.description for r in tg.rejected] == [EDIT_NOT_FOUND]


async def test_rate_limited_edit_carries_retry_after(
    tg: FakeTelegramServer, adapter: TelegramAdapter
) -> None:
    receipt = await adapter.send(outbound(ANN, "v1"))
    assert receipt.platform_message_id is not None
    tg.rate_limit(ANN, count=1, retry_after=3)
    with pytest.raises(RateLimited) as caught:
        await adapter.edit(receipt.platform_message_id, outbound(ANN, "v2"))
    assert caught.value.retry_after == 3.0
    await adapter.edit(receipt.platform_message_id, outbound(ANN, "v2"))
    assert tg.texts_in(ANN) == ["v2"]


# -- webhook mode -----------------------------------------------------------------------------


async def test_webhook_mode_sets_the_webhook_with_the_secret(
    tg: FakeTelegramServer, tmp_path: Path, webhook_url: str
) -> None:
    adapter = TelegramAdapter(webhook_config(tg, webhook_url), tmp_path)
    async with adapter:
        assert adapter.liveness() is AdapterState.RECEIVING
        webhook = tg.webhook
        assert webhook is not None
        assert (webhook.url, webhook.secret_token) == (webhook_url, SECRET)
        assert webhook.allowed_updates == [
            "message",
            "edited_message",
            "callback_query",
            "message_reaction",
        ]
    assert adapter.liveness() is AdapterState.STOPPED
    assert tg.webhook is not None  # stays set: Telegram keeps updates while Herald is down
    assert [c.method for c in tg.calls] == ["getMe", "setWebhook"]


async def test_webhook_requests_are_verified(
    tg: FakeTelegramServer, tmp_path: Path, webhook_url: str
) -> None:
    sink = ListSink()
    body = json.dumps(update_json("hello over the webhook")).encode()
    good = {"Content-Type": "application/json", SECRET_HEADER: SECRET}
    async with TelegramAdapter(webhook_config(tg, webhook_url), tmp_path) as adapter:
        for headers in (
            {"Content-Type": "application/json"},
            {SECRET_HEADER: "wrong-secret"},
            {SECRET_HEADER: SECRET + "x"},
            {SECRET_HEADER: ""},
        ):
            answer = await adapter.handle_webhook("", headers, body, sink)
            assert answer.status == 403, headers
        for junk in (b"not json {", b"\xff\xfe\x00", b""):
            assert (await adapter.handle_webhook("", good, junk, sink)).status == 400, junk
        for not_an_update in ({"hello": 1}, [update_json()], "text", {"update_id": "1"}):
            raw = json.dumps(not_an_update).encode()
            assert (await adapter.handle_webhook("", good, raw, sink)).status == 400, raw
        assert (await adapter.handle_webhook("elsewhere", good, body, sink)).status == 404
        assert sink.accepting == []

        lower = {SECRET_HEADER.lower(): SECRET}
        answer = await adapter.handle_webhook("", lower, body, sink)
        assert answer.status == 200
    (message,) = sink.messages
    assert message.text == "hello over the webhook"
    assert message.platform_message_id == key(ANN, 7)
    assert tg.sent == []


async def test_webhook_sink_errors_propagate(
    tg: FakeTelegramServer, tmp_path: Path, webhook_url: str
) -> None:
    failing = ListSink(fail_on=lambda message: True)
    body = json.dumps(update_json()).encode()
    async with TelegramAdapter(webhook_config(tg, webhook_url), tmp_path) as adapter:
        with pytest.raises(RuntimeError, match="inbox unavailable"):
            await adapter.handle_webhook("", {SECRET_HEADER: SECRET}, body, failing)


@pytest.mark.parametrize(
    "message",
    [
        pytest.param(_message(chat=None), id="no-chat"),
        pytest.param(_message(date=10**20), id="date-out-of-range"),
        pytest.param(_message(chat="not a chat"), id="chat-not-an-object"),
    ],
)
async def test_a_malformed_webhook_update_is_answered_not_raised(
    tg: FakeTelegramServer, tmp_path: Path, webhook_url: str, message: dict[str, Any]
) -> None:
    sink = ListSink()
    body = json.dumps({"update_id": 501, "message": message}).encode()
    async with TelegramAdapter(webhook_config(tg, webhook_url), tmp_path) as adapter:
        answer = await adapter.handle_webhook("", {SECRET_HEADER: SECRET}, body, sink)
    assert answer.status in {200, 400}  # passed over, or refused as not an update
    assert sink.accepting == []


async def test_a_polling_adapter_has_no_webhook(
    tg: FakeTelegramServer, adapter: TelegramAdapter
) -> None:
    body = json.dumps(update_json()).encode()
    sink = ListSink()
    answer = await adapter.handle_webhook("", {SECRET_HEADER: SECRET}, body, sink)
    assert answer.status == 404
    assert sink.accepting == []


@pytest.mark.parametrize("mode", [TelegramMode.WEBHOOK, TelegramMode.POLLING])
async def test_the_backlog_is_dropped_at_the_first_start_only(
    tg: FakeTelegramServer, tmp_path: Path, webhook_url: str, mode: TelegramMode
) -> None:
    if mode is TelegramMode.WEBHOOK:
        config = webhook_config(tg, webhook_url, process_backlog_on_start=False)
    else:
        config = telegram_config(tg, process_backlog_on_start=False)
    method = "setWebhook" if mode is TelegramMode.WEBHOOK else "deleteWebhook"
    first_start = FirstStart()
    old = tg.inject_message(ANN, "sent while Herald was down", sender_id=ANN)
    async with TelegramAdapter(config, tmp_path, first_start):
        assert tg.discarded == [old.update_id]
        assert tg.pending == []
    assert first_start.done

    meanwhile = tg.inject_message(ANN, "sent during a reconnect", sender_id=ANN)
    async with TelegramAdapter(config, tmp_path, first_start):  # the same run reconnecting
        assert pending_ids(tg) == [meanwhile.update_id]
    assert tg.discarded == [old.update_id]
    assert [bool(p.get("drop_pending_updates")) for p in calls(tg, method)] == [True, False]


async def test_the_backlog_is_kept_by_default(tg: FakeTelegramServer, tmp_path: Path) -> None:
    old = tg.inject_message(ANN, "sent while Herald was down", sender_id=ANN)
    async with TelegramAdapter(telegram_config(tg), tmp_path):
        assert pending_ids(tg) == [old.update_id]
    assert tg.discarded == []


# -- check (herald doctor) --------------------------------------------------------------------


async def test_check_describes_the_bot(
    tg: FakeTelegramServer, tmp_path: Path, webhook_url: str
) -> None:
    detail = await TelegramAdapter(telegram_config(tg), tmp_path).check()
    assert detail == "@herald_bot (id 123456), polling mode"
    detail = await TelegramAdapter(webhook_config(tg, webhook_url), tmp_path).check()
    assert detail.startswith("@herald_bot (id 123456), webhook mode")
    assert "the webhook is not set until Herald starts" in detail
    assert [c.method for c in tg.calls] == ["getMe", "getMe", "getWebhookInfo"]
    assert tg.webhook is None  # checking takes nothing over


async def test_check_with_a_wrong_token_is_an_auth_error(
    tg: FakeTelegramServer, tmp_path: Path
) -> None:
    adapter = TelegramAdapter(telegram_config(tg, token=SecretStr("123456:wrong")), tmp_path)
    with pytest.raises(AuthError, match="getMe"):
        await adapter.check()


async def test_check_of_an_unreachable_server_is_not_ready(tmp_path: Path) -> None:
    with refusing_socket() as url:
        config = TelegramConfig(
            token=SecretStr(TOKEN), base_url=f"{url}/bot", base_file_url=f"{url}/file/bot"
        )
        with pytest.raises(NotReady):
            await TelegramAdapter(config, tmp_path).check()
