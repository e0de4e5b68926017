"""The fake Discord REST API driven by discord.py alone (no Herald code): its faults are the
ones discord.py's own retry and rate-limit machinery meets against Discord, so the adapter
tests that use them exercise the library as it runs in production."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import discord
import pytest
from discord.http import HTTPClient, Route, handle_message_parameters

from tests.fakes.discord_server import DEFAULT_TOKEN, FakeDiscordServer

pytestmark = pytest.mark.timeout(60)

CHANNEL = "3000000000000000009"
BOUND = 20.0
"""Upper bound of each request including discord.py's own retries (they sleep 1 s first)."""


class Rebased(HTTPClient):
    """discord.py's REST client with Discord's base URL swapped for the fake's."""

    def __init__(self, base: str) -> None:
        super().__init__(asyncio.get_running_loop())
        self.base = base.rstrip("/")

    async def request(self, route: Route, **kwargs: Any) -> Any:
        route.url = self.base + route.url[len(Route.BASE) :]
        return await super().request(route, **kwargs)


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscordServer]:
    async with FakeDiscordServer() as server:
        server.add_channel(CHANNEL)
        yield server


@pytest.fixture
async def http(fake: FakeDiscordServer) -> AsyncIterator[Rebased]:
    client = Rebased(fake.api_base)
    await client.static_login(DEFAULT_TOKEN)
    try:
        yield client
    finally:
        await client.close()


async def post(http: Rebased, text: str) -> Any:
    params = handle_message_parameters(content=text)
    async with asyncio.timeout(BOUND):
        return await http.send_message(CHANNEL, params=params)


async def test_a_success_carries_rate_limit_headers(fake: FakeDiscordServer) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{fake.api_base}/channels/{CHANNEL}/messages",
            json={"content": "hi"},
            headers={"Authorization": f"Bot {DEFAULT_TOKEN}"},
        ) as answer,
    ):
        assert answer.status == 200
        for header in ("Limit", "Remaining", "Reset", "Reset-After", "Bucket"):
            assert f"X-RateLimit-{header}" in answer.headers


async def test_discord_py_retries_a_500_by_itself(fake: FakeDiscordServer, http: Rebased) -> None:
    fake.fail_rest(500, times=1, kind="post")
    await post(http, "after one 500")
    assert fake.texts_in(CHANNEL) == ["after one 500"]
    assert fake.rest_calls.count(f"POST /api/v10/channels/{CHANNEL}/messages") == 2


async def test_a_503_is_a_server_error_at_once(fake: FakeDiscordServer, http: Rebased) -> None:
    fake.fail_rest(503, times=1, kind="post")
    with pytest.raises(discord.DiscordServerError):
        await post(http, "refused")
    assert fake.texts_in(CHANNEL) == []
    await post(http, "then it goes")
    assert fake.texts_in(CHANNEL) == ["then it goes"]


async def test_a_dropped_rest_connection_reaches_discord_py(
    fake: FakeDiscordServer, http: Rebased
) -> None:
    fake.drop_rest(times=1, kind="post")
    with pytest.raises((aiohttp.ClientError, OSError)):
        await post(http, "dropped")
    assert fake.texts_in(CHANNEL) == []


@pytest.mark.parametrize("kind", ["post", "edit", "typing"])
async def test_a_429_on_any_request_is_waited_out_by_discord_py(
    fake: FakeDiscordServer, http: Rebased, kind: str
) -> None:
    message = await post(http, "first")
    fake.rate_limit(CHANNEL, retry_after=0.5, kinds=[kind])
    async with asyncio.timeout(BOUND):
        if kind == "post":
            await http.send_message(CHANNEL, params=handle_message_parameters(content="second"))
        elif kind == "edit":
            params = handle_message_parameters(content="first, edited")
            await http.edit_message(CHANNEL, message["id"], params=params)
        else:
            await http.send_typing(CHANNEL)
    [(channel, _)] = fake.rate_limited
    assert channel == CHANNEL


async def test_a_global_429_holds_every_request(fake: FakeDiscordServer, http: Rebased) -> None:
    fake.rate_limit_globally(retry_after=0.5)
    started = time.monotonic()
    await post(http, "after the global limit")
    # discord.py slept retry_after before its second try (a lower bound, never flaky).
    assert time.monotonic() - started >= 0.5
    assert fake.texts_in(CHANNEL) == ["after the global limit"]


async def test_an_edit_longer_than_2000_characters_is_refused(
    fake: FakeDiscordServer, http: Rebased
) -> None:
    message = await post(http, "short")
    params = handle_message_parameters(content="x" * 2001)
    with pytest.raises(discord.HTTPException) as caught:
        await http.edit_message(CHANNEL, message["id"], params=params)
    assert caught.value.status == 400
    assert caught.value.code == 50035
    assert fake.texts_in(CHANNEL) == ["short"]
