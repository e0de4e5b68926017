"""The fake Slack, driven by slack-sdk's own clients (and a little slack-bolt), in-process and as
a subprocess: the fake must behave like Slack as far as slack-sdk and slack-bolt can tell."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.adapter.starlette.async_handler import AsyncSlackRequestHandler
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.context.say.async_say import AsyncSay
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes.serving import LocalServer
from tests.fakes.slack import (
    DEFAULT_USER,
    MAX_TEXT_LENGTH,
    FakeSlackServer,
    SlackServerClient,
    slack_signature,
)

JSON = dict[str, Any]
WAIT = 10.0
"""Upper bound of every wait for a condition."""
PING = 0.2
"""Socket Mode ping interval of the clients here: small, so stale sockets are noticed fast."""
ACK_TIMEOUT = 0.3
"""The fake's ack timeout in the redelivery tests."""
REPO = Path(__file__).resolve().parents[2]
DM = "D0ANN"
CHANNEL = "C0GENERAL"


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlackServer]:
    async with FakeSlackServer(ack_timeout=WAIT, events_retry_delay=0.01) as server:
        yield server


def web_client(server: FakeSlackServer | SlackServerClient, token: str) -> AsyncWebClient:
    return AsyncWebClient(token, base_url=server.base_url)


@pytest.fixture
def web(slack: FakeSlackServer) -> AsyncWebClient:
    return web_client(slack, slack.bot_token)


class Recorder:
    """A slack-sdk Socket Mode client's view: every message it received, in order."""

    def __init__(self, client: SocketModeClient) -> None:
        self.client = client
        self.messages: list[JSON] = []
        """Every message received (hello, events_api envelopes, disconnect), parsed."""
        self.requests: list[SocketModeRequest] = []
        self.ack: Callable[[SocketModeRequest], bool] = lambda request: True
        """Whether to acknowledge a request (default: all)."""
        self._change = asyncio.Event()
        client.message_listeners.append(self._on_message)
        client.socket_mode_request_listeners.append(self._on_request)

    @property
    def envelopes(self) -> list[JSON]:
        return [m for m in self.messages if m.get("type") == "events_api"]

    async def wait_for(self, condition: Callable[[], bool], timeout: float = WAIT) -> None:
        async with asyncio.timeout(timeout):
            while not condition():
                await self._change.wait()

    def _notify(self) -> None:
        self._change.set()
        self._change = asyncio.Event()

    async def _on_message(
        self, client: AsyncBaseSocketModeClient, message: JSON, raw: str | None
    ) -> None:
        self.messages.append(message)
        self._notify()

    async def _on_request(
        self, client: AsyncBaseSocketModeClient, request: SocketModeRequest
    ) -> None:
        self.requests.append(request)
        if self.ack(request):
            await client.send_socket_mode_response(SocketModeResponse(request.envelope_id))
        self._notify()


@contextlib.asynccontextmanager
async def socket_mode(
    server: FakeSlackServer | SlackServerClient,
    app_token: str,
    bot_token: str,
) -> AsyncIterator[Recorder]:
    """A connected slack-sdk aiohttp Socket Mode client, closed on exit."""
    client = SocketModeClient(
        app_token, web_client=web_client(server, bot_token), ping_interval=PING
    )
    try:
        recorder = Recorder(client)
        await client.connect()  # type: ignore[no-untyped-call]  # unannotated in slack-sdk
        yield recorder
    finally:
        await client.close()  # type: ignore[no-untyped-call]


@pytest.fixture
async def sm(slack: FakeSlackServer) -> AsyncIterator[Recorder]:
    async with socket_mode(slack, slack.app_token, slack.bot_token) as recorder:
        await slack.wait_connected(WAIT)
        yield recorder


def retried(request: SocketModeRequest) -> bool:
    """Acknowledge only redeliveries (so every first delivery times out)."""
    return (request.retry_attempt or 0) > 0


def api_error(err: pytest.ExceptionInfo[SlackApiError]) -> str:
    error: str = err.value.response["error"]
    return error


# -- tokens and the wire --------------------------------------------------------------------------


async def test_auth_test_describes_the_bot(slack: FakeSlackServer, web: AsyncWebClient) -> None:
    answer = await web.auth_test()
    assert answer.data == {
        "ok": True,
        "url": "https://herald-test.slack.com/",
        "team": "herald-test",
        "user": "herald",
        "team_id": slack.team_id,
        "user_id": "UBOT",
        "bot_id": "BBOT",
        "is_enterprise_install": False,
    }
    assert slack.calls[-1].token == slack.bot_token


async def test_tokens_are_checked(slack: FakeSlackServer) -> None:
    with pytest.raises(SlackApiError) as err:
        await web_client(slack, "xoxb-wrong").auth_test()
    assert (err.value.response.status_code, api_error(err)) == (200, "invalid_auth")
    with pytest.raises(SlackApiError) as err:
        await AsyncWebClient(base_url=slack.base_url).auth_test()
    assert api_error(err) == "not_authed"
    # The app-level token opens connections and nothing else; the bot token cannot open them.
    with pytest.raises(SlackApiError) as err:
        await web_client(slack, slack.app_token).auth_test()
    assert api_error(err) == "not_allowed_token_type"
    bot = web_client(slack, slack.bot_token)
    with pytest.raises(SlackApiError) as err:
        await bot.apps_connections_open(app_token=slack.bot_token)
    assert api_error(err) == "not_allowed_token_type"
    opened = await bot.apps_connections_open(app_token=slack.app_token)
    assert str(opened["url"]).startswith(f"ws://127.0.0.1:{slack.ws_port}/link/?ticket=")
    assert slack.calls[-1].token == slack.app_token  # sent in the header, not as a parameter
    assert "token" not in slack.calls[-1].params
    with pytest.raises(SlackApiError) as err:
        await bot.api_call("no.such.method")
    assert (err.value.response.status_code, api_error(err)) == (404, "unknown_method")
    assert [r.error for r in slack.rejected] == [
        "invalid_auth",
        "not_authed",
        "not_allowed_token_type",
        "not_allowed_token_type",
        "unknown_method",
    ]


async def test_parameters_are_decoded_as_slack_sdk_sends_them(
    slack: FakeSlackServer, web: AsyncWebClient
) -> None:
    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "*hi*"}}]
    answer = await web.chat_postMessage(
        channel=CHANNEL, text="hi", blocks=blocks, mrkdwn=False, reply_broadcast=True
    )
    post = slack.posted[-1]
    assert (post.text, post.blocks, post.mrkdwn, post.reply_broadcast) == (
        "hi",
        blocks,
        False,
        True,
    )
    await web.reactions_add(channel=CHANNEL, timestamp=answer["ts"], name="eyes")
    # chat.postMessage goes as a JSON body; reactions.add as form-style parameters.
    assert slack.calls[-2].params["blocks"] == blocks
    assert slack.calls[-1].params == {"channel": CHANNEL, "timestamp": answer["ts"], "name": "eyes"}
    async with httpx.AsyncClient(base_url=slack.url) as client:
        response = await client.post(
            "/api/chat.postMessage",
            data={"token": slack.bot_token, "channel": CHANNEL, "text": "form"},
        )
        assert response.json()["message"]["text"] == "form"  # the token as a form parameter
        response = await client.post(
            "/api/chat.postMessage",
            content=b"{not json",
            headers={
                "Authorization": f"Bearer {slack.bot_token}",
                "Content-Type": "application/json",
            },
        )
        assert response.json() == {"ok": False, "error": "invalid_json"}


# -- messages -------------------------------------------------------------------------------------


async def test_post_update_delete(slack: FakeSlackServer, web: AsyncWebClient) -> None:
    asked = slack.inject_message(CHANNEL, "question")
    first = await web.chat_postMessage(channel=CHANNEL, text="thinking", thread_ts=asked.ts)
    second = await web.chat_postMessage(channel=CHANNEL, text="second")
    assert first["channel"] == CHANNEL
    assert float(first["ts"]) < float(second["ts"])  # fresh, increasing
    message = first["message"]
    assert (message["user"], message["bot_id"], message["thread_ts"]) == (
        "UBOT",
        "BBOT",
        asked.ts,
    )
    updated = await web.chat_update(channel=CHANNEL, ts=first["ts"], text="the answer")
    assert (updated["channel"], updated["ts"], updated["text"]) == (
        CHANNEL,
        first["ts"],
        "the answer",
    )
    assert [(p.channel, p.text, p.thread_ts) for p in slack.posted] == [
        (CHANNEL, "thinking", asked.ts),
        (CHANNEL, "second", None),
    ]
    assert [(u.ts, u.text) for u in slack.updates] == [(first["ts"], "the answer")]
    assert slack.texts_in(CHANNEL) == ["the answer", "second"]
    assert slack.texts_in(CHANNEL, thread_ts=asked.ts) == ["the answer"]
    assert slack.message(CHANNEL, first["ts"])["edited"]["user"] == "UBOT"
    deleted = await web.chat_delete(channel=CHANNEL, ts=second["ts"])
    assert deleted["ts"] == second["ts"]
    assert slack.texts_in(CHANNEL) == ["the answer"]
    assert [(d.channel, d.ts) for d in slack.deleted] == [(CHANNEL, second["ts"])]


async def test_the_bots_posts_come_back_as_events_when_echoed() -> None:
    async with FakeSlackServer(echo_bot_messages=True) as slack:
        posted = await web_client(slack, slack.bot_token).chat_postMessage(
            channel=CHANNEL, text="hello all"
        )
        [event_id] = slack.pending
        event = slack.event(event_id)["event"]
        assert (event["user"], event["bot_id"], event["ts"], event["channel_type"]) == (
            "UBOT",
            "BBOT",
            posted["ts"],
            "channel",
        )


@pytest.mark.parametrize(
    ("call", "error"),
    [
        ({"method": "chat_postMessage", "channel": CHANNEL, "text": ""}, "no_text"),
        ({"method": "chat_postMessage", "channel": CHANNEL, "text": "  \n"}, "no_text"),
        (
            {"method": "chat_postMessage", "channel": CHANNEL, "text": "x" * (MAX_TEXT_LENGTH + 1)},
            "msg_too_long",
        ),
        ({"method": "chat_postMessage", "channel": "nope", "text": "a"}, "channel_not_found"),
        ({"method": "chat_postMessage", "channel": "C0GONE", "text": "a"}, "channel_not_found"),
        ({"method": "chat_postMessage", "channel": "C0OUTSIDE", "text": "a"}, "not_in_channel"),
        ({"method": "chat_update", "channel": CHANNEL, "ts": "1.000001", "text": "a"}, None),
        ({"method": "chat_update", "channel": CHANNEL, "ts": "USER", "text": "a"}, None),
        ({"method": "chat_update", "channel": CHANNEL, "ts": "BOT", "text": ""}, "no_text"),
        ({"method": "chat_delete", "channel": CHANNEL, "ts": "USER"}, "cant_delete_message"),
        ({"method": "conversations_info", "channel": "C0GONE"}, "channel_not_found"),
        ({"method": "users_info", "user": "nobody"}, "user_not_found"),
    ],
)
async def test_refused_calls(
    slack: FakeSlackServer, web: AsyncWebClient, call: JSON, error: str | None
) -> None:
    slack.remove_channel("C0GONE")
    slack.add_channel("C0OUTSIDE", name="outside", is_member=False)
    user_ts = slack.inject_message(CHANNEL, "a user's message").ts
    bot_ts = (await web.chat_postMessage(channel=CHANNEL, text="mine"))["ts"]
    params = dict(call)
    method = params.pop("method")
    if "ts" in params:
        params["ts"] = {"USER": user_ts, "BOT": bot_ts}.get(params["ts"], params["ts"])
    if error is None:  # chat.update: unknown message / somebody else's
        error = "message_not_found" if params["ts"] != user_ts else "cant_update_message"
    # slack-sdk warns before it sends a message without text (an error under filterwarnings).
    warns = (
        pytest.warns(UserWarning, match="top-level `text` argument is missing")
        if error == "no_text"
        else contextlib.nullcontext()
    )
    with warns, pytest.raises(SlackApiError) as err:
        await getattr(web, method)(**params)
    assert (err.value.response.status_code, api_error(err)) == (200, error)
    assert slack.rejected[-1].error == error
    assert len(slack.posted) == 1
    assert len(slack.texts_in(CHANNEL)) == 1


async def test_reactions(slack: FakeSlackServer, web: AsyncWebClient) -> None:
    ts = slack.inject_message(DM, "hi").ts
    await web.reactions_add(channel=DM, timestamp=ts, name="eyes")
    await web.reactions_add(channel=DM, timestamp=ts, name=":white_check_mark:")
    with pytest.raises(SlackApiError) as err:
        await web.reactions_add(channel=DM, timestamp=ts, name="eyes")
    assert api_error(err) == "already_reacted"
    assert slack.reactions_on(DM, ts) == ["eyes", "white_check_mark"]
    await web.reactions_remove(channel=DM, timestamp=ts, name="eyes")
    with pytest.raises(SlackApiError) as err:
        await web.reactions_remove(channel=DM, timestamp=ts, name="eyes")
    assert api_error(err) == "no_reaction"
    with pytest.raises(SlackApiError) as err:
        await web.reactions_add(channel=DM, timestamp="1.000001", name="eyes")
    assert api_error(err) == "message_not_found"
    with pytest.raises(SlackApiError) as err:
        await web.reactions_add(channel=DM, timestamp=ts, name="Not A Name")
    assert api_error(err) == "invalid_name"
    assert [(r.action, r.name, r.channel, r.timestamp) for r in slack.reactions] == [
        ("add", "eyes", DM, ts),
        ("add", "white_check_mark", DM, ts),
        ("remove", "eyes", DM, ts),
    ]
    assert slack.reactions_on(DM, ts) == ["white_check_mark"]


async def test_conversations_and_users(slack: FakeSlackServer, web: AsyncWebClient) -> None:
    slack.add_channel("G0SECRET", name="secret")
    slack.add_user("U0ANN", "ann", real_name="Ann Example", display_name="annie")
    im = (await web.conversations_info(channel=DM))["channel"]
    assert (im["id"], im["is_im"], im["is_channel"], im["is_private"]) == (DM, True, False, True)
    public = (await web.conversations_info(channel=CHANNEL))["channel"]
    assert (public["is_channel"], public["is_private"], public["is_member"]) == (True, False, True)
    assert public["name"]
    private = (await web.conversations_info(channel="G0SECRET"))["channel"]
    assert (private["name"], private["is_private"], private["is_group"]) == ("secret", True, True)
    user = (await web.users_info(user="U0ANN"))["user"]
    assert (user["name"], user["real_name"], user["profile"]["display_name"]) == (
        "ann",
        "Ann Example",
        "annie",
    )
    assert (await web.users_info(user="UBOT"))["user"]["is_bot"] is True
    # Posting to a user id posts in the DM with that user.
    posted = await web.chat_postMessage(channel="U0ANN", text="psst")
    assert posted["channel"] == "D0ANN"
    assert slack.texts_in("D0ANN") == ["psst"]


# -- faults of the Web API ------------------------------------------------------------------------


async def test_rate_limit_is_429_with_retry_after(
    slack: FakeSlackServer, web: AsyncWebClient
) -> None:
    slack.rate_limit(CHANNEL, count=2, retry_after=3)
    for _ in range(2):
        with pytest.raises(SlackApiError) as err:
            await web.chat_postMessage(channel=CHANNEL, text="too fast")
        response = err.value.response
        assert (response.status_code, response.headers["Retry-After"]) == (429, "3")
        assert api_error(err) == "ratelimited"
    await web.chat_postMessage(channel=DM, text="another channel is fine")
    await web.chat_postMessage(channel=CHANNEL, text="counted down")
    slack.rate_limit("reactions.add", retry_after=0)
    with pytest.raises(SlackApiError) as err:
        await web.reactions_add(channel=DM, timestamp=slack.posted[0].ts, name="eyes")
    assert err.value.response.headers["Retry-After"] == "0"
    assert [p.text for p in slack.posted] == ["another channel is fine", "counted down"]
    assert [r.status for r in slack.rejected] == [429, 429, 429]


async def test_server_errors(slack: FakeSlackServer, web: AsyncWebClient) -> None:
    slack.fail("chat.postMessage", count=1, status=503)
    slack.fail("*", count=1, status=500)
    with pytest.raises(SlackApiError) as err:
        await web.chat_postMessage(channel=CHANNEL, text="a")
    assert err.value.response.status_code == 503
    assert err.value.response.data == "Service Unavailable"  # plain text, not JSON
    with pytest.raises(SlackApiError) as err:
        await web.auth_test()
    assert err.value.response.status_code == 500
    await web.chat_postMessage(channel=CHANNEL, text="b")
    assert [p.text for p in slack.posted] == ["b"]


async def test_dropped_call_is_retried_once_by_slack_sdk(
    slack: FakeSlackServer, web: AsyncWebClient
) -> None:
    # slack-sdk's default retry handler repeats a call whose connection was closed unanswered,
    # once: if Slack had processed it, the message would be posted twice.
    slack.drop("chat.postMessage", count=1)
    await web.chat_postMessage(channel=CHANNEL, text="retried")
    assert [c.method for c in slack.calls] == ["chat.postMessage", "chat.postMessage"]
    assert [p.text for p in slack.posted] == ["retried"]
    slack.drop("chat.postMessage", count=2)
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await web.chat_postMessage(channel=CHANNEL, text="lost")
    assert len(slack.calls) == 4


# -- files ----------------------------------------------------------------------------------------


async def test_files_upload_v2_end_to_end(slack: FakeSlackServer, web: AsyncWebClient) -> None:
    asked = slack.inject_message(CHANNEL, "send me the report")
    answer = await web.files_upload_v2(
        channel=CHANNEL,
        thread_ts=asked.ts,
        content=b"report bytes",
        filename="report.txt",
        title="The report",
        initial_comment="here it is",
    )
    assert [c.method for c in slack.calls] == [
        "files.getUploadURLExternal",
        "files.completeUploadExternal",
    ]
    assert slack.calls[0].params == {"filename": "report.txt", "length": "12"}
    [upload] = slack.uploads
    assert (upload.filename, upload.title, upload.content) == (
        "report.txt",
        "The report",
        b"report bytes",
    )
    assert (upload.channel, upload.thread_ts, upload.initial_comment) == (
        CHANNEL,
        asked.ts,
        "here it is",
    )
    file = answer["file"]
    assert (file["id"], file["name"], file["size"]) == (upload.file_id, "report.txt", 12)
    assert file["shares"]["public"][CHANNEL][0] == {
        "ts": upload.ts,
        "channel_name": f"channel-{CHANNEL.lower()}",
        "thread_ts": asked.ts,
    }
    assert upload.ts is not None
    assert slack.message(CHANNEL, upload.ts)["text"] == "here it is"
    async with httpx.AsyncClient() as client:
        response = await client.get(
            file["url_private_download"], headers={"Authorization": f"Bearer {slack.bot_token}"}
        )
    assert response.content == b"report bytes"
    # An upload URL takes bytes once it is issued; completing an unknown file fails.
    with pytest.raises(SlackApiError) as err:
        await web.files_completeUploadExternal(files=[{"id": "F0NOPE", "title": "x"}])
    assert api_error(err) == "file_not_found"


async def test_file_download_needs_the_bot_token(slack: FakeSlackServer) -> None:
    file = slack.add_file(b"%PDF-1.7", "scan.pdf", "application/pdf")
    injected = slack.inject_message(DM, "look", files=[file["id"]])
    event = slack.event(injected.event_id)["event"]
    assert event["subtype"] == "file_share"
    [shared] = event["files"]
    assert (shared["id"], shared["mimetype"], shared["size"]) == (file["id"], "application/pdf", 8)
    async with httpx.AsyncClient() as client:
        for url in (shared["url_private"], shared["url_private_download"]):
            assert (await client.get(url)).status_code == 403
            wrong = {"Authorization": f"Bearer {slack.app_token}"}
            assert (await client.get(url, headers=wrong)).status_code == 403
            right = {"Authorization": f"Bearer {slack.bot_token}"}
            response = await client.get(url, headers=right)
            assert (response.status_code, response.content) == (200, b"%PDF-1.7")
            assert response.headers["content-type"] == "application/pdf"
    assert [(d.authorized, d.status) for d in slack.downloads] == [
        (False, 403),
        (False, 403),
        (True, 200),
    ] * 2


# -- injected events ------------------------------------------------------------------------------


async def test_injected_events_have_slack_shapes(slack: FakeSlackServer) -> None:
    dm = slack.inject_message(DM, "hello", user="U0ANN")
    body = slack.event(dm.event_id)
    assert body["type"] == "event_callback"
    assert (body["team_id"], body["api_app_id"], body["event_id"]) == (
        slack.team_id,
        "A1",
        dm.event_id,
    )
    assert body["authorizations"][0]["user_id"] == "UBOT"
    assert body["event_time"] == int(float(dm.ts))
    event = body["event"]
    assert (event["type"], event["channel_type"], event["channel"], event["user"]) == (
        "message",
        "im",
        DM,
        "U0ANN",
    )
    assert event["ts"] == event["event_ts"] == dm.ts
    assert abs(float(dm.ts) - time.time()) < 60  # current, for backlog checks
    assert "subtype" not in event
    assert "thread_ts" not in event

    reply = slack.inject_message(CHANNEL, "in thread", thread_ts=dm.ts)
    event = slack.event(reply.event_id)["event"]
    assert (event["channel_type"], event["thread_ts"]) == ("channel", dm.ts)

    mention = slack.inject_app_mention(CHANNEL, "what's up?")
    assert len(mention.event_ids) == 2
    assert mention.event_id == mention.event_ids[0]
    first, second = (slack.event(e)["event"] for e in mention.event_ids)
    assert (first["type"], second["type"]) == ("app_mention", "message")
    assert first["ts"] == second["ts"] == mention.ts  # one message, two events
    assert first["text"] == second["text"] == "<@UBOT> what's up?"
    assert "channel_type" not in first
    assert first["blocks"][0]["elements"][0]["elements"][0] == {"type": "user", "user_id": "UBOT"}

    edit = slack.inject_edit(CHANNEL, mention.ts, "<@UBOT> never mind")
    event = slack.event(edit.event_id)["event"]
    assert (event["subtype"], event["hidden"]) == ("message_changed", True)
    assert event["message"]["text"] == "<@UBOT> never mind"
    assert event["message"]["ts"] == mention.ts
    assert event["message"]["edited"]["ts"] == event["ts"] != mention.ts
    assert event["previous_message"]["text"] == "<@UBOT> what's up?"

    deleted = slack.inject_delete(CHANNEL, mention.ts)
    event = slack.event(deleted.event_id)["event"]
    assert (event["subtype"], event["deleted_ts"]) == ("message_deleted", mention.ts)
    assert event["previous_message"]["text"] == "<@UBOT> never mind"
    with pytest.raises(KeyError):
        slack.inject_edit(CHANNEL, mention.ts, "gone")

    bot = slack.event(slack.inject_bot_message(CHANNEL, "beep").event_id)["event"]
    assert (bot["subtype"], bot["bot_id"], "user" in bot) == ("bot_message", "B0OTHERBOT", False)
    own = slack.event(slack.inject_own_message(DM, "my answer").event_id)["event"]
    assert (own["user"], own["bot_id"], own["app_id"]) == ("UBOT", "BBOT", "A1")
    raw = slack.inject_event({"type": "reaction_added", "user": DEFAULT_USER, "reaction": "+1"})
    assert slack.event(raw.event_id)["event"]["event_ts"] == raw.ts
    assert len(slack.pending) == 9
    assert len(set(slack.pending)) == 9  # every event id differs


# -- Socket Mode ----------------------------------------------------------------------------------


async def test_hello_envelope_and_ack(slack: FakeSlackServer, sm: Recorder) -> None:
    await sm.wait_for(lambda: bool(sm.messages))
    hello = sm.messages[0]
    assert hello["type"] == "hello"
    assert (hello["num_connections"], hello["connection_info"]) == (1, {"app_id": "A1"})
    injected = slack.inject_message(DM, "hi")
    await slack.wait_until_acked(injected.event_id, timeout=WAIT)
    [envelope] = sm.envelopes
    assert envelope["type"] == "events_api"
    assert (envelope["retry_attempt"], envelope["retry_reason"]) == (0, "")
    assert envelope["accepts_response_payload"] is False
    assert envelope["payload"] == slack.event(injected.event_id)
    [sent] = slack.envelopes
    assert (sent.envelope_id, sent.event_id, sent.event_type) == (
        envelope["envelope_id"],
        injected.event_id,
        "message",
    )
    assert sent.acked_at is not None
    assert [(a.envelope_id, a.outcome) for a in slack.acks] == [(sent.envelope_id, "accepted")]
    assert (slack.acked, slack.pending) == ([injected.event_id], [])
    assert (slack.open_sockets, slack.sockets_opened, slack.max_open_sockets) == (1, 1, 1)


async def test_unacked_envelope_is_redelivered() -> None:
    async with (
        FakeSlackServer(ack_timeout=ACK_TIMEOUT) as slack,
        socket_mode(slack, slack.app_token, slack.bot_token) as sm,
    ):
        sm.ack = retried
        injected = slack.inject_message(DM, "are you there?")
        await slack.wait_until_acked(injected.event_id, timeout=WAIT)
        assert [(r.retry_attempt, r.retry_reason) for r in sm.requests] == [(0, ""), (1, "timeout")]
        first, second = slack.envelopes
        assert first.envelope_id != second.envelope_id  # every attempt is a new envelope
        assert (first.acked_at, second.acked_at is not None) == (None, True)
        assert second.sent_at - first.sent_at >= ACK_TIMEOUT * 0.9  # asyncio timers may be early

        # A lost ack (`ignore_acks`) looks the same to the client: the event comes again.
        slack.ignore_acks(1)
        sm.ack = lambda request: True
        lost = slack.inject_message(DM, "again")
        await slack.wait_until_acked(lost.event_id, timeout=WAIT)
        assert [a.outcome for a in slack.acks] == ["accepted", "lost", "accepted"]
        assert [e.retry_attempt for e in slack.envelopes if e.event_id == lost.event_id] == [0, 1]


async def test_an_event_never_acked_expires_after_max_retries() -> None:
    async with (
        FakeSlackServer(ack_timeout=0.05, max_retries=2) as slack,
        socket_mode(slack, slack.app_token, slack.bot_token) as sm,
    ):
        sm.ack = lambda request: False
        injected = slack.inject_message(DM, "ignored")
        with pytest.raises(RuntimeError, match="given up"):
            await slack.wait_until_acked(injected.event_id, timeout=WAIT)
        assert slack.expired == [injected.event_id]
        assert [e.retry_attempt for e in slack.envelopes] == [0, 1, 2]
        assert [r.retry_attempt for r in sm.requests] == [0, 1, 2]
        assert slack.pending == []


async def test_disconnect_makes_the_client_reconnect(slack: FakeSlackServer, sm: Recorder) -> None:
    assert slack.send_disconnect("refresh_requested") == 1
    await slack.wait_connected(WAIT, opened=2)
    await slack.wait_for(lambda: slack.open_sockets == 1, WAIT)
    old, new = slack.sockets
    assert (old.disconnect_reason, old.close_reason) == ("refresh_requested", "client_close")
    assert new.open
    # slack-sdk closes the old socket before it opens the new one.
    assert old.closed_at is not None
    assert old.closed_at <= new.opened_at
    assert slack.max_open_sockets == 1
    # slack-sdk handles `disconnect` itself: message listeners never see it.
    await sm.wait_for(lambda: len(sm.messages) == 2)
    assert [m["type"] for m in sm.messages] == ["hello", "hello"]
    injected = slack.inject_message(DM, "after the refresh")
    await slack.wait_until_acked(injected.event_id, timeout=WAIT)
    assert slack.envelopes[-1].socket_id == new.id


async def test_server_closes_a_socket_after_disconnect(
    slack: FakeSlackServer, web: AsyncWebClient
) -> None:
    url = str((await web.apps_connections_open(app_token=slack.app_token))["url"])
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        assert (await ws.receive_json())["type"] == "hello"
        slack.send_disconnect("link_disabled", close_after=0.01)
        disconnect = await ws.receive_json()
        assert (disconnect["type"], disconnect["reason"]) == ("disconnect", "link_disabled")
        assert (await ws.receive()).type is aiohttp.WSMsgType.CLOSE
    await slack.wait_for(lambda: slack.open_sockets == 0, WAIT)
    assert (slack.sockets[0].disconnect_reason, slack.sockets[0].close_reason) == (
        "link_disabled",
        "server_close",
    )


async def test_dropped_socket_reconnects_and_delivers_what_came_meanwhile(
    slack: FakeSlackServer, sm: Recorder
) -> None:
    assert slack.drop_socket() == 1
    assert (slack.open_sockets, slack.connected) == (0, False)
    injected = slack.inject_message(DM, "while you were away")
    assert slack.envelopes == []  # nowhere to send it yet
    await slack.wait_until_acked(injected.event_id, timeout=WAIT)
    dropped, new = slack.sockets
    assert dropped.close_reason == "dropped"
    assert slack.envelopes[0].socket_id == new.id
    assert slack.max_open_sockets == 1
    await sm.wait_for(lambda: len(sm.messages) == 3)
    assert sorted(m["type"] for m in sm.messages) == ["events_api", "hello", "hello"]


async def test_envelope_in_flight_on_a_dropped_socket_is_redelivered() -> None:
    async with (
        FakeSlackServer(ack_timeout=ACK_TIMEOUT) as slack,
        socket_mode(slack, slack.app_token, slack.bot_token) as sm,
    ):
        sm.ack = retried
        await slack.wait_connected(WAIT)
        injected = slack.inject_message(DM, "in flight")
        await sm.wait_for(lambda: bool(sm.requests))
        slack.drop_socket()
        await slack.wait_until_acked(injected.event_id, timeout=WAIT)
        assert [(e.socket_id, e.retry_attempt) for e in slack.envelopes] == [(1, 0), (2, 1)]


async def test_silent_socket_is_noticed_by_ping_pong(slack: FakeSlackServer, sm: Recorder) -> None:
    assert slack.silence_socket() == 1
    injected = slack.inject_message(DM, "said into the void")
    # aiohttp's heartbeat (slack-sdk passes heartbeat=ping_interval) gets no pong, closes the
    # connection; slack-sdk's monitor sees the closed session and reconnects.
    await slack.wait_until_acked(injected.event_id, timeout=WAIT)
    silent, new = slack.sockets
    assert (silent.silenced, silent.close_reason, silent.envelopes) == (
        True,
        "connection_lost",
        0,
    )
    assert slack.envelopes[0].socket_id == new.id
    assert slack.max_open_sockets == 1


async def test_refused_connections_are_retried_by_slack_sdk(slack: FakeSlackServer) -> None:
    slack.refuse_connections(2, stage="handshake")
    async with socket_mode(slack, slack.app_token, slack.bot_token):
        await slack.wait_connected(WAIT)
    # slack-sdk retries the same URL after a refused handshake: the ticket stays usable.
    assert slack.refused_connections == 2
    assert [c.method for c in slack.calls] == ["apps.connections.open"]

    slack.refuse_connections(1, stage="open")
    async with socket_mode(slack, slack.app_token, slack.bot_token):
        await slack.wait_connected(WAIT, opened=2)
    assert slack.refused_connections == 3
    assert [r.error for r in slack.rejected] == ["internal_error"]


async def test_a_ticket_opens_one_socket(slack: FakeSlackServer, web: AsyncWebClient) -> None:
    url = str((await web.apps_connections_open(app_token=slack.app_token))["url"])
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(url) as ws:
            hello = await ws.receive_json()
            assert hello["type"] == "hello"
        with pytest.raises(aiohttp.WSServerHandshakeError) as err:
            await session.ws_connect(url)
        assert err.value.status == 401
    await slack.wait_for(lambda: slack.open_sockets == 0, WAIT)
    assert slack.sockets[0].close_reason == "client_close"


async def test_events_are_spread_over_open_sockets(slack: FakeSlackServer) -> None:
    async with (
        socket_mode(slack, slack.app_token, slack.bot_token) as one,
        socket_mode(slack, slack.app_token, slack.bot_token) as two,
    ):
        await slack.wait_for(lambda: slack.open_sockets == 2, WAIT)
        await two.wait_for(lambda: bool(two.messages))
        assert two.messages[0]["num_connections"] == 2
        injected = [slack.inject_message(DM, f"m{i}") for i in range(4)]
        await slack.wait_until_acked(timeout=WAIT)
        assert [e.socket_id for e in slack.envelopes] == [1, 2, 1, 2]
        assert len(one.requests) == len(two.requests) == 2
        assert sorted(slack.acked) == sorted(i.event_id for i in injected)
    assert slack.max_open_sockets == 2


# -- slack-bolt -----------------------------------------------------------------------------------


async def test_bolt_app_in_socket_mode(slack: FakeSlackServer) -> None:
    app = AsyncApp(client=web_client(slack, slack.bot_token))
    seen: list[JSON] = []
    both = asyncio.Event()

    @app.event("message")
    async def on_message(event: JSON, say: AsyncSay) -> None:
        await say(text=f"echo: {event.get('text', '')}", thread_ts=event["ts"])
        seen.append(event)
        if len(seen) == 2:
            both.set()

    @app.event("app_mention")
    async def on_mention(event: JSON) -> None:
        seen.append(event)
        if len(seen) == 2:
            both.set()

    handler = AsyncSocketModeHandler(app, slack.app_token, ping_interval=PING)
    await handler.connect_async()  # type: ignore[no-untyped-call]  # unannotated in slack-bolt
    try:
        own = slack.inject_own_message(DM, "my own words")
        mention = slack.inject_app_mention(CHANNEL, "hi")
        await slack.wait_until_acked(timeout=WAIT)
        async with asyncio.timeout(WAIT):
            await both.wait()  # bolt acks first, then runs the listeners
    finally:
        await handler.close_async()  # type: ignore[no-untyped-call]
    # bolt ignores the bot's own message (it knows the bot from auth.test) but acks it.
    assert own.event_id in slack.acked
    assert sorted((e["type"], e["ts"]) for e in seen) == [
        ("app_mention", mention.ts),
        ("message", mention.ts),
    ]
    assert [(p.channel, p.text, p.thread_ts) for p in slack.posted] == [
        (CHANNEL, "echo: <@UBOT> hi", mention.ts)
    ]
    assert "auth.test" in [c.method for c in slack.calls]  # bolt asks who it is, lazily


# -- Events API -----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def endpoint(
    handle: Callable[[Request], Any],
) -> AsyncIterator[str]:
    """Serve `handle` at `/slack/events` on 127.0.0.1; yield its URL."""

    async def route(request: Request) -> Response:
        answer = handle(request)
        response: Response = await answer if asyncio.iscoroutine(answer) else answer
        return response

    server = LocalServer(Starlette(routes=[Route("/slack/events", route, methods=["POST"])]))
    await server.start()
    try:
        yield f"http://127.0.0.1:{server.port}/slack/events"
    finally:
        await server.stop()


async def test_signed_requests_verify_with_slack_sdk(slack: FakeSlackServer) -> None:
    verifier = SignatureVerifier(slack.signing_secret)
    body = slack.event_callback({"type": "message", "text": "x", "ts": "1.000001"})
    good = slack.signed_request(body)
    assert verifier.is_valid_request(good.body, good.headers)
    wrong = slack.signed_request(body, wrong_signature=True)
    assert not verifier.is_valid_request(wrong.body, wrong.headers)
    stale = slack.signed_request(body, stale=True)
    assert not verifier.is_valid_request(stale.body, stale.headers)
    timestamp = stale.headers["X-Slack-Request-Timestamp"]
    assert stale.headers["X-Slack-Signature"] == slack_signature(
        slack.signing_secret, timestamp, stale.body
    )  # stale, but signed right
    retried = slack.signed_request(body, retry_num=2, retry_reason="http_error")
    assert (retried.headers["X-Slack-Retry-Num"], retried.headers["X-Slack-Retry-Reason"]) == (
        "2",
        "http_error",
    )
    challenge = slack.url_verification_request("abc")
    assert json.loads(challenge.body) == {
        "token": slack.verification_token,
        "challenge": "abc",
        "type": "url_verification",
    }
    assert verifier.is_valid_request(challenge.body, challenge.headers)


async def test_events_api_posts_signed_events_and_retries(slack: FakeSlackServer) -> None:
    verifier = SignatureVerifier(slack.signing_secret)
    received: list[tuple[JSON, dict[str, str]]] = []

    async def handle(request: Request) -> Response:
        body = await request.body()
        assert verifier.is_valid_request(body, dict(request.headers))
        received.append((json.loads(body), dict(request.headers)))
        if len(received) == 1:
            return Response("busy", status_code=500)
        if len(received) == 3:
            return Response("no", status_code=500, headers={"X-Slack-No-Retry": "1"})
        return JSONResponse({})

    async with endpoint(handle) as url:
        slack.use_events_api(url)
        first = slack.inject_message(DM, "over http")
        await slack.wait_until_acked(first.event_id, timeout=WAIT)
        second = slack.inject_message(DM, "refused for good")
        await slack.wait_for(lambda: second.event_id in slack.expired, WAIT)
    assert [b["event_id"] for b, _ in received] == [first.event_id] * 2 + [second.event_id]
    assert received[0][0] == slack.event(first.event_id)
    assert "x-slack-retry-num" not in received[0][1]
    assert (received[1][1]["x-slack-retry-num"], received[1][1]["x-slack-retry-reason"]) == (
        "1",
        "http_error",
    )
    assert [(d.retry_num, d.status, d.error) for d in slack.http_deliveries] == [
        (0, 500, "http_error"),
        (1, 200, None),
        (0, 500, "http_error"),
    ]
    assert slack.envelopes == []


async def test_bolt_app_over_the_events_api(slack: FakeSlackServer) -> None:
    app = AsyncApp(client=web_client(slack, slack.bot_token), signing_secret=slack.signing_secret)
    seen: list[str] = []
    heard = asyncio.Event()

    @app.event("message")
    async def on_message(event: JSON) -> None:
        seen.append(event["text"])
        heard.set()

    handler = AsyncSlackRequestHandler(app)
    async with endpoint(handler.handle) as url:
        assert await slack.verify_events_url(url)
        slack.use_events_api(url)
        injected = slack.inject_message(DM, "via bolt")
        await slack.wait_until_acked(injected.event_id, timeout=WAIT)
        async with asyncio.timeout(WAIT):
            await heard.wait()  # bolt answers 200 first, then runs the listener
        async with httpx.AsyncClient() as client:
            for bad in (
                slack.signed_request(slack.event(injected.event_id), wrong_signature=True),
                slack.signed_request(slack.event(injected.event_id), stale=True),
            ):
                response = await client.post(url, content=bad.body, headers=bad.headers)
                assert response.status_code == 401
    assert seen == ["via bolt"]
    assert [d.status for d in slack.http_deliveries] == [200]


# -- control routes and the standalone server -----------------------------------------------------


async def test_control_routes_refuse_bad_requests(slack: FakeSlackServer) -> None:
    async with httpx.AsyncClient(base_url=slack.url) as client:
        for path, body in [
            ("/control/inject", {"kind": "nope", "channel": DM}),
            ("/control/inject", {"kind": "message"}),
            ("/control/inject", {"channel": DM, "text": 5}),
            ("/control/inject", [{"channel": DM}, {"channel": DM, "bogus": 1}]),
            ("/control/fault", {"fault": "rate_limit"}),
            ("/control/fault", {"fault": "nope"}),
            ("/control/file", {"content_b64": "!!"}),
            ("/control/wait", {"min_posted": "x"}),
        ]:
            response = await client.post(path, json=body)
            assert response.status_code == 400, (path, body)
            assert response.json()["ok"] is False
    assert slack.pending == []  # nothing of a refused batch was injected


async def test_standalone_server_is_usable_from_another_process() -> None:
    bot_token, app_token = "xoxb-standalone", "xapp-standalone"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.fakes.slack",
        "--port",
        "0",
        "--bot-token",
        bot_token,
        "--app-token",
        app_token,
        "--ack-timeout",
        str(ACK_TIMEOUT),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(WAIT):
            banner = (await process.stdout.readline()).decode()
        url = banner.rsplit(" ", 1)[-1].strip()
        assert url.startswith("http://127.0.0.1:"), banner
        async with SlackServerClient(url) as control:
            await control.wait_up(WAIT)
            file = await control.add_file(b"remote", "r.txt", "text/plain")
            first, mention = await control.inject_many(
                [
                    {"channel": DM, "text": "from afar", "files": [file["id"]]},
                    {"kind": "app_mention", "channel": CHANNEL, "text": "hey"},
                ]
            )
            assert len(mention.event_ids) == 2
            async with socket_mode(control, app_token, bot_token) as sm:
                sm.ack = retried
                state = await control.wait(
                    WAIT, acked=[first.event_id, *mention.event_ids], connected=True
                )
                assert [e["retry_attempt"] for e in state["envelopes"]] == [0, 0, 0, 1, 1, 1]
                assert await control.fault("drop_socket") == 1
                later = await control.inject_message(DM, "after the drop")
                state = await control.wait(WAIT, acked=[later.event_id], min_sockets_opened=2)
                assert state["max_open_sockets"] == 1
                web = web_client(control, bot_token)
                await web.chat_postMessage(channel=DM, text="reply", thread_ts=first.ts)
                await control.fault("rate_limit", target=DM, retry_after=1)
                with pytest.raises(SlackApiError):
                    await web.chat_postMessage(channel=DM, text="too fast")
                [event] = [
                    r.payload["event"]
                    for r in sm.requests
                    if r.payload["event_id"] == first.event_id and r.retry_attempt == 0
                ]
                async with httpx.AsyncClient() as client:
                    response = await client.get(
                        event["files"][0]["url_private_download"],
                        headers={"Authorization": f"Bearer {bot_token}"},
                    )
                    assert response.content == b"remote"
            state = await control.wait(WAIT, min_posted=1, connected=False)
            assert state["texts"] == {DM: ["reply"]}
            assert state["posted"][0]["thread_ts"] == first.ts
            with pytest.raises(TimeoutError):
                await control.wait(0.05, min_posted=2)
            with pytest.raises(httpx.HTTPStatusError):
                await control.fault("no_such_fault")

        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(WAIT):
            _, stderr = await process.communicate()
        assert process.returncode == 0, stderr.decode()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
