"""The Telegram adapter's connection pools (`adapters/telegram/pools.py`), with
python-telegram-bot's own `HTTPXRequest` against the fake Bot API."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from telegram.error import BadRequest
from telegram.request import HTTPXRequest

import adapters.telegram  # noqa: F401  (sets PTB_TIMEDELTA before python-telegram-bot is used)
from adapters.telegram.pools import SplitPools, is_poll
from tests.fakes.telegram import FakeTelegramServer

pytestmark = pytest.mark.timeout(60)

TOKEN = "123:pools"


def small_pool() -> HTTPXRequest:
    """One connection, and a short wait for it."""
    return HTTPXRequest(connection_pool_size=1, pool_timeout=0.3)


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer(TOKEN) as server:
        yield server


@pytest.fixture
async def pools() -> AsyncIterator[SplitPools]:
    split = SplitPools(small_pool, HTTPXRequest(connection_pool_size=1))
    await split.initialize()
    try:
        yield split
    finally:
        await split.shutdown()


def method_url(tg: FakeTelegramServer, method: str) -> str:
    return f"{tg.base_url}{TOKEN}/{method}"


def test_is_poll_reads_the_method_in_any_spelling() -> None:
    assert is_poll("https://api.telegram.org/bot1:x/getUpdates")
    assert is_poll("https://api.telegram.org/bot1:x/getupdates?offset=3")
    assert not is_poll("https://api.telegram.org/bot1:x/sendMessage")
    assert not is_poll("https://api.telegram.org/bot1:x/getUpdatesSoon")


async def test_a_request_cancelled_at_any_point_never_leaves_the_pool_unusable(
    tg: FakeTelegramServer,
) -> None:
    """httpcore 1.0.9 keeps a slot forever when a request is cancelled just after it got a
    new connection (encode/httpcore#1093). Whichever step a cancellation lands on, the next
    request still goes through."""
    url = method_url(tg, "getMe")
    for steps in range(40):
        split = SplitPools(small_pool, HTTPXRequest(connection_pool_size=1))
        await split.initialize()
        try:
            cancelled = asyncio.create_task(split.post(url))
            for _ in range(steps):
                await asyncio.sleep(0)
            cancelled.cancel()
            await asyncio.gather(cancelled, return_exceptions=True)
            me: Any = await split.post(url)
            assert me["username"] == "herald_bot", steps
        finally:
            await split.shutdown()


async def test_a_send_pool_with_no_free_connection_is_replaced(
    tg: FakeTelegramServer, pools: SplitPools
) -> None:
    """Every connection busy past the pool timeout: the waiting request, never sent, goes on
    a new pool; the request that held the old one still gets its answer."""
    tg.hold("sendMessage")
    held = asyncio.create_task(
        pools.post(method_url(tg, "sendMessage"), request_data=None, read_timeout=30)
    )
    await tg.wait_for(lambda: tg.calls_held == 1)
    me: Any = await pools.post(method_url(tg, "getMe"))
    assert me["username"] == "herald_bot"
    assert pools.replaced == 1
    tg.hold("sendMessage", False)
    with pytest.raises(BadRequest, match="Chat_id is empty"):  # refused, but answered
        await held
    again: Any = await pools.post(method_url(tg, "getMe"))
    assert again["username"] == "herald_bot"
    assert pools.replaced == 1


async def test_the_poll_has_its_own_connection(tg: FakeTelegramServer, pools: SplitPools) -> None:
    """With the send pool full, a poll still goes out at once (no pool timeout, no
    replacement)."""
    tg.hold("sendMessage")
    held = asyncio.create_task(pools.post(method_url(tg, "sendMessage"), read_timeout=30))
    await tg.wait_for(lambda: tg.calls_held == 1)
    updates: Any = await pools.post(method_url(tg, "getupdates"))
    assert updates == []
    assert pools.replaced == 0
    tg.hold("sendMessage", False)
    await asyncio.gather(held, return_exceptions=True)
