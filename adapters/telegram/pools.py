"""Two connection pools behind one `Bot`: the long poll never waits behind sends.

python-telegram-bot gives its `get_updates_request` only to a call named exactly
`getUpdates`; the poller asks for raw JSON by another spelling (see `polling.py`), which would
otherwise share the send pool. With many chats answering at once the poll then waited for a
free connection up to the pool timeout and the connection was restarted (seen in the
Telegram benchmark at 25 messages/s: a reply more than two minutes late).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from telegram.request import BaseRequest, HTTPXRequest, RequestData

if TYPE_CHECKING:
    # The library's own alias for "a value, None, or DEFAULT_NONE" (types only).
    from telegram._utils.types import ODVInput

POLL_METHOD = "getupdates"
"""The Bot API method routed to the poll pool, compared case-insensitively."""


class SplitPools(BaseRequest):
    """Sends `getUpdates` (any spelling) through `poll`, everything else through `calls`.

    Initialized and shut down with both pools. `read_timeout` is that of `calls`.
    """

    def __init__(self, calls: HTTPXRequest, poll: HTTPXRequest) -> None:
        self.calls = calls
        self.poll = poll

    @property
    def read_timeout(self) -> float | None:
        return self.calls.read_timeout

    async def initialize(self) -> None:
        await self.calls.initialize()
        await self.poll.initialize()

    async def shutdown(self) -> None:
        try:
            await self.calls.shutdown()
        finally:
            await self.poll.shutdown()

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
        pool = self.poll if is_poll(url) else self.calls
        return await pool.do_request(
            url,
            method,
            request_data,
            read_timeout=read_timeout,
            write_timeout=write_timeout,
            connect_timeout=connect_timeout,
            pool_timeout=pool_timeout,
        )


def is_poll(url: str) -> bool:
    """Whether a Bot API URL calls `getUpdates`."""
    path = url.split("?", 1)[0].rstrip("/")
    return path.rsplit("/", 1)[-1].lower() == POLL_METHOD
