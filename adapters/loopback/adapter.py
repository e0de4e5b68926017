"""The loopback connection: long-polls updates, sends, edits and shows typing over HTTP."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Self

import httpx

from adapters.inbound import Skipped
from adapters.inflight import InFlight, TrackedSends
from adapters.loopback import PLATFORM
from adapters.loopback.config import LoopbackConfig
from adapters.loopback.convert import (
    parse_error,
    to_edit_payload,
    to_inbound,
    to_send_payload,
    to_typing_payload,
    update_id_of,
)
from gateway.contracts.adapter import AdapterState, InboundSink
from gateway.contracts.errors import (
    AuthError,
    NotReady,
    PermanentSendError,
    RateLimited,
)
from gateway.contracts.ids import AccountId, ChatId, Platform, PlatformMessageId, ThreadId
from gateway.contracts.messages import DeliveryReceipt, OutboundMessage, SendLimits

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0
REQUEST_TIMEOUT = 10.0
"""Seconds a send, edit or typing request may take; a poll gets `poll_timeout` more."""
MAX_POLL_PAUSE = 60.0
"""Longest pause after a poll was rate limited."""


class LoopbackAdapter(TrackedSends):
    """The test-only loopback platform: an Adapter, a TypingIndicator and a MessageEditor.

    Receives by long polling `GET /bot<token>/updates`. An update is acknowledged (by the
    offset of the next poll) only after `sink.accept` returned for it, so a crash or a failing
    sink means the platform delivers it again.
    """

    platform: Platform = PLATFORM

    def __init__(self, config: LoopbackConfig) -> None:
        self.config = config
        self.account = AccountId(config.account)
        self.limits = SendLimits(
            max_chunk=1000, count_utf16=False, min_edit_interval=0.2, min_send_interval=0.0
        )
        self._client: httpx.AsyncClient | None = None
        self._inflight = InFlight()
        self._offset = 0
        self._last_poll: float | None = None

    async def __aenter__(self) -> Self:
        """Open the client and check the token (`GET /me`). Raises AuthError or NotReady."""
        base = f"{self.config.url.rstrip('/')}/bot{self.config.token.get_secret_value()}"
        client = httpx.AsyncClient(
            base_url=base,
            timeout=httpx.Timeout(REQUEST_TIMEOUT, connect=CONNECT_TIMEOUT),
            trust_env=False,
        )
        try:
            await self._call(client, "GET", "/me")
        except (PermanentSendError, RateLimited) as err:
            await client.aclose()
            if isinstance(err, PermanentSendError):  # 403 / 404: wrong token or wrong URL
                raise AuthError(f"{err} (checking the token)") from err
            raise NotReady(str(err)) from err
        except BaseException:
            await client.aclose()
            raise
        self._client = client
        self._last_poll = time.monotonic()
        return self

    async def __aexit__(self, *exc: object) -> None:
        # A send under way may already be delivered: closing the client under it would make
        # it fail and be sent again.
        await self._drain_sends()
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def liveness(self) -> AdapterState:
        """RECEIVING while polls complete in time, RECONNECTING when they stopped."""
        if self._client is None:
            return AdapterState.STOPPED if self._last_poll is not None else AdapterState.STARTING
        assert self._last_poll is not None
        window = 2 * self.config.poll_timeout + 5.0
        if time.monotonic() - self._last_poll <= window:
            return AdapterState.RECEIVING
        return AdapterState.RECONNECTING

    async def run(self, sink: InboundSink) -> None:
        """Poll and hand each message to `sink` in order, until cancelled.

        Raises AuthError (token refused), NotReady (connection lost, server error), or
        whatever `sink.accept` raised: then the message stays unacknowledged on the server.
        """
        client = self._connected()
        while True:
            try:
                body = await self._call(
                    client,
                    "GET",
                    "/updates",
                    params={"offset": self._offset, "timeout": self.config.poll_timeout},
                    wait=self.config.poll_timeout,
                )
            except RateLimited as err:
                logger.warning("loopback: polling rate limited; pausing %.1fs", err.retry_after)
                await asyncio.sleep(min(err.retry_after, MAX_POLL_PAUSE))
                continue
            except PermanentSendError as err:
                raise NotReady(f"polling refused: {err}") from err
            updates = body.get("updates")
            if not isinstance(updates, list):
                raise NotReady("loopback: the updates answer has no list of updates")
            self._last_poll = time.monotonic()
            for update in updates:
                await self._receive(update, sink)

    async def _receive(self, update: Any, sink: InboundSink) -> None:
        update_id = update_id_of(update)
        message = to_inbound(update, self.account)
        if isinstance(message, Skipped):
            logger.warning("loopback: skipped update %s: %s", update_id, message.reason)
        else:
            await sink.accept(message)  # raises: the offset stays, the update comes again
        if update_id is not None:
            self._offset = max(self._offset, update_id + 1)

    async def _send(self, message: OutboundMessage) -> DeliveryReceipt:
        """Deliver one chunk. Raises RateLimited, MarkupRejected, PermanentSendError, NotReady."""
        body = await self._call(self._connected(), "POST", "/send", json=to_send_payload(message))
        return DeliveryReceipt(_message_id(body))

    async def edit(self, target: PlatformMessageId, message: OutboundMessage) -> DeliveryReceipt:
        """Replace the text of `target` with `message.text`. Raises like `send`."""
        payload = to_edit_payload(target, message)
        body = await self._call(self._connected(), "POST", "/edit", json=payload)
        return DeliveryReceipt(_message_id(body) or target)

    async def typing(self, chat_id: ChatId, thread_id: ThreadId | None) -> None:
        """Show "typing…" in the chat once. Raises like `send`."""
        payload = to_typing_payload(chat_id, thread_id)
        await self._call(self._connected(), "POST", "/typing", json=payload)

    def _connected(self) -> httpx.AsyncClient:
        if self._client is None:
            raise NotReady("loopback: the adapter is not connected")
        return self._client

    async def _call(
        self,
        client: httpx.AsyncClient,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: dict[str, Any] | None = None,
        wait: float = 0.0,
    ) -> dict[str, Any]:
        """One request; its JSON answer when 200 and `ok`, else the matching Herald error.

        `wait`: seconds the server may hold the request (a long poll) on top of the timeout.
        """
        try:
            response = await client.request(
                method,
                path,
                params=params,
                json=json,
                timeout=httpx.Timeout(REQUEST_TIMEOUT + wait, connect=CONNECT_TIMEOUT),
            )
        except httpx.HTTPError as err:
            raise NotReady(f"loopback: {path} failed: {type(err).__name__}: {err}") from err
        try:
            body: Any = response.json()
        except ValueError:
            body = None
        if response.status_code != 200:
            raise parse_error(response.status_code, body, response.headers)
        if not isinstance(body, dict) or body.get("ok") is not True:
            raise NotReady(f"loopback: {path} answered 200 without an ok JSON object")
        return body


def _message_id(body: dict[str, Any]) -> PlatformMessageId | None:
    value = body.get("message_id")
    return PlatformMessageId(value) if isinstance(value, str) and value else None
