"""Receiving by `getUpdates` long polling, with the offset moved only after the inbox commit."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from telegram import Bot, Update
from telegram.error import RetryAfter, TelegramError

from adapters.inbound import Skipped
from adapters.telegram.config import TelegramConfig
from adapters.telegram.convert import (
    ALLOWED_UPDATES,
    error_from,
    parse_update,
)
from gateway.contracts.adapter import AdapterState, InboundSink
from gateway.contracts.errors import NotReady

logger = logging.getLogger(__name__)

READ_GRACE = 5.0
"""Seconds a long poll may take beyond `poll_timeout` before the client gives up on it."""
WATCHDOG_GRACE = 15.0
"""Seconds beyond that before the watchdog cancels a poll the client failed to end."""
MAX_PAUSE = 60.0
"""Longest pause after Telegram rate-limited `getUpdates`."""

Receive = Callable[[Update, InboundSink], Awaitable[None]]


class Poller:
    """Long-polls one bot's updates and hands each to `receive`, in order.

    An update is confirmed to Telegram (by the `offset` of the next `getUpdates`) only after
    `receive` returned for it; if `receive` raises, the poll loop ends with that error and the
    update is fetched again by the next poller. A poll that does not complete within
    `poll_timeout + READ_GRACE` ends the loop with NotReady (the adapter is then reconnected).
    """

    def __init__(
        self,
        bot: Bot,
        config: TelegramConfig,
        receive: Receive,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bot = bot
        self.config = config
        self.receive = receive
        self.clock = clock
        self.offset: int | None = None
        self._poll_started: float | None = None
        self._last_poll: float | None = None

    async def start(self, *, drop_pending: bool) -> None:
        """Remove any webhook (polling and webhooks exclude each other); drop waiting updates
        when `drop_pending`. Raises AuthError or NotReady."""
        drop = drop_pending
        try:
            await self.bot.delete_webhook(drop_pending_updates=drop)
        except TelegramError as err:
            raise error_from(err, "deleteWebhook") from err
        if drop:
            logger.info("telegram: messages sent while Herald was down are skipped")
        self._last_poll = self.clock()

    @property
    def _window(self) -> float:
        return self.config.poll_timeout + READ_GRACE

    def liveness(self) -> AdapterState:
        """RECEIVING while polls complete in time; RECONNECTING once one is overdue."""
        now = self.clock()
        if self._poll_started is not None:
            late = now - self._poll_started > self._window
        else:
            late = self._last_poll is None or now - self._last_poll > self._window + WATCHDOG_GRACE
        return AdapterState.RECONNECTING if late else AdapterState.RECEIVING

    async def run(self, sink: InboundSink) -> None:
        """Poll until cancelled. Raises NotReady, AuthError, or what `receive` raised."""
        while True:
            updates = await self._poll()
            for update in updates:
                await self.receive(update, sink)
                self.offset = max(self.offset or 0, update.update_id + 1)

    async def _poll(self) -> list[Update]:
        timeout = round(self.config.poll_timeout)
        self._poll_started = self.clock()
        try:
            async with asyncio.timeout(self._window + WATCHDOG_GRACE):
                raw = await self.bot.do_api_request(
                    # Bot API method names are case-insensitive; this spelling fetches the raw
                    # JSON (one malformed update must not block the ones after it), and is not
                    # one python-telegram-bot asks to replace with its `get_updates`. The
                    # adapter's `SplitPools` still sends it through the poll's own connection.
                    "getupdates",
                    api_kwargs={
                        "offset": self.offset,
                        "timeout": timeout,
                        "allowed_updates": json.dumps(ALLOWED_UPDATES),
                    },
                    read_timeout=READ_GRACE + self.config.poll_timeout,
                )
        except TimeoutError as err:
            raise NotReady("telegram: a getUpdates poll hung; restarting the connection") from err
        except RetryAfter as err:
            delay = error_from(err, "getUpdates")
            pause = min(getattr(delay, "retry_after", 1.0), MAX_PAUSE)
            logger.warning("telegram: polling rate limited; pausing %.1fs", pause)
            self._poll_started = None
            await asyncio.sleep(pause)
            return []
        except TelegramError as err:
            raise error_from(err, "getUpdates") from err
        finally:
            self._poll_started = None
        self._last_poll = self.clock()
        if not isinstance(raw, list):
            raise NotReady("telegram: getUpdates answered something other than a list")
        return self._parse(raw)

    def _parse(self, raw: list[Any]) -> list[Update]:
        """The well-formed updates; malformed ones are logged and passed over."""
        updates: list[Update] = []
        for item in raw:
            update = parse_update(item, self.bot)
            if isinstance(update, Skipped):
                number = item.get("update_id") if isinstance(item, dict) else None
                logger.warning("telegram: update %s passed over: %s", number, update.reason)
                if isinstance(number, int) and not isinstance(number, bool):
                    self.offset = max(self.offset or 0, number + 1)
                continue
            updates.append(update)
        return updates
