"""The Bot's connection pools: the long poll never waits behind sends, and a send pool that
lost its connections is replaced.

python-telegram-bot gives its `get_updates_request` only to a call named exactly
`getUpdates`; the poller asks for raw JSON by another spelling (see `polling.py`), which would
otherwise share the send pool. With many chats answering at once the poll then waited for a
free connection up to the pool timeout and the connection was restarted (seen in the
Telegram benchmark at 25 messages/s: a reply more than two minutes late).

httpcore 1.0.9 (under httpx, under python-telegram-bot) keeps a pool slot forever when a
request is cancelled just after the pool gave it a new connection (encode/httpcore#1093).
Herald cancels requests in normal operation (a typing indicator when its turn ends), so a
busy bot loses slots until every send times out waiting for one. A pool timeout therefore
replaces the send pool; the request, which was not sent, goes once more on the new pool.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import httpx
from telegram.error import TimedOut
from telegram.request import BaseRequest, HTTPXRequest, RequestData

if TYPE_CHECKING:
    # The library's own alias for "a value, None, or DEFAULT_NONE" (types only).
    from telegram._utils.types import ODVInput

logger = logging.getLogger(__name__)

POLL_METHOD = "getupdates"
"""The Bot API method routed to the poll pool, compared case-insensitively."""


class SplitPools(BaseRequest):
    """Sends `getUpdates` (any spelling) through `poll`, everything else through a send pool
    made by `new_calls`; replaces the send pool when a request times out waiting for a
    connection of it.

    Initialized and shut down with every pool it made. `read_timeout` is the send pool's.
    """

    def __init__(self, new_calls: Callable[[], HTTPXRequest], poll: HTTPXRequest) -> None:
        self._new_calls = new_calls
        self.calls = new_calls()
        self.poll = poll
        self.replaced = 0
        """How many times the send pool was replaced."""
        self._busy: dict[HTTPXRequest, int] = {}
        self._retired: set[HTTPXRequest] = set()
        self._replacing = asyncio.Lock()

    @property
    def read_timeout(self) -> float | None:
        return self.calls.read_timeout

    async def initialize(self) -> None:
        await self.calls.initialize()
        await self.poll.initialize()

    async def shutdown(self) -> None:
        pools = [self.calls, *self._retired, self.poll]
        self._retired.clear()
        for pool in pools:
            await pool.shutdown()

    async def do_request(  # noqa: PLR0917  (BaseRequest's signature)
        self,
        url: str,
        method: str,
        request_data: RequestData | None = None,
        read_timeout: ODVInput[float] = BaseRequest.DEFAULT_NONE,
        write_timeout: ODVInput[float] = BaseRequest.DEFAULT_NONE,
        connect_timeout: ODVInput[float] = BaseRequest.DEFAULT_NONE,
        pool_timeout: ODVInput[float] = BaseRequest.DEFAULT_NONE,
    ) -> tuple[int, bytes]:
        async def on(pool: HTTPXRequest) -> tuple[int, bytes]:
            return await pool.do_request(
                url,
                method,
                request_data,
                read_timeout=read_timeout,
                write_timeout=write_timeout,
                connect_timeout=connect_timeout,
                pool_timeout=pool_timeout,
            )

        if is_poll(url):
            return await on(self.poll)
        for last in (False, True):
            pool = self.calls
            self._busy[pool] = self._busy.get(pool, 0) + 1
            try:
                return await on(pool)
            except TimedOut as err:
                if last or not isinstance(err.__cause__, httpx.PoolTimeout):
                    raise
            finally:
                await self._release(pool)
            await self._replace(pool)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _replace(self, pool: HTTPXRequest) -> None:
        """A new send pool instead of `pool`, unless another request replaced it already."""
        async with self._replacing:
            if pool is not self.calls:
                return
            fresh = self._new_calls()
            await fresh.initialize()
            self.calls = fresh
            self.replaced += 1
        logger.warning(
            "telegram: no connection of the send pool came free in time; replaced the pool "
            "(connections lost to cancelled requests, or Telegram answering very slowly)"
        )
        if self._busy.get(pool, 0):
            self._retired.add(pool)  # closed when its last request ends
        else:
            self._busy.pop(pool, None)
            await pool.shutdown()

    async def _release(self, pool: HTTPXRequest) -> None:
        left = self._busy[pool] = self._busy[pool] - 1
        if left == 0 and pool is not self.calls:
            del self._busy[pool]
            if pool in self._retired:
                self._retired.discard(pool)
                await pool.shutdown()


def is_poll(url: str) -> bool:
    """Whether a Bot API URL calls `getUpdates`."""
    path = url.split("?", 1)[0].rstrip("/")
    return path.rsplit("/", 1)[-1].lower() == POLL_METHOD
