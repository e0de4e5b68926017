"""Receiving over Socket Mode: one websocket at a time, each envelope acknowledged after the
inbox commit.

slack-sdk's own Socket Mode client runs every envelope's listeners as a separate,
unsupervised task, so two messages of one chat can be stored out of order, and it may open the
next socket before the old one is gone. Herald keeps the protocol (it is small) on aiohttp and
handles envelopes one at a time, in the order Slack sent them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack.config import SlackConfig
from adapters.slack.convert import error_from
from gateway.contracts.adapter import AdapterState, InboundSink
from gateway.contracts.errors import AuthError, NotReady

logger = logging.getLogger(__name__)

Dispatch = Callable[[dict[str, Any], InboundSink], Awaitable[int]]
"""Stores one event callback body (or interactivity payload: a button press) through the sink;
returns an HTTP-like status."""

MAX_MESSAGE = 4 * 1024 * 1024


class SocketModeReceiver:
    """Holds one Socket Mode connection; reconnects when Slack asks (`disconnect`).

    An envelope is acknowledged only after `dispatch` stored its event (status 200); when
    storing fails, the socket is closed unacknowledged and `run` raises NotReady, so Slack
    delivers the envelope again on the next connection. A socket whose pongs stop coming is
    closed by aiohttp's heartbeat, and `run` raises NotReady.
    """

    def __init__(
        self,
        web: AsyncWebClient,
        http: aiohttp.ClientSession,
        config: SlackConfig,
        dispatch: Dispatch,
    ) -> None:
        assert config.app_token is not None
        self.web = web
        self.http = http
        self.config = config
        self.dispatch = dispatch
        self._app_token = config.app_token.get_secret_value()
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._hello = False

    def liveness(self) -> AdapterState:
        """RECEIVING while a socket is open and Slack said hello on it."""
        ws = self._ws
        if ws is not None and not ws.closed and self._hello:
            return AdapterState.RECEIVING
        return AdapterState.RECONNECTING

    async def start(self) -> None:
        """Check the app token (a connection URL can be issued). Raises AuthError or NotReady."""
        await self._open_url()

    async def run(self, sink: InboundSink) -> None:
        """Receive until cancelled. Raises NotReady (socket lost) or AuthError."""
        while True:
            url = await self._open_url()
            reason = await self._serve(url, sink)
            logger.info("slack: Slack asked to reconnect (%s)", reason)

    async def _open_url(self) -> str:
        try:
            answer = await self.web.apps_connections_open(app_token=self._app_token)
        except SlackApiError as err:
            response = err.response
            raise error_from(
                response.status_code,
                response.get("error"),
                response.headers.get("Retry-After"),
                "apps.connections.open",
            ) from err
        except (aiohttp.ClientError, TimeoutError) as err:
            raise NotReady(f"slack: apps.connections.open: {type(err).__name__}: {err}") from err
        url = answer.get("url")
        if not isinstance(url, str) or not url.startswith(("ws://", "wss://")):
            raise NotReady("slack: apps.connections.open answered without a websocket URL")
        return url

    async def _serve(self, url: str, sink: InboundSink) -> str:
        """Serve one socket until Slack asks to reconnect (the reason is returned)."""
        try:
            ws = await self.http.ws_connect(
                url, heartbeat=self.config.ping_interval, max_msg_size=MAX_MESSAGE
            )
        except (aiohttp.ClientError, TimeoutError) as err:
            raise NotReady(f"slack: connecting the socket: {type(err).__name__}: {err}") from err
        self._ws, self._hello = ws, False
        try:
            async for frame in ws:
                if frame.type is not aiohttp.WSMsgType.TEXT:
                    continue
                reason = await self._handle(ws, frame.data, sink)
                if reason is not None:
                    return reason
        finally:
            self._ws = None
            await ws.close()
        raise NotReady(f"slack: the socket closed (code {ws.close_code}, {ws.exception()})")

    async def _handle(
        self, ws: aiohttp.ClientWebSocketResponse, data: str, sink: InboundSink
    ) -> str | None:
        try:
            message = json.loads(data)
        except json.JSONDecodeError:
            logger.warning("slack: a socket message that is not JSON was ignored")
            return None
        if not isinstance(message, dict):
            return None
        kind = message.get("type")
        if kind == "hello":
            self._hello = True
            return None
        if kind == "disconnect":
            reason = str(message.get("reason") or "unknown")
            if reason == "link_disabled":
                raise AuthError("slack: Socket Mode is turned off for this app")
            return reason
        envelope = message.get("envelope_id")
        payload = message.get("payload")
        if not isinstance(envelope, str):
            return None
        if kind in ("events_api", "interactive") and isinstance(payload, dict):
            status = await self.dispatch(payload, sink)
            if status != 200:
                raise NotReady(f"slack: an event could not be stored (status {status})")
        await ws.send_str(json.dumps({"envelope_id": envelope}))
        return None
