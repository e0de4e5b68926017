"""The real LoopbackAdapter against the fake chat server (in-process and as a subprocess)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from adapters.loopback import PLATFORM as TEST
from adapters.loopback.adapter import LoopbackAdapter
from adapters.loopback.config import LoopbackConfig
from gateway.contracts.adapter import Adapter, AdapterState, MessageEditor, TypingIndicator
from gateway.contracts.errors import (
    AuthError,
    MarkupRejected,
    NotReady,
    PermanentSendError,
    RateLimited,
)
from gateway.contracts.ids import AccountId, ChatId, PlatformMessageId, ThreadId
from gateway.contracts.messages import OutboundMessage, SendLimits, TextFormat
from tests.fakes.chat_server import DEFAULT_MARKUP_MARKER, ChatServerClient, FakeChatServer
from tests.fakes.sink import ListSink, receiving, run_until_error

TOKEN = "4242:loopback-secret"
WAIT = 10.0
"""Upper bound of every wait for a condition."""
REPO = Path(__file__).resolve().parents[2]


def loopback_config(url: str, *, token: str = TOKEN, **changes: Any) -> LoopbackConfig:
    settings: dict[str, Any] = {
        "url": url,
        "token": SecretStr(token),
        "account": "bot1",
        "poll_timeout": 5.0,
    }
    settings.update(changes)
    return LoopbackConfig(**settings)


def outbound(chat_id: str = "c1", text: str = "Hello **there**", **changes: Any) -> OutboundMessage:
    fields: dict[str, Any] = {
        "platform": TEST,
        "account": AccountId("bot1"),
        "chat_id": ChatId(chat_id),
        "text": text,
        "idempotency_key": "s1:t1:0",
    }
    fields.update(changes)
    return OutboundMessage(**fields)


def pending_ids(chat: FakeChatServer) -> list[str | None]:
    return [u.message_id for u in chat.pending]


@pytest.fixture
async def chat() -> AsyncIterator[FakeChatServer]:
    async with FakeChatServer(TOKEN) as server:
        yield server


@pytest.fixture
async def adapter(chat: FakeChatServer) -> AsyncIterator[LoopbackAdapter]:
    async with LoopbackAdapter(loopback_config(chat.base_url)) as connected:
        yield connected


# -- connecting -------------------------------------------------------------------------------


async def test_adapter_shape(chat: FakeChatServer, adapter: LoopbackAdapter) -> None:
    assert isinstance(adapter, Adapter)
    assert isinstance(adapter, TypingIndicator)
    assert isinstance(adapter, MessageEditor)
    assert adapter.platform is TEST
    assert adapter.account == AccountId("bot1")
    assert adapter.limits == SendLimits(
        max_chunk=1000, count_utf16=False, min_edit_interval=0.2, min_send_interval=0.0
    )


async def test_enter_checks_the_token_without_acknowledging(chat: FakeChatServer) -> None:
    chat.inject("c1", "waiting", sender_id="u1")
    adapter = LoopbackAdapter(loopback_config(chat.base_url))
    assert adapter.liveness() is AdapterState.STARTING
    async with adapter:
        assert adapter.liveness() is AdapterState.RECEIVING
        assert chat.polls == 0
        assert pending_ids(chat) == ["m1"]
    assert adapter.liveness() is AdapterState.STOPPED
    assert chat.acknowledged == []


async def test_wrong_token_is_an_auth_error_on_enter(chat: FakeChatServer) -> None:
    with pytest.raises(AuthError, match="401"):
        async with LoopbackAdapter(loopback_config(chat.base_url, token="4242:wrong")):
            pass


async def test_unreachable_server_is_not_ready_on_enter() -> None:
    with socket.socket() as closed:  # bound but not listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        with pytest.raises(NotReady, match="ConnectError"):
            async with LoopbackAdapter(loopback_config(url)):
                pass


# -- receiving --------------------------------------------------------------------------------


async def test_messages_are_acknowledged_only_after_accept_returned(
    chat: FakeChatServer, adapter: LoopbackAdapter
) -> None:
    first = chat.inject("c1", "one", sender_id="u1", sender_name="Ann")
    chat.inject("g1", "two", sender_id="u2", chat_type="group", mentions_bot=True)
    chat.inject("g1", "three", sender_id="u2", chat_type="group", thread_id="t1")
    sink = ListSink()
    sink.gate.clear()
    async with receiving(adapter, sink):
        await sink.until(lambda: len(sink.accepting) == 1)
        assert sink.accepting[0].platform_message_id == first
        assert pending_ids(chat) == ["m1", "m2", "m3"]  # accept has not returned
        assert chat.acknowledged == []
        sink.gate.set()
        await chat.wait_until_acknowledged(timeout=WAIT)
        assert chat.acknowledged == ["m1", "m2", "m3"]
        assert adapter.liveness() is AdapterState.RECEIVING

    assert sink.texts == ["one", "two", "three"]
    one, two, three = sink.messages
    assert (one.chat_id, one.sender.display_name, one.is_direct) == ("c1", "Ann", True)
    assert (two.is_direct, two.mentions_bot) == (False, True)
    assert three.thread_id == ThreadId("t1")
    assert {m.platform for m in sink.messages} == {TEST}
    assert {m.account for m in sink.messages} == {AccountId("bot1")}


async def test_messages_injected_while_polling_wake_the_poll(
    chat: FakeChatServer, adapter: LoopbackAdapter
) -> None:
    sink = ListSink()
    async with receiving(adapter, sink):
        await chat.wait_for(lambda: chat.polls >= 1, WAIT)
        for n in range(5):
            chat.inject("c1", f"message {n}", sender_id="u1")
            await sink.until_stored(n + 1)
    assert sink.texts == [f"message {n}" for n in range(5)]


async def test_a_failing_sink_means_no_acknowledgement_and_redelivery(
    chat: FakeChatServer,
) -> None:
    chat.inject("c1", "kept", sender_id="u1")
    chat.inject("c1", "refused", sender_id="u1")
    failing = ListSink(fail_on=lambda message: message.text == "refused")
    async with LoopbackAdapter(loopback_config(chat.base_url)) as adapter:
        with pytest.raises(RuntimeError, match="inbox unavailable for m2"):
            await run_until_error(adapter, failing)
    assert failing.texts == ["kept"]
    assert pending_ids(chat) == ["m1", "m2"]
    assert chat.acknowledged == []

    # What the supervisor's runner does next: a new connection, which gets both again.
    sink = ListSink()
    async with LoopbackAdapter(loopback_config(chat.base_url)) as adapter, receiving(adapter, sink):
        await chat.wait_until_acknowledged("m1", "m2", timeout=WAIT)
    assert sink.texts == ["kept", "refused"]


async def test_duplicate_delivery_repeats_the_platform_message_id(
    chat: FakeChatServer, adapter: LoopbackAdapter
) -> None:
    sink = ListSink()
    async with receiving(adapter, sink):
        message_id = chat.inject("c1", "only once, please", sender_id="u1")
        await chat.wait_until_acknowledged(message_id, timeout=WAIT)
        update_id = chat.duplicate(message_id)
        await chat.wait_until_acknowledged(timeout=WAIT)
    assert [m.platform_message_id for m in sink.messages] == [message_id, message_id]
    assert chat.acknowledged == [message_id, message_id]
    assert chat.acknowledged_updates == [1, update_id]


async def test_junk_updates_are_skipped_and_acknowledged(
    chat: FakeChatServer, adapter: LoopbackAdapter, caplog: pytest.LogCaptureFixture
) -> None:
    junk = chat.inject_raw({"message_id": "x1", "text": "no chat, no sender"})
    chat.inject("c1", "fine", sender_id="u1")
    sink = ListSink()
    with caplog.at_level(logging.WARNING, logger="adapters.loopback.adapter"):
        async with receiving(adapter, sink):
            await chat.wait_until_acknowledged(timeout=WAIT)
    assert sink.texts == ["fine"]
    assert chat.acknowledged_updates == [junk, junk + 1]
    assert f"skipped update {junk}: the message has no chat id" in caplog.text


async def test_server_error_on_poll_is_not_ready_and_acknowledges_nothing(
    chat: FakeChatServer, adapter: LoopbackAdapter
) -> None:
    chat.inject("c1", "accepted, not yet acknowledged", sender_id="u1")
    sink = ListSink()
    sink.gate.clear()
    task = asyncio.create_task(run_until_error(adapter, sink))
    await sink.until(lambda: len(sink.accepting) == 1)
    chat.fail_updates(1)  # the poll that would acknowledge m1
    sink.gate.set()
    with pytest.raises(NotReady, match="HTTP 500"):
        await task
    assert sink.texts == ["accepted, not yet acknowledged"]
    assert pending_ids(chat) == ["m1"]


async def test_dropped_connection_on_poll_is_not_ready(
    chat: FakeChatServer, adapter: LoopbackAdapter
) -> None:
    chat.drop_polls(1)
    chat.inject("c1", "after the drop", sender_id="u1")
    with pytest.raises(NotReady, match="RemoteProtocolError"):
        await run_until_error(adapter, ListSink())
    assert pending_ids(chat) == ["m1"]

    sink = ListSink()
    async with LoopbackAdapter(loopback_config(chat.base_url)) as again, receiving(again, sink):
        await chat.wait_until_acknowledged(timeout=WAIT)
    assert sink.texts == ["after the drop"]


# -- sending ----------------------------------------------------------------------------------


async def test_send_returns_the_platform_message_id(
    chat: FakeChatServer, adapter: LoopbackAdapter
) -> None:
    message = outbound(
        "g1",
        "**Report** ready",
        thread_id=ThreadId("t1"),
        reply_to=PlatformMessageId("m7"),
        idempotency_key="s3:t9:1",
        recovered=True,
    )
    receipt = await adapter.send(message)
    (sent,) = chat.sent
    assert receipt.platform_message_id == PlatformMessageId(sent.message_id)
    assert (sent.chat_id, sent.thread_id, sent.text, sent.format) == (
        "g1",
        "t1",
        "**Report** ready",
        "markdown",
    )
    assert (sent.reply_to, sent.idempotency_key, sent.recovered) == ("m7", "s3:t9:1", True)
    assert chat.text_of(sent.message_id) == "**Report** ready"

    again = await adapter.send(message)  # the platform does not deduplicate
    assert again.platform_message_id != receipt.platform_message_id
    assert [s.idempotency_key for s in chat.sent] == ["s3:t9:1", "s3:t9:1"]


async def test_rate_limited_send_carries_retry_after(
    chat: FakeChatServer, adapter: LoopbackAdapter
) -> None:
    chat.rate_limit("c1", count=1, retry_after=2.5)
    with pytest.raises(RateLimited) as caught:
        await adapter.send(outbound("c1"))
    assert caught.value.retry_after == 2.5
    await adapter.send(outbound("c2"))  # other chats are not limited
    await adapter.send(outbound("c1"))  # only the next `count` sends were
    assert [s.chat_id for s in chat.sent] == ["c2", "c1"]
    assert [(r.route, r.status) for r in chat.rejected] == [("send", 429)]


async def test_rejected_markup_is_markup_rejected_and_plain_passes(
    chat: FakeChatServer, adapter: LoopbackAdapter
) -> None:
    chat.reject_markup()
    text = f"broken {DEFAULT_MARKUP_MARKER} markup"
    with pytest.raises(MarkupRejected):
        await adapter.send(outbound(text=text))
    receipt = await adapter.send(outbound(text=text, format=TextFormat.PLAIN))
    assert receipt.platform_message_id is not None
    assert [(s.text, s.format) for s in chat.sent] == [(text, "plain")]


async def test_blocked_chat_is_a_permanent_error(
    chat: FakeChatServer, adapter: LoopbackAdapter
) -> None:
    receipt = await adapter.send(outbound("c1", "before"))
    assert receipt.platform_message_id is not None
    chat.block_chat("c1")
    with pytest.raises(PermanentSendError, match="blocked"):
        await adapter.send(outbound("c1"))
    with pytest.raises(PermanentSendError, match="blocked"):
        await adapter.edit(receipt.platform_message_id, outbound("c1", "after"))
    with pytest.raises(PermanentSendError, match="blocked"):
        await adapter.typing(ChatId("c1"), None)
    assert [r.status for r in chat.rejected] == [403, 403, 403]


async def test_server_error_on_send_is_not_ready(
    chat: FakeChatServer, adapter: LoopbackAdapter
) -> None:
    chat.fail_sends(1)
    with pytest.raises(NotReady, match="HTTP 500"):
        await adapter.send(outbound())
    await adapter.send(outbound())
    assert len(chat.sent) == 1


async def test_send_to_a_stopped_server_is_not_ready() -> None:
    async with contextlib.AsyncExitStack() as stack:
        async with FakeChatServer(TOKEN) as short_lived:
            adapter = await stack.enter_async_context(
                LoopbackAdapter(loopback_config(short_lived.base_url))
            )
            await adapter.send(outbound())
        with pytest.raises(NotReady):
            await adapter.send(outbound())


async def test_edit_replaces_the_text(chat: FakeChatServer, adapter: LoopbackAdapter) -> None:
    receipt = await adapter.send(outbound("c1", "Thinking…"))
    target = receipt.platform_message_id
    assert target is not None
    edited = await adapter.edit(target, outbound("c1", "The answer is 42."))
    assert edited.platform_message_id == target
    await adapter.edit(target, outbound("c1", "The answer is 42."))  # same text succeeds
    assert chat.text_of(target) == "The answer is 42."
    assert chat.texts_in("c1") == ["The answer is 42."]
    assert [(e.message_id, e.text) for e in chat.edits] == [(target, "The answer is 42.")] * 2
    with pytest.raises(PermanentSendError, match="message not found"):
        await adapter.edit(PlatformMessageId("s999"), outbound("c1", "lost"))
    with pytest.raises(PermanentSendError, match="message not found"):
        await adapter.edit(target, outbound("other-chat", "wrong chat"))


async def test_typing(chat: FakeChatServer, adapter: LoopbackAdapter) -> None:
    await adapter.typing(ChatId("c1"), None)
    await adapter.typing(ChatId("g1"), ThreadId("t1"))
    assert chat.typing == ["c1", "g1"]


async def test_wait_for_sent(chat: FakeChatServer, adapter: LoopbackAdapter) -> None:
    async def send_later() -> None:
        await adapter.send(outbound("c1", "first"))
        await adapter.send(outbound("c2", "second"))

    task = asyncio.create_task(send_later())
    matches = await chat.wait_for_sent(lambda s: s.chat_id == "c2", timeout=WAIT)
    assert [s.text for s in matches] == ["second"]
    assert [s.text for s in await chat.wait_for_sent(2, timeout=WAIT)] == ["first", "second"]
    await task
    with pytest.raises(TimeoutError):
        await chat.wait_for_sent(3, timeout=0.01)


# -- the control routes -----------------------------------------------------------------------


async def test_control_routes_drive_the_server(
    chat: FakeChatServer, adapter: LoopbackAdapter
) -> None:
    sink = ListSink()
    async with ChatServerClient(chat.base_url) as control, receiving(adapter, sink):
        ids = await control.inject_many(
            [
                {"chat_id": "c1", "text": "hello", "sender_id": "u1", "sender_name": "Ann"},
                {
                    "chat_id": "g1",
                    "text": "hi all",
                    "sender_id": "u2",
                    "chat_type": "group",
                    "thread_id": "t1",
                    "mentions_bot": True,
                    "message_id": "custom-1",
                },
            ]
        )
        assert ids == ["m1", "custom-1"]
        state = await control.wait(WAIT, acknowledged=ids, max_pending=0)
        assert state["acknowledged"] == ["m1", "custom-1"]
        assert sink.texts == ["hello", "hi all"]
        assert sink.messages[1].thread_id == ThreadId("t1")

        answer = await control.fault("duplicate", message_id="custom-1")
        await control.wait(WAIT, max_pending=0, acknowledged=["custom-1"])
        assert answer["update_id"] == 3
        assert [m.platform_message_id for m in sink.messages][-1] == "custom-1"

        await control.fault("rate_limit", chat_id="c1", count=1, retry_after=0.5)
        with pytest.raises(RateLimited) as caught:
            await adapter.send(outbound("c1"))
        assert caught.value.retry_after == 0.5
        await control.fault("fail_sends", count=1)
        with pytest.raises(NotReady):
            await adapter.send(outbound("c1"))
        await control.fault("block_chat", chat_id="c9")
        with pytest.raises(PermanentSendError):
            await adapter.send(outbound("c9"))
        await control.fault("reject_markup", marker="~~")
        with pytest.raises(MarkupRejected):
            await adapter.send(outbound("c1", "~~struck~~"))
        await control.fault("clear")
        receipt = await adapter.send(outbound("c9", "~~struck~~"))
        assert receipt.platform_message_id is not None
        await adapter.edit(receipt.platform_message_id, outbound("c9", "v2"))
        await adapter.typing(ChatId("c9"), None)

        state = await control.wait(WAIT, min_sent=1, min_edits=1, min_typing=1)
        assert [s["text"] for s in state["sent"]] == ["~~struck~~"]
        assert state["sent"][0]["idempotency_key"] == "s1:t1:0"
        assert state["texts"] == {state["sent"][0]["message_id"]: "v2"}
        assert [e["text"] for e in state["edits"]] == ["v2"]
        assert state["typing"] == ["c9"]
        assert [r["status"] for r in state["rejected"]] == [429, 500, 403, 400]
        assert state["pending"] == 0

        with pytest.raises(TimeoutError):
            await control.wait(0.05, min_sent=2)
        with pytest.raises(httpx.HTTPStatusError) as refused:
            await control.fault("meteor_strike")
        assert refused.value.response.status_code == 400
        with pytest.raises(httpx.HTTPStatusError):
            await control.inject_many([{"chat_id": "c1", "text": "no sender"}])


async def test_control_faults_on_polls(chat: FakeChatServer, adapter: LoopbackAdapter) -> None:
    async with ChatServerClient(chat.base_url) as control:
        await control.fault("fail_updates", count=1, status=503)
        with pytest.raises(NotReady, match="HTTP 503"):
            await run_until_error(adapter, ListSink())
        await control.fault("drop_polls", count=1)
        with pytest.raises(NotReady, match="RemoteProtocolError"):
            await run_until_error(adapter, ListSink())
        assert (await control.state())["polls"] == 2


async def test_bad_requests_get_json_errors(chat: FakeChatServer) -> None:
    async with httpx.AsyncClient(base_url=chat.base_url) as client:
        for method, path in [
            ("GET", "/botnope/me"),
            ("GET", "/botnope/updates"),
            ("POST", "/botnope/send"),
            ("POST", "/botnope/edit"),
            ("POST", "/botnope/typing"),
        ]:
            response = await client.request(method, path, json={})
            assert (response.status_code, response.json()) == (
                401,
                {"ok": False, "error": "unauthorized"},
            )
        bot = f"/bot{TOKEN}"
        assert (await client.get(f"{bot}/updates?offset=x")).status_code == 400
        assert (await client.post(f"{bot}/send", content=b"{")).status_code == 400
        response = await client.post(f"{bot}/send", json={"chat_id": "c1", "text": "x"})
        assert response.status_code == 200  # format defaults to markdown
        response = await client.post(
            f"{bot}/send", json={"chat_id": "c1", "text": "x", "format": "html"}
        )
        assert response.status_code == 400
        assert (await client.get("/elsewhere")).json() == {"ok": False, "error": "not found"}


# -- standalone -------------------------------------------------------------------------------


async def test_standalone_server_is_usable_from_another_process() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.fakes.chat_server",
        "--port",
        "0",
        "--token",
        TOKEN,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(WAIT):
            banner = (await process.stdout.readline()).decode()
        base_url = banner.rsplit(" ", 1)[-1].strip()
        assert base_url.startswith("http://127.0.0.1:"), banner
        async with ChatServerClient(base_url) as control:
            await control.wait_up(WAIT)
            message_id = await control.inject("c1", "from afar", sender_id="u1")
            sink = ListSink()
            async with (
                LoopbackAdapter(loopback_config(base_url)) as adapter,
                receiving(adapter, sink),
            ):
                await control.wait(WAIT, acknowledged=[message_id])
                await adapter.send(outbound("c1", "reply"))
            state = await control.wait(WAIT, min_sent=1)
        assert sink.texts == ["from afar"]
        assert [s["text"] for s in state["sent"]] == ["reply"]

        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(WAIT):
            _, stderr = await process.communicate()
        assert process.returncode == 0, stderr.decode()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
