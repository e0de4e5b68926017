"""Receiving by webhook: Telegram posts updates to `/webhooks/telegram`."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Awaitable, Callable, Mapping

from telegram import Bot, Update
from telegram.error import TelegramError

from adapters.inbound import Skipped
from adapters.telegram.config import TelegramConfig
from adapters.telegram.convert import (
    ALLOWED_UPDATES,
    error_from,
    parse_update,
)
from gateway.contracts.adapter import AdapterState, InboundSink, WebhookResponse

logger = logging.getLogger(__name__)

SECRET_HEADER = "x-telegram-bot-api-secret-token"  # noqa: S105 (a header name)
CHECK_INTERVAL = 60.0
"""Seconds between two `getWebhookInfo` checks that the webhook is still set."""

Receive = Callable[[Update, InboundSink], Awaitable[None]]


class WebhookReceiver:
    """Sets the webhook on start and verifies and stores each update Telegram posts.

    The webhook stays set on exit, so Telegram keeps updates (and retries them) while Herald is
    down. `run` checks every `CHECK_INTERVAL` that it is still set, and sets it again if not.
    """

    def __init__(
        self,
        bot: Bot,
        config: TelegramConfig,
        receive: Receive,
    ) -> None:
        assert config.webhook_url is not None
        assert config.webhook_secret is not None
        self.bot = bot
        self.config = config
        self.receive = receive
        self.url = config.webhook_url
        self._secret = config.webhook_secret.get_secret_value().encode()
        self._healthy = False

    async def start(self, *, drop_pending: bool = False) -> None:
        """Point Telegram at `webhook_url`, dropping waiting updates when `drop_pending`.

        Raises AuthError or NotReady.
        """
        try:
            await self.bot.set_webhook(
                self.url,
                secret_token=self._secret.decode(),
                allowed_updates=list(ALLOWED_UPDATES),
                drop_pending_updates=drop_pending,
            )
        except TelegramError as err:
            raise error_from(err, "setWebhook") from err
        self._healthy = True
        logger.info("telegram: webhook set to %s", self.url)

    def liveness(self) -> AdapterState:
        """RECEIVING while the webhook is known to be set."""
        return AdapterState.RECEIVING if self._healthy else AdapterState.RECONNECTING

    async def run(self, sink: InboundSink) -> None:
        """Check the webhook until cancelled; updates arrive through `handle`."""
        while True:
            await asyncio.sleep(CHECK_INTERVAL)
            try:
                info = await self.bot.get_webhook_info()
            except TelegramError as err:
                self._healthy = False
                raise error_from(err, "getWebhookInfo") from err
            if info.url != self.url:
                logger.warning(
                    "telegram: the webhook was changed to %r; setting it again", info.url
                )
                self._healthy = False
                await self.start()
            elif info.last_error_message:
                logger.warning(
                    "telegram: Telegram reports webhook errors (%d waiting): %s",
                    info.pending_update_count,
                    info.last_error_message,
                )

    async def handle(
        self, path: str, headers: Mapping[str, str], body: bytes, sink: InboundSink
    ) -> WebhookResponse:
        """403 on a missing or wrong secret, 400 on a body that is not an update, else store
        the update and answer 200 (after the inbox commit). Errors of the sink propagate."""
        if path.strip("/"):
            return WebhookResponse(404, b"no such webhook")
        given = next((v for k, v in headers.items() if k.lower() == SECRET_HEADER), "")
        if not hmac.compare_digest(given.encode(), self._secret):
            return WebhookResponse(403, b"wrong or missing secret token")
        try:
            data = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return WebhookResponse(400, b"the body is not JSON")
        update = parse_update(data)
        if isinstance(update, Skipped):
            return WebhookResponse(400, f"not a Telegram update: {update.reason}".encode())
        await self.receive(update, sink)
        return WebhookResponse(200, b"", "text/plain")
