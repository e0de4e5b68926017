"""The Slack connection: slack-bolt dispatches events, slack-sdk's Web API client sends."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

import aiohttp
from slack_bolt.async_app import AsyncAck, AsyncApp
from slack_bolt.authorization import AuthorizeResult
from slack_bolt.context.async_context import AsyncBoltContext
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from adapters.files import download, keep, with_files
from adapters.inbound import FileRef, Skipped, log_skipped, message_key
from adapters.inflight import InFlight, TrackedSends
from adapters.slack import PLATFORM
from adapters.slack.config import SlackConfig, SlackMode
from adapters.slack.convert import (
    NOT_ADDRESSED,
    BotIdentity,
    blocks_for,
    error_from,
    pressed,
    reaction_from,
    split_message_key,
    to_inbound,
)
from adapters.slack.markup import to_mrkdwn
from adapters.slack.socket_mode import SocketModeReceiver
from gateway.contracts.adapter import AdapterState, InboundSink, ReactionSink, WebhookResponse
from gateway.contracts.errors import HeraldError, NotReady, PermanentSendError
from gateway.contracts.ids import AccountId, ChatId, Platform, PlatformMessageId
from gateway.contracts.messages import (
    Attachment,
    DeliveryReceipt,
    OutboundMessage,
    SendLimits,
    TextFormat,
    utcnow,
)

logger = logging.getLogger(__name__)

REQUEST_TIMEOUT = 20
SINK = "herald_sink"
"""The bolt context key under which a request carries the inbox sink."""


def _malformed(body: Any) -> str | None:
    """Why a parsed request body cannot be routed by bolt, or None when it can."""
    if not isinstance(body, dict):
        return "the body is not an object"
    if body.get("type") != "event_callback":
        return None  # url_verification, ssl_check and the like: bolt answers them
    event = body.get("event")
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        return "the event has no type"
    return None


def _escape(text: str) -> str:
    """Plain text for Slack: only `&`, `<` and `>` need escaping."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class SlackAdapter(TrackedSends):
    """One Slack app in one workspace: Socket Mode or Events API in, Web API out.

    Entering checks the bot token with `auth.test` (and, in Socket Mode, the app token) and
    raises AuthError when one is refused, NotReady when Slack is unreachable.
    """

    platform: Platform = PLATFORM

    def __init__(self, config: SlackConfig, files_dir: Path) -> None:
        self.config = config
        self.files_dir = files_dir
        self.account = AccountId(config.account)
        self.limits = SendLimits(
            max_chunk=3900,
            count_utf16=False,
            min_edit_interval=config.min_edit_interval,
            min_send_interval=config.min_send_interval,
            max_file_bytes=1024 * 1024 * 1024,  # Slack's upload limit: 1 GB
            voice=True,  # an audio file, with the spoken text as its comment
            voice_caption=3900,
        )
        self._http: aiohttp.ClientSession | None = None
        self._inflight = InFlight()
        self._web: AsyncWebClient | None = None
        self._bolt: AsyncApp | None = None
        self._identity: BotIdentity | None = None
        self._socket: SocketModeReceiver | None = None
        self._entered = False

    def _client(self, http: aiohttp.ClientSession) -> AsyncWebClient:
        return AsyncWebClient(
            token=self.config.bot_token.get_secret_value(),
            base_url=self.config.base_url,
            session=http,
            timeout=REQUEST_TIMEOUT,
            # No retries inside the client: a retried post may be a duplicate post, and the
            # outbox already retries with backoff and knows which sends were cut off.
            retry_handlers=[],
        )

    async def __aenter__(self) -> Self:
        """Check the tokens and get ready to receive. Raises AuthError or NotReady."""
        http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT))
        try:
            web = self._client(http)
            identity = await self._auth_test(web)
            self._identity = identity
            bolt = self._new_bolt(web, identity)
            socket = None
            if self.config.mode is SlackMode.SOCKET:
                socket = SocketModeReceiver(web, http, self.config, self._dispatch)
                await socket.start()
        except BaseException:
            await http.close()
            raise
        self._http, self._web, self._bolt, self._socket = http, web, bolt, socket
        self._entered = True
        logger.info("slack: connected as %s (%s mode)", identity.user_id, self.config.mode)
        return self

    async def __aexit__(self, *exc: object) -> None:
        http, self._http, self._web, self._bolt, self._socket = self._http, None, None, None, None
        try:
            # New sends now fail with NotReady (nothing sent); those under way may finish.
            await self._drain_sends()
        finally:
            if http is not None:
                await http.close()

    async def _auth_test(self, web: AsyncWebClient) -> BotIdentity:
        answer = await self._call("auth.test", web.auth_test())
        user_id, bot_id = answer.get("user_id"), answer.get("bot_id")
        if not isinstance(user_id, str) or not user_id:
            raise NotReady("slack: auth.test answered without a user_id")
        return BotIdentity(user_id, bot_id if isinstance(bot_id, str) else "")

    async def check(self) -> str:
        """Check the tokens (`auth.test`; `apps.connections.open` in Socket Mode) without
        receiving. Raises AuthError or NotReady."""
        async with aiohttp.ClientSession() as http:
            web = self._client(http)
            answer = await self._call("auth.test", web.auth_test())
            detail = f"{answer.get('user')} ({answer.get('user_id')}) in {answer.get('team')}"
            if self.config.mode is SlackMode.SOCKET:
                receiver = SocketModeReceiver(web, http, self.config, self._dispatch)
                await receiver.start()
                detail += ", app token ok (Socket Mode)"
            else:
                detail += ", Events API"
            return detail

    def _new_bolt(self, web: AsyncWebClient, identity: BotIdentity) -> AsyncApp:
        token = self.config.bot_token.get_secret_value()

        async def authorize(**_: Any) -> AuthorizeResult:
            return AuthorizeResult(
                enterprise_id=None,
                team_id=None,
                bot_user_id=identity.user_id,
                bot_id=identity.bot_id,
                bot_token=token,
            )

        secret = self.config.signing_secret
        bolt = AsyncApp(
            # A client without a token: `authorize` supplies it (bolt warns about both).
            client=AsyncWebClient(base_url=self.config.base_url, session=web.session),
            authorize=authorize,
            signing_secret=secret.get_secret_value() if secret is not None else None,
            request_verification_enabled=secret is not None,
            process_before_response=True,
            raise_error_for_unhandled_request=False,
        )
        bolt.event("message")(self._on_message)
        bolt.event("app_mention")(self._on_message)
        bolt.event("reaction_added")(self._on_reaction)
        bolt.event(re.compile(".*"))(self._on_other_event)
        bolt.action(re.compile(".*"))(self._on_press)
        return bolt

    def liveness(self) -> AdapterState:
        """Socket Mode: the socket's state; Events API: RECEIVING while connected."""
        if self._web is None:
            return AdapterState.STOPPED if self._entered else AdapterState.STARTING
        if self._socket is not None:
            return self._socket.liveness()
        return AdapterState.RECEIVING

    async def run(self, sink: InboundSink) -> None:
        """Receive until cancelled (Socket Mode), or wait while events come by webhook."""
        if self._web is None:
            raise NotReady("slack: the adapter is not connected")
        if self._socket is not None:
            await self._socket.run(sink)
        else:
            await asyncio.Event().wait()

    async def handle_webhook(
        self, path: str, headers: Mapping[str, str], body: bytes, sink: InboundSink
    ) -> WebhookResponse:
        """`/webhooks/slack/events` (events, and button presses when it is also the
        Interactivity Request URL) and `/webhooks/slack/interactivity`: verified by bolt (401
        on a bad or stale signature), stored before the 200; `url_verification` answered.
        404 in Socket Mode."""
        if self._socket is not None or self._bolt is None:
            return WebhookResponse(404, b"this app receives over Socket Mode")
        if path.strip("/") not in ("events", "interactivity"):
            return WebhookResponse(404, b"no such webhook")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            return WebhookResponse(400, b"the body is not UTF-8")
        try:  # bolt parses the body in the constructor, before it checks the signature
            request = AsyncBoltRequest(body=text, headers=dict(headers), context={SINK: sink})
        except (ValueError, TypeError, AttributeError, KeyError):
            return WebhookResponse(400, b"the body is not a Slack request")
        malformed = _malformed(request.body)
        if malformed is not None:
            return WebhookResponse(400, f"not a Slack event: {malformed}".encode())
        response = await self._bolt.async_dispatch(request)
        content_type = (response.headers.get("content-type") or ["text/plain"])[0]
        return WebhookResponse(response.status, (response.body or "").encode(), content_type)

    # -- receiving --------------------------------------------------------------------------

    async def _dispatch(self, payload: dict[str, Any], sink: InboundSink) -> int:
        """One Socket Mode event (or button press) through bolt, as Slack would have posted it.

        A malformed event, or an interaction Herald does not handle, is passed over (200, so it
        is acknowledged); anything but 200 means it could not be stored and must come again.
        """
        assert self._bolt is not None
        try:
            request = AsyncBoltRequest(body=payload, mode="socket_mode", context={SINK: sink})
        except (ValueError, TypeError, AttributeError, KeyError) as err:
            logger.warning("slack: a malformed event was passed over: %s", err)
            return 200
        malformed = _malformed(request.body)
        if malformed is not None:
            logger.warning("slack: a malformed event was passed over: %s", malformed)
            return 200
        response = await self._bolt.async_dispatch(request)
        if response.status == 404:  # an interaction nothing here handles (a shortcut, a form)
            logger.info("slack: a %s payload was passed over", request.body.get("type"))
            return 200
        return response.status

    async def _on_message(self, body: dict[str, Any], context: AsyncBoltContext) -> None:
        sink: InboundSink = context[SINK]
        assert self._identity is not None
        incoming = to_inbound(
            body, bot=self._identity, account=self.account, config=self.config, now=utcnow()
        )
        if isinstance(incoming, Skipped):
            what = f"{PLATFORM}: event {body.get('event_id')}"
            log_skipped(logger, what, incoming, quiet=(NOT_ADDRESSED,))
            return
        key = incoming.message.platform_message_id
        message = await with_files(
            incoming.message,
            incoming.files,
            lambda i, ref: self._download(key, i, ref),
            sink=sink,
        )
        await sink.accept(message)

    async def _on_reaction(self, body: dict[str, Any], context: AsyncBoltContext) -> None:
        sink: InboundSink = context[SINK]
        assert self._identity is not None
        reaction = reaction_from(body, bot=self._identity, account=self.account)
        if isinstance(reaction, Skipped):
            log_skipped(logger, f"{PLATFORM}: event {body.get('event_id')}", reaction)
        elif isinstance(sink, ReactionSink):
            await sink.react(reaction)

    async def _on_press(
        self, ack: AsyncAck, body: dict[str, Any], context: AsyncBoltContext
    ) -> None:
        """A button press: stored as the presser's own command, then acknowledged (a press
        that cannot be stored is not acknowledged, and Slack tells the presser it failed)."""
        sink: InboundSink = context[SINK]
        assert self._identity is not None
        incoming = pressed(body, bot=self._identity, account=self.account)
        if isinstance(incoming, Skipped):
            log_skipped(logger, f"{PLATFORM}: a button press", incoming)
        else:
            await sink.accept(incoming.message)
        await ack()

    async def _on_other_event(self, body: dict[str, Any]) -> None:
        event = body.get("event")
        kind = event.get("type") if isinstance(event, dict) else None
        logger.debug("slack: event %s of type %s ignored", body.get("event_id"), kind)

    async def _download(self, key: PlatformMessageId, index: int, ref: FileRef) -> Attachment:
        """Fetch one file with the bot token. Raises NotReady or PermanentSendError."""
        assert self._http is not None
        data = await download(
            self._http,
            ref.url,
            what=f"slack: downloading {ref.filename}",
            limit=self.config.attachment_max_bytes,
            headers={"Authorization": f"Bearer {self.config.bot_token.get_secret_value()}"},
        )
        return await keep(
            self.files_dir, key, index, data, mime_type=ref.mime_type, filename=ref.filename
        )

    # -- sending ----------------------------------------------------------------------------

    async def _send(self, message: OutboundMessage) -> DeliveryReceipt:
        """Post one chunk (in its thread), then its files. Raises RateLimited,
        PermanentSendError, AuthError or NotReady."""
        web = self._connected()
        thread = message.thread_id or None
        receipt: DeliveryReceipt | None = None
        if len(message.attachments) == 1 and message.attachments[0].voice:
            # A spoken reply: the audio file with its text as the file's comment, in one call.
            voice = message.attachments[0]
            data = await asyncio.to_thread(voice.path.read_bytes)
            await self._call(
                "files.upload",
                web.files_upload_v2(
                    channel=message.chat_id,
                    thread_ts=thread,
                    content=data,
                    filename=voice.filename or voice.path.name,
                    initial_comment=self._render(message) if message.text.strip() else None,
                ),
            )
            return DeliveryReceipt(None)
        if message.text.strip():
            text = self._render(message)
            markdown = message.format is TextFormat.MARKDOWN
            blocks = None
            if message.buttons:
                shown = text if markdown else message.text
                blocks = blocks_for(shown, message.buttons, mrkdwn=markdown)
            answer = await self._call(
                "chat.postMessage",
                web.chat_postMessage(
                    channel=message.chat_id,
                    text=text,
                    blocks=blocks,
                    thread_ts=thread,
                    mrkdwn=markdown,
                    unfurl_links=False,
                ),
            )
            receipt = DeliveryReceipt(
                message_key(str(answer.get("channel") or message.chat_id), str(answer["ts"]))
            )
        for attachment in message.attachments:
            data = await asyncio.to_thread(attachment.path.read_bytes)
            await self._call(
                "files.upload",
                web.files_upload_v2(
                    channel=message.chat_id,
                    thread_ts=thread,
                    content=data,
                    filename=attachment.filename or attachment.path.name,
                ),
            )
        if receipt is None:
            if not message.attachments:
                raise PermanentSendError("slack: nothing to send (no text and no files)")
            receipt = DeliveryReceipt(None)
        return receipt

    async def edit(self, target: PlatformMessageId, message: OutboundMessage) -> DeliveryReceipt:
        """Replace the text of `target` (`chat.update`). Raises like `send`."""
        parsed = split_message_key(target)
        if parsed is None:
            raise PermanentSendError(f"slack: {target!r} is not a Slack message id")
        channel, ts = parsed
        text = self._render(message)
        if text.strip():  # Slack refuses an empty message; a blank edit changes nothing
            await self._call(
                "chat.update", self._connected().chat_update(channel=channel, ts=ts, text=text)
            )
        return DeliveryReceipt(message_key(channel, ts))

    async def working(self, chat_id: ChatId, message: PlatformMessageId) -> None:
        """Add the working reaction to the message being answered."""
        await self._react("reactions.add", chat_id, message)

    async def done(self, chat_id: ChatId, message: PlatformMessageId) -> None:
        """Remove the working reaction again."""
        await self._react("reactions.remove", chat_id, message)

    async def _react(self, method: str, chat_id: ChatId, message: PlatformMessageId) -> None:
        name = self.config.working_reaction
        parsed = split_message_key(message)
        if not name or parsed is None:
            return
        web = self._connected()
        call = web.reactions_add if method == "reactions.add" else web.reactions_remove
        try:
            await self._call(method, call(channel=parsed[0], timestamp=parsed[1], name=name))
        except PermanentSendError as err:  # already there / already gone: nothing to do
            logger.debug("%s", err)

    def _render(self, message: OutboundMessage) -> str:
        if message.format is TextFormat.PLAIN:
            return _escape(message.text)
        return to_mrkdwn(message.text)

    def _connected(self) -> AsyncWebClient:
        if self._web is None:
            raise NotReady("slack: the adapter is not connected")
        return self._web

    @staticmethod
    async def _call(method: str, request: Any) -> Any:
        """Await one Web API call; Slack's failures as Herald errors."""
        try:
            return await request
        except SlackApiError as err:
            response = err.response
            raise error_from(
                response.status_code,
                response.get("error") if isinstance(response.data, dict) else None,
                response.headers.get("Retry-After") or response.headers.get("retry-after"),
                method,
            ) from err
        except HeraldError:
            raise
        except (aiohttp.ClientError, TimeoutError) as err:
            raise NotReady(f"slack: {method}: {type(err).__name__}: {err}") from err
