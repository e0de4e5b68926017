"""Calls to a platform that are under way, so a connection is closed only after they end.

An adapter that is being replaced (its receive loop failed) must not close its HTTP client
under a send the platform may already have carried out: the send would fail, be retried,
and the person would get the message twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator

from gateway.contracts.ids import Platform
from gateway.contracts.messages import DeliveryReceipt, OutboundMessage

logger = logging.getLogger(__name__)

SEND_DRAIN_SECONDS = 20.0
"""How long a closing adapter waits for the sends under way (about one request's timeout)."""


class InFlight:
    """A count of calls under way, and a wait for none to be left."""

    def __init__(self) -> None:
        self._count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @contextlib.asynccontextmanager
    async def track(self) -> AsyncIterator[None]:
        """Count the enclosed call as under way until it ends, however it ends."""
        self._count += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._count -= 1
            if not self._count:
                self._idle.set()

    async def drained(self, limit: float) -> bool:
        """Wait up to `limit` seconds for every call under way to end; whether they did."""
        try:
            async with asyncio.timeout(limit):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True


class TrackedSends(ABC):
    """An adapter whose closing waits for its sends: `send` runs `_send` counted as under
    way in `_inflight`, and `_drain_sends` (called on close) waits for those."""

    platform: Platform
    _inflight: InFlight

    async def send(self, message: OutboundMessage) -> DeliveryReceipt:
        """Deliver one chunk (see `_send`); closing the adapter waits for it to end."""
        async with self._inflight.track():
            return await self._send(message)

    @abstractmethod
    async def _send(self, message: OutboundMessage) -> DeliveryReceipt:
        """Deliver one chunk. Raises RateLimited, PermanentSendError or NotReady."""

    async def _drain_sends(self) -> None:
        """Wait up to `SEND_DRAIN_SECONDS` for the sends under way; warn when some are left."""
        if not await self._inflight.drained(SEND_DRAIN_SECONDS):
            logger.warning("%s: closing with sends still under way", self.platform)
