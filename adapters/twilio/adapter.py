"""The Twilio connection: signed webhooks in, the Messages REST API out (SMS and WhatsApp)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Self

import aiohttp
from multidict import MultiDict
from twilio.base.exceptions import TwilioException, TwilioRestException
from twilio.request_validator import RequestValidator
from twilio.rest import Client

from adapters.files import download, keep, with_files
from adapters.inbound import Skipped
from adapters.inflight import InFlight, TrackedSends
from adapters.twilio import PLATFORM
from adapters.twilio.config import WHATSAPP, TwilioConfig
from adapters.twilio.convert import (
    MAX_PART,
    OPTED_OUT_CODE,
    Incoming,
    Keyword,
    MediaRef,
    error_from,
    is_address,
    parse_form,
    parts,
    to_inbound,
    to_sms,
    to_status,
    to_whatsapp,
)
from adapters.twilio.http import TwilioHttp, basic_auth, rest_url
from gateway.contracts.adapter import (
    AdapterContext,
    AdapterState,
    InboundSink,
    ReceiptSink,
    SettlingSink,
    WebhookResponse,
)
from gateway.contracts.errors import (
    AuthError,
    HeraldError,
    NotReady,
    PermanentSendError,
)
from gateway.contracts.ids import AccountId, ChatId, Platform, PlatformMessageId
from gateway.contracts.messages import (
    Attachment,
    DeliveryReceipt,
    InboundMessage,
    OutboundMessage,
    SendLimits,
    TextFormat,
    utcnow,
)

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "x-twilio-signature"
EMPTY_TWIML = b'<?xml version="1.0" encoding="UTF-8"?><Response/>'
"""The answer to an inbound message: nothing; the reply goes out through the REST API."""
PATHS = frozenset({"sms", "whatsapp", "status"})
REPORT_TRIES = 6
"""Tries to match a delivery report with its chunk: a report can overtake the commit of the
send's own answer (the message sid), so an unknown sid is looked up again for a moment."""
REPORT_PAUSE = 0.25

OPTED_OUT = "out"
MAX_MEDIA_BYTES = 5 * 1024 * 1024
"""The most Twilio takes in one MMS (WhatsApp takes up to 16 MB; the smaller limit holds)."""
OPTED_IN = "in"
KEYWORD_DETAIL: Mapping[Keyword, str] = {
    Keyword.STOP: "opt-out (STOP): nothing more is sent to this number until it sends START",
    Keyword.START: "opt-in (START): messages to this number are allowed again",
    Keyword.HELP: "help keyword (HELP): answered by Twilio, not by the agent",
}
"""The inbox outcome detail of each keyword message (outcome `dropped`: no turn runs)."""


def optout_name(chat: str) -> str:
    """The checkpoint that holds whether `chat` opted out."""
    return f"optout:{chat}"


class TwilioAdapter(TrackedSends):
    """One Twilio account: SMS (and WhatsApp) by signed webhooks in, REST API out.

    Entering fetches the account (AuthError when refused, NotReady when unreachable). Opt-outs
    are checkpoints shared by every instance: `send` refuses an opted-out number for good.
    """

    platform: Platform = PLATFORM

    def __init__(self, config: TwilioConfig, context: AdapterContext) -> None:
        self.config = config
        self._inflight = InFlight()
        self.files_dir = context.files
        self.checkpoints = context.checkpoints
        self.links = context.links
        self.webhook = context.webhook
        self.account = AccountId(config.account)
        self.limits = SendLimits(
            max_chunk=MAX_PART,
            min_send_interval=config.min_send_interval,
            max_file_bytes=MAX_MEDIA_BYTES if context.links is not None else None,
            voice=context.links is not None,  # media by link; WhatsApp shows no audio caption
        )
        self._validator = RequestValidator(config.auth_token.get_secret_value())
        self._http: TwilioHttp | None = None
        self._client: Client | None = None
        self._entered = False

    # -- connection -------------------------------------------------------------------------

    def _credentials(self) -> tuple[str, str]:
        """Who the REST API is called as: the API key, else the account and its token."""
        if self.config.api_key is not None and self.config.api_secret is not None:
            return self.config.api_key, self.config.api_secret.get_secret_value()
        return self.config.account_sid, self.config.auth_token.get_secret_value()

    def _new_client(self, http: TwilioHttp) -> Client:
        username, password = self._credentials()
        return Client(username, password, self.config.account_sid, http_client=http)

    async def __aenter__(self) -> Self:
        """Check the credentials by fetching the account. Raises AuthError or NotReady."""
        http = TwilioHttp(self.config.base_url, self.config.request_timeout)
        try:
            client = self._new_client(http)
            await self._fetch_account(client)
        except BaseException:
            await http.close()
            raise
        self._http, self._client, self._entered = http, client, True
        logger.info("twilio: ready for account %s", self.config.account_sid)
        return self

    async def __aexit__(self, *exc: object) -> None:
        http, self._http, self._client = self._http, None, None
        try:
            # New sends now fail with NotReady (nothing sent); those under way may finish.
            await self._drain_sends()
        finally:
            if http is not None:
                await http.close()

    async def _fetch_account(self, client: Client) -> Any:
        return await self._call(
            "fetch account", client.api.v2010.accounts(self.config.account_sid).fetch_async()
        )

    async def check(self) -> str:
        """Fetch the account without receiving: its name, status and the senders configured.
        Raises AuthError or NotReady."""
        http = TwilioHttp(self.config.base_url, self.config.request_timeout)
        try:
            account = await self._fetch_account(self._new_client(http))
        finally:
            await http.close()
        status = str(account.status or "unknown")
        if status != "active":
            raise AuthError(f"twilio: the account {self.config.account_sid} is {status}")
        senders = [s for s in (self.config.from_number, self.config.whatsapp_from) if s]
        return f"{account.friendly_name} ({account.sid}, {status}); sends from {', '.join(senders)}"

    def liveness(self) -> AdapterState:
        """RECEIVING while connected: messages arrive by webhook whenever Twilio has one."""
        if self._client is None:
            return AdapterState.STOPPED if self._entered else AdapterState.STARTING
        return AdapterState.RECEIVING

    async def run(self, sink: InboundSink) -> None:
        """Wait until cancelled: messages arrive through `handle_webhook`."""
        if self._client is None:
            raise NotReady("twilio: the adapter is not connected")
        await asyncio.Event().wait()

    # -- receiving --------------------------------------------------------------------------

    async def handle_webhook(
        self, path: str, headers: Mapping[str, str], body: bytes, sink: InboundSink
    ) -> WebhookResponse:
        """`/webhooks/twilio/sms`, `/whatsapp` (messages) and `/status` (delivery reports).

        403 and nothing stored when `X-Twilio-Signature` is missing or is not the signature of
        `public_url` + path and the form under the auth token, or the form is for another
        account; 400 when the body is not a message form. A message is stored before the
        answer, an empty TwiML document. Errors of the sink propagate.
        """
        path = path.strip("/")
        if path not in PATHS:
            return WebhookResponse(404, b"no such webhook")
        signature = next((v for k, v in headers.items() if k.lower() == SIGNATURE_HEADER), "")
        if not signature:
            return WebhookResponse(403, b"missing X-Twilio-Signature")
        try:
            fields = parse_form(body)
        except (UnicodeDecodeError, ValueError):
            return WebhookResponse(400, b"the body is not a form")
        if not self._validator.validate(
            self.config.webhook_url(path, self.webhook), MultiDict(fields), signature
        ):
            return WebhookResponse(403, b"wrong X-Twilio-Signature")
        form = dict(fields)
        if form.get("AccountSid") != self.config.account_sid:
            return WebhookResponse(403, b"not for this account")
        if path == "status":
            return await self._report(form, sink)
        incoming = to_inbound(form, account=self.account, now=utcnow())
        if isinstance(incoming, Skipped):
            return WebhookResponse(400, f"not a Twilio message: {incoming.reason}".encode())
        if incoming.keyword is not None:
            await self._keyword(incoming, incoming.keyword, sink)
        else:
            message = await with_files(
                incoming.message,
                incoming.media,
                lambda i, ref: self._download(incoming.message, i, ref),
                sink=sink,
            )
            await sink.accept(message)
        return WebhookResponse(200, EMPTY_TWIML, "text/xml")

    async def _keyword(self, incoming: Incoming, word: Keyword, sink: InboundSink) -> None:
        """Record an opt-out or opt-in, then store the message as handled: no turn answers
        it (Twilio sends the carrier's confirmation for its standard keywords)."""
        message = incoming.message
        if word is not Keyword.HELP:
            value = OPTED_OUT if word is Keyword.STOP else OPTED_IN
            await self.checkpoints.set(optout_name(message.chat_id), value)
            logger.info("twilio: %s opted %s (%s)", message.chat_id, value, message.text.strip())
        if isinstance(sink, SettlingSink):
            await sink.settle(message, KEYWORD_DETAIL[word])
        else:  # a sink that cannot settle: let the agent see it rather than lose it
            await sink.accept(message)

    async def _report(self, form: Mapping[str, str], sink: InboundSink) -> WebhookResponse:
        report = to_status(form)
        if isinstance(report, Skipped):
            return WebhookResponse(400, f"not a status callback: {report.reason}".encode())
        if not isinstance(sink, ReceiptSink):
            return WebhookResponse(200, EMPTY_TWIML, "text/xml")
        sid = PlatformMessageId(report.message_sid)
        for attempt in range(REPORT_TRIES):
            if await sink.delivery_report(
                self.platform, self.account, sid, report.status, report.error
            ):
                break
            if attempt + 1 < REPORT_TRIES:
                await asyncio.sleep(REPORT_PAUSE * (attempt + 1))
        else:
            logger.info("twilio: status %s of unknown message %s", report.status, sid)
        if report.error:
            logger.warning("twilio: message %s %s", sid, report.error)
        return WebhookResponse(200, EMPTY_TWIML, "text/xml")

    async def _download(self, message: InboundMessage, index: int, ref: MediaRef) -> Attachment:
        """Fetch one medium with the account's credentials, at most `attachment_max_bytes`.
        Raises NotReady (try again later) or PermanentSendError (leave it out)."""
        session = self._connected_http().session
        assert session is not None
        data = await download(
            session,
            rest_url(ref.url, self.config.base_url),
            what=f"twilio: media {index}",
            limit=self.config.attachment_max_bytes,
            headers={"Authorization": basic_auth(*self._credentials())},
            client_timeout=aiohttp.ClientTimeout(total=self.config.request_timeout),
        )
        key = f"{message.chat_id}:{message.platform_message_id}"
        return await keep(
            self.files_dir, key, index, data, mime_type=ref.mime_type, filename=ref.filename
        )

    # -- sending ----------------------------------------------------------------------------

    async def opted_out(self, chat: str) -> bool:
        """Whether `chat` sent STOP (and no START since)."""
        return await self.checkpoints.get(optout_name(chat)) == OPTED_OUT

    async def _send(self, message: OutboundMessage) -> DeliveryReceipt:
        """Send one chunk as one or more messages of at most 1600 characters; the receipt
        names the first. Raises PermanentSendError (opted out, bad number, no sender for the
        channel), RateLimited, AuthError or NotReady."""
        client = self._connected()
        chat = message.chat_id
        if not is_address(chat):
            raise PermanentSendError(f"twilio: {chat!r} is not a phone number")
        if await self.opted_out(chat):
            raise PermanentSendError(f"twilio: {chat} opted out (STOP); not sent")
        whatsapp = chat.startswith(WHATSAPP)
        sender = self.config.whatsapp_from if whatsapp else self.config.from_number
        if sender is None:
            channel = "whatsapp_from" if whatsapp else "from_number"
            raise PermanentSendError(f"twilio: no {channel} is configured to send to {chat}")
        pieces = parts(self._render(message, whatsapp=whatsapp))
        media = [self._media_url(a) for a in message.attachments]
        if any(a.voice for a in message.attachments):
            pieces = []  # a voice reply: no caption (WhatsApp shows none on audio)
        if not pieces and not media:
            raise PermanentSendError("twilio: nothing to send (no text)")
        callback = (
            self.config.webhook_url("status", self.webhook)
            if self.config.status_callbacks
            else None
        )
        first: str | None = None
        for i, piece in enumerate(pieces or [""]):
            # The files go with the last part, after the text they may be captioned by.
            last = i == max(len(pieces), 1) - 1
            sent = await self._create(
                client, chat, sender, piece, callback, media=media if last else []
            )
            first = first or str(sent.sid)
        return DeliveryReceipt(PlatformMessageId(first) if first else None)

    def _media_url(self, attachment: Attachment) -> str:
        """A signed, expiring URL under Herald's HTTP server that Twilio fetches the file from."""
        if self.links is None:
            raise PermanentSendError(
                "twilio: files are fetched from Herald's HTTP server, which is off (api.enabled)"
            )
        if attachment.size > MAX_MEDIA_BYTES:
            raise PermanentSendError(
                f"twilio: {attachment.filename or attachment.path.name} is larger than "
                f"{MAX_MEDIA_BYTES} bytes"
            )
        try:
            return self.links.link(attachment, self.config.public_url)
        except ValueError as err:
            name = attachment.filename or attachment.path.name
            raise PermanentSendError(f"twilio: {name} cannot be linked: {err}") from err

    async def _create(
        self,
        client: Client,
        to: ChatId,
        sender: str,
        body: str,
        callback: str | None,
        *,
        media: list[str] | None = None,
    ) -> Any:
        kwargs: dict[str, Any] = {"to": to, "from_": sender, "body": body}
        if media:
            kwargs["media_url"] = media
        if callback is not None:
            kwargs["status_callback"] = callback
        try:
            return await self._call("send", client.messages.create_async(**kwargs))
        except PermanentSendError as err:
            if f"error {OPTED_OUT_CODE}" in str(err):
                await self.checkpoints.set(optout_name(to), OPTED_OUT)
            raise

    @staticmethod
    def _render(message: OutboundMessage, *, whatsapp: bool) -> str:
        if message.format is TextFormat.PLAIN:
            return message.text.strip()
        return to_whatsapp(message.text) if whatsapp else to_sms(message.text)

    def _connected(self) -> Client:
        if self._client is None:
            raise NotReady("twilio: the adapter is not connected")
        return self._client

    def _connected_http(self) -> TwilioHttp:
        if self._http is None:
            raise NotReady("twilio: the adapter is not connected")
        return self._http

    @staticmethod
    async def _call(what: str, request: Any) -> Any:
        """Await one REST call; Twilio's failures as Herald errors."""
        try:
            return await request
        except TwilioRestException as err:
            code = err.code if isinstance(err.code, int) else None
            raise error_from(int(err.status), code, str(err.msg), what) from err
        except HeraldError:
            raise
        except TwilioException as err:
            status = getattr(err, "status", 0)
            code = getattr(err, "code", None)
            detail = str(getattr(err, "detail", "") or err)
            if isinstance(status, int) and status:
                raise error_from(
                    status, code if isinstance(code, int) else None, detail, what
                ) from err
            raise NotReady(f"twilio: {what}: {err}") from err
