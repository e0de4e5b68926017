"""The fake Twilio itself, through the twilio SDK (with Herald's HTTP client for the base URL):
messages created and fetched, the account, media behind basic auth, faults, signing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from twilio.base.exceptions import TwilioRestException
from twilio.request_validator import RequestValidator
from twilio.rest import Client

from adapters.twilio.http import TwilioHttp
from gateway.contracts.errors import NotReady, RateLimited
from tests.fakes.sink import refusing_socket
from tests.fakes.twilio_server import (
    DEFAULT_ACCOUNT_SID,
    DEFAULT_AUTH_TOKEN,
    HERALD_NUMBER,
    FakeTwilioServer,
)

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def twilio() -> AsyncIterator[FakeTwilioServer]:
    async with FakeTwilioServer() as server:
        yield server


@pytest.fixture
async def client(twilio: FakeTwilioServer) -> AsyncIterator[Client]:
    http = TwilioHttp(twilio.base_url, 5.0)
    try:
        yield Client(DEFAULT_ACCOUNT_SID, DEFAULT_AUTH_TOKEN, http_client=http)
    finally:
        await http.close()


async def test_create_then_fetch(twilio: FakeTwilioServer, client: Client) -> None:
    created: Any = await client.messages.create_async(
        to="+15551234567", from_=HERALD_NUMBER, body="hello"
    )
    assert created.sid.startswith("SM")
    assert created.status == "queued"
    fetched: Any = await client.messages(created.sid).fetch_async()
    assert (fetched.to, fetched.body) == ("+15551234567", "hello")
    [sent] = twilio.sent
    assert (sent.sid, sent.auth, sent.status_callback) == (created.sid, DEFAULT_ACCOUNT_SID, None)
    account: Any = await client.api.v2010.accounts(DEFAULT_ACCOUNT_SID).fetch_async()
    assert account.status == "active"


async def test_errors_as_twilio_answers_them(twilio: FakeTwilioServer, client: Client) -> None:
    twilio.reject("+15550000000", 21211)
    with pytest.raises(TwilioRestException) as refused:
        await client.messages.create_async(to="+15550000000", from_=HERALD_NUMBER, body="x")
    assert (refused.value.status, refused.value.code) == (400, 21211)
    with pytest.raises(TwilioRestException) as too_long:
        await client.messages.create_async(to="+15551", from_=HERALD_NUMBER, body="x" * 1601)
    assert too_long.value.code == 21617
    twilio.rate_limit(1, retry_after=2)
    with pytest.raises(RateLimited):  # Herald's HTTP client turns 429 into RateLimited
        await client.messages.create_async(to="+15551", from_=HERALD_NUMBER, body="x")
    twilio.fail(1, 500)
    with pytest.raises(TwilioRestException) as failed:
        await client.messages.create_async(to="+15551", from_=HERALD_NUMBER, body="x")
    assert failed.value.status == 500
    assert [(r.status, r.code) for r in twilio.refused] == [
        (400, 21211),
        (400, 21617),
        (429, 20429),
        (500, 500),
    ]
    with pytest.raises(TwilioRestException) as missing:
        await client.messages("SM404").fetch_async()
    assert missing.value.status == 404
    wrong = Client(DEFAULT_ACCOUNT_SID, "f" * 32, http_client=client.http_client)
    with pytest.raises(TwilioRestException) as denied:
        await wrong.api.v2010.accounts(DEFAULT_ACCOUNT_SID).fetch_async()
    assert (denied.value.status, denied.value.code) == (401, 20003)


async def test_media_need_the_account_credentials(twilio: FakeTwilioServer) -> None:
    url = twilio.add_media(b"GIF89a", "image/gif")
    async with httpx.AsyncClient(trust_env=False) as http:
        assert (await http.get(url)).status_code == 401
        answer = await http.get(url, auth=(DEFAULT_ACCOUNT_SID, DEFAULT_AUTH_TOKEN))
    assert answer.status_code == 200
    assert (answer.content, answer.headers["content-type"]) == (b"GIF89a", "image/gif")


async def test_webhooks_are_signed_as_twilio_signs_them(twilio: FakeTwilioServer) -> None:
    form = twilio.message_form("+15551234567", "hi")
    url = "https://herald.example.com/webhooks/twilio/sms"
    headers, body = twilio.signed_request(url, form)
    validator = RequestValidator(DEFAULT_AUTH_TOKEN)
    assert validator.validate(url, dict(form), headers["X-Twilio-Signature"])
    assert body.decode().count("&") == len(form) - 1
    wrong, _ = twilio.signed_request(url, form, signing="wrong")
    assert not validator.validate(url, dict(form), wrong["X-Twilio-Signature"])
    unsigned, _ = twilio.signed_request(url, form, signing="none")
    assert "X-Twilio-Signature" not in unsigned


async def test_an_unreachable_server_is_not_ready() -> None:
    with refusing_socket() as url:
        http = TwilioHttp(url, 5.0)
        try:
            client = Client(DEFAULT_ACCOUNT_SID, DEFAULT_AUTH_TOKEN, http_client=http)
            with pytest.raises(NotReady):
                await client.api.v2010.accounts(DEFAULT_ACCOUNT_SID).fetch_async()
        finally:
            await http.close()
