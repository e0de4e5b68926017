"""`TwilioAdapter` on its own, through the twilio SDK against the fake Twilio: entering,
webhook verification and storage, keywords, media, delivery reports and sending."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from adapters.twilio import PLATFORM as TWILIO
from adapters.twilio.adapter import EMPTY_TWIML, TwilioAdapter, optout_name
from adapters.twilio.config import TwilioConfig
from gateway.checkpoints import MemoryCheckpoints
from gateway.contracts.adapter import AdapterContext, AdapterState
from gateway.contracts.errors import AuthError, NotReady, PermanentSendError, RateLimited
from gateway.contracts.ids import AccountId, ChatId, Platform, PlatformMessageId
from gateway.contracts.messages import InboundMessage, OutboundMessage, TextFormat
from tests.fakes.sink import ListSink, refusing_socket
from tests.fakes.twilio_server import (
    DEFAULT_ACCOUNT_SID,
    DEFAULT_API_KEY,
    DEFAULT_API_SECRET,
    DEFAULT_AUTH_TOKEN,
    HERALD_NUMBER,
    WHATSAPP_NUMBER,
    FakeTwilioServer,
)

pytestmark = pytest.mark.timeout(60)

PUBLIC = "https://herald.example.com"
ANN = "+15551234567"


class ReportingSink(ListSink):
    """The inbox stand-in, also taking settled messages and delivery reports."""

    def __init__(self) -> None:
        super().__init__()
        self.settled: list[tuple[InboundMessage, str]] = []
        self.reports: list[tuple[str, str, str | None]] = []
        self.known: set[str] = set()
        """Message sids `delivery_report` finds (others answer False, like an unknown sid)."""

    async def settle(self, message: InboundMessage, detail: str) -> None:
        self.settled.append((message, detail))

    async def delivery_report(
        self,
        platform: Platform,
        account: AccountId,
        message: PlatformMessageId,
        status: str,
        error: str | None = None,
    ) -> bool:
        self.reports.append((message, status, error))
        return message in self.known


@pytest.fixture
async def twilio() -> AsyncIterator[FakeTwilioServer]:
    async with FakeTwilioServer() as server:
        yield server


def config(twilio: FakeTwilioServer, **changes: Any) -> TwilioConfig:
    values: dict[str, Any] = {
        "account_sid": DEFAULT_ACCOUNT_SID,
        "auth_token": DEFAULT_AUTH_TOKEN,
        "from_number": HERALD_NUMBER,
        "whatsapp_from": WHATSAPP_NUMBER,
        "public_url": PUBLIC,
        "base_url": twilio.base_url,
        "status_callbacks": False,
    }
    values.update(changes)
    return TwilioConfig.model_validate(values)


def new_adapter(
    twilio: FakeTwilioServer,
    tmp_path: Path,
    checkpoints: MemoryCheckpoints | None = None,
    **changes: Any,
) -> TwilioAdapter:
    context = AdapterContext(tmp_path / "files", checkpoints or MemoryCheckpoints())
    return TwilioAdapter(config(twilio, **changes), context)


def outbound(text: str, chat: str = ANN, *, key: str = "k1") -> OutboundMessage:
    return OutboundMessage(TWILIO, AccountId("default"), ChatId(chat), text, key)


async def post(
    adapter: TwilioAdapter,
    twilio: FakeTwilioServer,
    sink: ReportingSink,
    form: list[tuple[str, str]],
    path: str = "sms",
    **signing: Any,
) -> tuple[int, bytes]:
    headers, body = twilio.signed_request(f"{PUBLIC}/webhooks/twilio/{path}", form, **signing)
    answer = await adapter.handle_webhook(path, headers, body, sink)
    return answer.status, answer.body


# -- entering ------------------------------------------------------------------------------------


async def test_entering_checks_the_credentials(twilio: FakeTwilioServer, tmp_path: Path) -> None:
    adapter = new_adapter(twilio, tmp_path)
    assert adapter.liveness() is AdapterState.STARTING
    async with adapter:
        assert adapter.liveness() is AdapterState.RECEIVING
        assert adapter.limits.max_chunk == 1600
    assert adapter.liveness() is AdapterState.STOPPED
    with pytest.raises(AuthError, match="20003"):
        async with new_adapter(twilio, tmp_path, auth_token="f" * 32):
            pass
    with refusing_socket() as url, pytest.raises(NotReady):
        async with new_adapter(twilio, tmp_path, base_url=url):
            pass


async def test_an_api_key_is_used_for_the_rest_api(
    twilio: FakeTwilioServer, tmp_path: Path
) -> None:
    adapter = new_adapter(twilio, tmp_path, api_key=DEFAULT_API_KEY, api_secret=DEFAULT_API_SECRET)
    async with adapter:
        await adapter.send(outbound("hi"))
    assert [s.auth for s in twilio.sent] == [DEFAULT_API_KEY]
    assert "sends from +15550001111, whatsapp:+15550002222" in await adapter.check()


# -- receiving -----------------------------------------------------------------------------------


async def test_a_signed_message_is_stored_before_the_empty_twiml(
    twilio: FakeTwilioServer, tmp_path: Path
) -> None:
    sink = ReportingSink()
    async with new_adapter(twilio, tmp_path) as adapter:
        form = twilio.message_form(ANN, "hello")
        sink.gate.clear()  # the inbox holds the message: no answer before it commits
        answering = asyncio.create_task(post(adapter, twilio, sink, form))
        await sink.until(lambda: len(sink.accepting) == 1)
        assert not answering.done()
        sink.gate.set()
        assert await answering == (200, EMPTY_TWIML)
    [message] = sink.messages
    assert (message.chat_id, message.text) == (ANN, "hello")
    assert message.platform_message_id == dict(form)["MessageSid"]


@pytest.mark.parametrize(
    ("signing", "status"),
    [
        ({"signing": "none"}, 403),
        ({"signing": "wrong"}, 403),
        ({"signed_url": "http://127.0.0.1:8080/webhooks/twilio/sms"}, 403),
    ],
)
async def test_unsigned_or_wrongly_signed_requests_are_refused(
    twilio: FakeTwilioServer, tmp_path: Path, signing: dict[str, Any], status: int
) -> None:
    sink = ReportingSink()
    async with new_adapter(twilio, tmp_path) as adapter:
        answer = await post(adapter, twilio, sink, twilio.message_form(ANN, "x"), **signing)
    assert answer[0] == status
    assert sink.accepting == []


async def test_bad_requests(twilio: FakeTwilioServer, tmp_path: Path) -> None:
    sink = ReportingSink()
    async with new_adapter(twilio, tmp_path) as adapter:
        missing = await adapter.handle_webhook("voice", {}, b"", sink)
        assert missing.status == 404
        binary = await adapter.handle_webhook(
            "sms", {"X-Twilio-Signature": "x"}, b"Body=\xff", sink
        )
        assert binary.status == 400
        other_account = twilio.message_form(ANN, "x")
        other_account = [(k, "AC" + "0" * 32 if k == "AccountSid" else v) for k, v in other_account]
        assert (await post(adapter, twilio, sink, other_account))[0] == 403
        no_sid = [
            (k, v) for k, v in twilio.message_form(ANN, "x") if "Sid" not in k or k == "AccountSid"
        ]
        status, body = await post(adapter, twilio, sink, no_sid)
        assert (status, body) == (400, b"not a Twilio message: no MessageSid")
    assert sink.accepting == []


async def test_keywords_are_recorded_and_settled_without_a_turn(
    twilio: FakeTwilioServer, tmp_path: Path
) -> None:
    sink = ReportingSink()
    checkpoints = MemoryCheckpoints()
    async with new_adapter(twilio, tmp_path, checkpoints) as adapter:
        assert (await post(adapter, twilio, sink, twilio.message_form(ANN, " stop ")))[0] == 200
        assert await checkpoints.get(optout_name(ANN)) == "out"
        assert await adapter.opted_out(ANN)
        assert not await adapter.opted_out("whatsapp:" + ANN)  # a channel of its own
        with pytest.raises(PermanentSendError, match="opted out"):
            await adapter.send(outbound("a report"))
        assert twilio.sent == []
        await post(adapter, twilio, sink, twilio.message_form(ANN, "Unstop"))
        assert not await adapter.opted_out(ANN)
        await post(adapter, twilio, sink, twilio.message_form(ANN, "HELP"))
        await adapter.send(outbound("welcome back"))
    assert [d.split(" ")[0] for _, d in sink.settled] == ["opt-out", "opt-in", "help"]
    assert sink.accepting == []
    assert twilio.bodies(ANN) == ["welcome back"]


async def test_media_are_downloaded_with_the_account_credentials(
    twilio: FakeTwilioServer, tmp_path: Path
) -> None:
    sink = ReportingSink()
    photo, pdf = b"\x89PNG" + b"p" * 500, b"%PDF" + b"d" * 2000
    async with new_adapter(twilio, tmp_path, attachment_max_bytes=1000) as adapter:
        form = twilio.message_form(
            ANN, "files", media=[(photo, "image/png"), (pdf, "application/pdf")]
        )
        assert (await post(adapter, twilio, sink, form))[0] == 200
    [message] = sink.messages
    [attachment] = message.attachments
    assert attachment.mime_type == "image/png"
    assert await asyncio.to_thread(attachment.path.read_bytes) == photo
    assert attachment.path.is_relative_to(tmp_path / "files")
    assert "larger than 1000 bytes" in message.text  # the PDF is left out, and said so
    assert len(twilio.media_fetches) == 2


async def test_delivery_reports_reach_the_sink(twilio: FakeTwilioServer, tmp_path: Path) -> None:
    sink = ReportingSink()
    sink.known.add("SM1")
    async with new_adapter(twilio, tmp_path) as adapter:
        form = [
            ("MessageSid", "SM1"),
            ("MessageStatus", "undelivered"),
            ("ErrorCode", "30007"),
            ("AccountSid", DEFAULT_ACCOUNT_SID),
        ]
        assert (await post(adapter, twilio, sink, form, "status"))[0] == 200
    assert sink.reports == [
        ("SM1", "undelivered", "twilio undelivered: error 30007 (filtered by the carrier)")
    ]


# -- sending -------------------------------------------------------------------------------------


async def test_sms_and_whatsapp_sends(twilio: FakeTwilioServer, tmp_path: Path) -> None:
    async with new_adapter(twilio, tmp_path, status_callbacks=True) as adapter:
        receipt = await adapter.send(outbound("**Hi** _there_"))
        await adapter.send(outbound("**Hi** _there_", "whatsapp:" + ANN, key="k2"))
        plain = OutboundMessage(
            TWILIO,
            AccountId("default"),
            ChatId(ANN),
            "**as is**",
            "k3",
            format=TextFormat.PLAIN,
        )
        await adapter.send(plain)
    sms, whatsapp, raw = twilio.sent
    assert receipt.platform_message_id == sms.sid
    assert (sms.from_, sms.body) == (HERALD_NUMBER, "Hi there")
    assert (whatsapp.from_, whatsapp.to, whatsapp.body) == (
        WHATSAPP_NUMBER,
        "whatsapp:" + ANN,
        "*Hi* _there_",
    )
    assert raw.body == "**as is**"
    assert sms.status_callback == f"{PUBLIC}/webhooks/twilio/status"


async def test_a_chunk_longer_than_a_message_goes_in_parts(
    twilio: FakeTwilioServer, tmp_path: Path
) -> None:
    text = "`x` " * 500  # each `x` becomes ```x```: the WhatsApp text outgrows the chunk
    async with new_adapter(twilio, tmp_path) as adapter:
        receipt = await adapter.send(outbound(text, "whatsapp:" + ANN))
    assert len(twilio.sent) >= 2
    assert all(len(s.body) <= 1600 for s in twilio.sent)
    assert receipt.platform_message_id == twilio.sent[0].sid


async def test_send_errors(twilio: FakeTwilioServer, tmp_path: Path) -> None:
    checkpoints = MemoryCheckpoints()
    async with new_adapter(twilio, tmp_path, checkpoints, whatsapp_from=None) as adapter:
        twilio.rate_limit(1, retry_after=4)
        with pytest.raises(RateLimited) as limited:
            await adapter.send(outbound("a"))
        assert limited.value.retry_after == 4.0
        twilio.rate_limit(1)
        with pytest.raises(RateLimited) as limited:
            await adapter.send(outbound("a"))
        assert limited.value.retry_after == 1.0
        twilio.reject("+15550009999", 21211)
        with pytest.raises(PermanentSendError, match="21211"):
            await adapter.send(outbound("a", "+15550009999"))
        twilio.reject("+15550008888", 21610)
        with pytest.raises(PermanentSendError, match="21610"):
            await adapter.send(outbound("a", "+15550008888"))
        assert await adapter.opted_out("+15550008888")  # Twilio knows of a STOP we missed
        with pytest.raises(PermanentSendError, match="whatsapp_from"):
            await adapter.send(outbound("a", "whatsapp:" + ANN))
        with pytest.raises(PermanentSendError, match="not a phone number"):
            await adapter.send(outbound("a", "someone"))
        with pytest.raises(PermanentSendError, match="nothing to send"):
            await adapter.send(outbound("  "))
    assert twilio.sent == []
