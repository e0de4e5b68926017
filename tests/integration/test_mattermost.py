"""The real MattermostAdapter (aiohttp, REST v4 + websocket) against the fake Mattermost.

Adapter level: no daemon, no store (checkpoints in memory); button presses and slash
commands go to `handle_webhook` as Herald's HTTP server hands them over. What the daemon
makes of it all is in the contract suites (tests/contract/harness.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from aiohttp import web

from adapters.mattermost import PLATFORM as MATTERMOST
from adapters.mattermost import SPEC as MATTERMOST_SPEC
from adapters.mattermost.adapter import MattermostAdapter
from adapters.mattermost.config import MattermostConfig
from gateway.checkpoints import MemoryCheckpoints
from gateway.contracts.adapter import AdapterContext, AdapterState, InboundSink
from gateway.contracts.errors import AuthError, NotReady, RateLimited
from gateway.contracts.ids import AccountId, ChatId, PlatformMessageId, ThreadId
from gateway.contracts.messages import Attachment, Button, OutboundMessage
from tests.fakes.mattermost_server import BOT_ID, BOT_NAME, TOKEN, FakeMattermostServer
from tests.fakes.sink import ListSink, receiving

pytestmark = pytest.mark.timeout(60)

ANN = "annannannannannannannanna1"
BOB = "bobbobbobbobbobbobbobbobb1"
DM = "dmdmdmdmdmdmdmdmdmdmdmdma1"
DM_BOB = "dmdmdmdmdmdmdmdmdmdmdmdmb1"
TOWN = "towntowntowntowntowntowna1"
GROUP = "groupgroupgroupgroupgroup1"
SECRET = "button-secret-0123456789"
COMMAND_TOKEN = "cmdtokencmdtokencmdtoken1a"
WAIT = 10.0


@pytest.fixture
async def mm() -> AsyncIterator[FakeMattermostServer]:
    async with FakeMattermostServer() as server:
        server.add_user(ANN, "ann")
        server.add_user(BOB, "bob")
        server.add_channel(DM, "D")
        server.add_channel(DM_BOB, "D")
        server.add_channel(TOWN, "O", "town-square")
        server.add_channel(GROUP, "G")
        yield server


def config(mm: FakeMattermostServer, **changes: Any) -> MattermostConfig:
    settings: dict[str, Any] = {
        "url": mm.base_url,
        "token": TOKEN,
        "allowed_users": [ANN, BOB],
        "min_send_interval": 0,
        "public_url": "http://127.0.0.1:9",
        "action_secret": SECRET,
        "command_token": COMMAND_TOKEN,
        **changes,
    }
    return MattermostConfig.model_validate(settings)


def adapter_for(
    mm: FakeMattermostServer,
    tmp_path: Path,
    checkpoints: MemoryCheckpoints | None = None,
    **changes: Any,
) -> MattermostAdapter:
    return MattermostAdapter(
        config(mm, **changes), tmp_path / "files", checkpoints or MemoryCheckpoints()
    )


def chunk(channel: str, text: str, **fields: Any) -> OutboundMessage:
    return OutboundMessage(
        platform=MATTERMOST,
        account=AccountId("default"),
        chat_id=ChatId(channel),
        text=text,
        idempotency_key=fields.pop("key", f"k-{time.monotonic_ns()}"),
        **fields,
    )


async def until_receiving(adapter: MattermostAdapter, mm: FakeMattermostServer) -> None:
    async with asyncio.timeout(WAIT):
        while adapter.liveness() is not AdapterState.RECEIVING or not mm.connected:
            await asyncio.sleep(0.02)


async def test_a_direct_message_and_the_answer(mm: FakeMattermostServer, tmp_path: Path) -> None:
    sink = ListSink()
    async with adapter_for(mm, tmp_path) as adapter, receiving(adapter, sink):
        await until_receiving(adapter, mm)
        post = mm.inject_post(DM, "hello there", user=ANN)
        await sink.until_stored(1)
        message = sink.messages[0]
        assert message.text == "hello there"
        assert message.is_direct
        assert message.platform_message_id == f"{DM}:{post['id']}"
        assert str(message.sender.id) == ANN
        receipt = await adapter.send(chunk(DM, "**hi** ann"))
        assert mm.texts_in(DM) == ["**hi** ann"]
        assert receipt.platform_message_id == f"{DM}:{mm.posted[0]['id']}"
        assert await adapter.check() == f"@{BOT_NAME} ({BOT_ID}) on 127.0.0.1:{mm.port}"


async def test_channels_answer_mentions_only_and_threads_are_sessions(
    mm: FakeMattermostServer, tmp_path: Path
) -> None:
    sink = ListSink()
    async with adapter_for(mm, tmp_path) as adapter, receiving(adapter, sink):
        await until_receiving(adapter, mm)
        mm.inject_post(TOWN, "chatter among people", user=ANN)
        root = mm.inject_post(TOWN, "@herald what is up?", user=ANN, mention=True)
        mm.inject_post(GROUP, "hi @herald", user=BOB)  # mentioned by name only
        mm.inject_post(TOWN, "more, @herald", user=BOB, root_id=root["id"], mention=True)
        await sink.until_stored(3)
        first, group, reply = sink.messages
        assert (first.text, first.is_direct, first.mentions_bot) == ("what is up?", False, True)
        assert first.thread_id is None
        assert (group.text, group.is_direct) == ("hi", False)
        assert reply.thread_id == ThreadId(root["id"])
        assert reply.session_key != first.session_key
        await adapter.send(chunk(TOWN, "in the thread", thread_id=ThreadId(root["id"])))
        assert mm.posted[-1]["root_id"] == root["id"]
    assert [m.text for m in sink.messages] == ["what is up?", "hi", "more,"]


async def test_files_both_ways(mm: FakeMattermostServer, tmp_path: Path) -> None:
    sink = ListSink()
    async with adapter_for(mm, tmp_path) as adapter, receiving(adapter, sink):
        await until_receiving(adapter, mm)
        file_id = mm.add_file(b"%PDF-1.4 ann", "d.pdf", "application/pdf", ANN)
        mm.inject_post(DM, "look", user=ANN, files=(file_id,))
        await sink.until_stored(1)
        (attachment,) = sink.messages[0].attachments
        assert attachment.path.read_bytes() == b"%PDF-1.4 ann"
        assert (attachment.filename, attachment.mime_type) == ("d.pdf", "application/pdf")
        out = tmp_path / "report.txt"
        out.write_bytes(b"the report")
        await adapter.send(
            chunk(DM, "here it is", attachments=(Attachment(out, "text/plain", 10, "report.txt"),))
        )
        assert mm.uploads == [(DM, "report.txt", b"the report")]
        (post,) = mm.posted
        assert post["message"] == "here it is"
        assert len(post["file_ids"]) == 1
        assert mm.post_requests == 1  # the text and the file in one post


async def test_a_voice_reply_is_one_file_post_with_its_text(
    mm: FakeMattermostServer, tmp_path: Path
) -> None:
    audio = tmp_path / "reply.ogg"
    audio.write_bytes(b"OggS voice")
    async with adapter_for(mm, tmp_path) as adapter:
        assert adapter.limits.voice
        voice = Attachment(audio, "audio/ogg", 10, "reply.ogg", voice=True)
        await adapter.send(chunk(DM, "the words", attachments=(voice,)))
    (post,) = mm.posted
    assert post["message"] == "the words"
    assert len(post["file_ids"]) == 1


async def test_a_dropped_stream_is_read_back_with_nothing_lost_or_twice(
    mm: FakeMattermostServer, tmp_path: Path
) -> None:
    checkpoints = MemoryCheckpoints()
    sink = ListSink()
    async with adapter_for(mm, tmp_path, checkpoints) as first:
        task = asyncio.create_task(first.run(sink))
        await until_receiving(first, mm)
        mm.inject_post(DM, "one", user=ANN)
        mm.inject_post(TOWN, "@herald two", user=BOB, mention=True)
        await sink.until_stored(2)
        mm.drop_connections()
        with pytest.raises(NotReady, match="websocket"):
            async with asyncio.timeout(WAIT):
                await task
    # Posted while no socket was open: sent to no one, still in the channels.
    mm.inject_post(DM, "three", user=ANN)
    mm.inject_post(TOWN, "@herald four", user=BOB)
    mm.inject_post(TOWN, "not for the bot", user=BOB)
    async with adapter_for(mm, tmp_path, checkpoints) as second, receiving(second, sink):
        await until_receiving(second, mm)
        await sink.until_stored(4)
        mm.inject_post(DM, "five", user=ANN)
        await sink.until_stored(5)
    assert sink.texts == ["one", "two", "three", "four", "five"]


async def test_a_gap_in_the_event_sequence_is_read_back(
    mm: FakeMattermostServer, tmp_path: Path
) -> None:
    sink = ListSink()
    async with adapter_for(mm, tmp_path) as adapter, receiving(adapter, sink):
        await until_receiving(adapter, mm)
        mm.inject_post(DM, "first", user=ANN)
        await sink.until_stored(1)
        mm.lose_next_event()
        mm.inject_post(DM, "lost on the wire", user=ANN)
        mm.duplicate_next_event()
        mm.inject_post(DM, "after the gap", user=ANN)
        await sink.until_stored(3)
        await asyncio.sleep(0)  # nothing more is on its way: the duplicate was dropped
    assert sink.texts == ["first", "lost on the wire", "after the gap"]


async def test_a_rate_limited_channel_beside_another(
    mm: FakeMattermostServer, tmp_path: Path
) -> None:
    mm.rate_limit(DM, reset=7)
    async with adapter_for(mm, tmp_path) as adapter:
        with pytest.raises(RateLimited) as limited:
            await adapter.send(chunk(DM, "to ann"))
        assert limited.value.retry_after == 7
        await adapter.send(chunk(DM_BOB, "to bob"))
        await adapter.send(chunk(DM, "to ann"))
    assert mm.texts_in(DM_BOB) == ["to bob"]
    assert mm.texts_in(DM) == ["to ann"]


async def test_edits_and_reactions(mm: FakeMattermostServer, tmp_path: Path) -> None:
    sink = ListSink()
    async with adapter_for(mm, tmp_path) as adapter, receiving(adapter, sink):
        await until_receiving(adapter, mm)
        post = mm.inject_post(DM, "what is 2+2", user=ANN)
        await sink.until_stored(1)
        edited = mm.edit_post(post["id"], "what is 2+3")
        await sink.until_stored(2)
        edit = sink.messages[1]
        assert edit.text == "what is 2+3"
        assert edit.edit_of == PlatformMessageId(f"{DM}:{post['id']}")
        assert edit.platform_message_id == f"{DM}:{post['id']}:e{edited['edit_at']}"
        receipt = await adapter.send(chunk(DM, "five"))
        mm.react(mm.posted[0]["id"], "+1", user=ANN)
        await sink.until(lambda: len(sink.reactions) == 1)
        (reaction,) = sink.reactions
        assert (reaction.emoji, reaction.message, reaction.is_direct) == (
            "+1",
            receipt.platform_message_id,
            True,
        )
        assert receipt.platform_message_id is not None
        await adapter.edit(receipt.platform_message_id, chunk(DM, "five!"))
        assert mm.shown_in(DM) == ["five!"]
        await adapter.working(ChatId(DM), edit.edit_of)
        await adapter.done(ChatId(DM), edit.edit_of)
        assert mm.reactions[0]["emoji_name"] == "eyes"
        assert mm.removed_reactions == [(post["id"], "eyes")]
        await adapter.typing(ChatId(DM), None)
        assert mm.typing == [DM]


class _Relay:
    """Herald's HTTP server as far as the fake's button presses go: each POST to the
    integration URL handed to the adapter's `handle_webhook`."""

    def __init__(self, adapter: MattermostAdapter, sink: InboundSink) -> None:
        self.adapter, self.sink = adapter, sink

    async def handle(self, request: web.Request) -> web.Response:
        path = request.match_info["path"]
        answer = await self.adapter.handle_webhook(
            path, dict(request.headers), await request.read(), self.sink
        )
        return web.Response(status=answer.status, body=answer.body)


async def test_an_approval_by_button_and_a_forged_press_refused(
    mm: FakeMattermostServer, tmp_path: Path, unused_tcp_port: int
) -> None:
    sink = ListSink()
    public = f"http://127.0.0.1:{unused_tcp_port}"
    async with adapter_for(mm, tmp_path, public_url=public) as adapter:
        app = web.Application()
        app.router.add_post("/webhooks/mattermost/{path}", _Relay(adapter, sink).handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", unused_tcp_port).start()
            root = mm.inject_post(TOWN, "@herald deploy", user=ANN, mention=True)
            buttons = (Button("Approve", "/approve 7"), Button("Deny", "/deny 7"))
            await adapter.send(
                chunk(TOWN, "Approval needed #7", buttons=buttons, thread_id=ThreadId(root["id"]))
            )
            question = mm.posted[0]
            actions = question["props"]["attachments"][0]["actions"]
            assert [a["name"] for a in actions] == ["Approve", "Deny"]
            assert actions[0]["integration"]["url"] == f"{public}/webhooks/mattermost/actions"
            status, _ = await mm.press(question["id"], 1, user=BOB)
            assert status == 200
            (press,) = sink.messages
            assert (press.text, str(press.sender.id)) == ("/deny 7", BOB)
            assert press.thread_id == ThreadId(root["id"])
            assert press.chat_id == ChatId(TOWN)
            forged = {"command": "/approve 7", "signature": "0" * 64}
            status, _ = await mm.press(question["id"], 0, user=BOB, context=forged)
            unsigned = {"command": "/approve 7"}
            status2, _ = await mm.press(question["id"], 0, user=BOB, context=unsigned)
            assert (status, status2) == (403, 403)
            assert len(sink.accepting) == 1
        finally:
            await runner.cleanup()
    plain = adapter_for(mm, tmp_path, public_url=None, action_secret=None)
    async with plain:
        await plain.send(chunk(DM, "Approval needed #8", buttons=buttons))
    assert "attachments" not in mm.posted[-1]["props"]


async def test_a_slash_command_with_its_token(mm: FakeMattermostServer, tmp_path: Path) -> None:
    sink = ListSink()
    form = {
        "channel_id": DM,
        "channel_name": "ann__herald",
        "command": "/herald",
        "response_url": "http://127.0.0.1:9/hooks/commands/x",
        "team_domain": "team",
        "team_id": "teamteamteamteamteamteam1a",
        "text": "approve 7",
        "token": COMMAND_TOKEN,
        "trigger_id": "trigger-1",
        "user_id": ANN,
        "user_name": "ann",
    }
    async with adapter_for(mm, tmp_path) as adapter:
        answer = await adapter.handle_webhook("command", {}, urlencode(form).encode(), sink)
        assert answer.status == 200
        assert json.loads(answer.body)["response_type"] == "ephemeral"
        (message,) = sink.messages
        assert (message.text, message.is_direct, str(message.sender.id)) == (
            "/approve 7",
            True,
            ANN,
        )
        wrong = await adapter.handle_webhook(
            "command", {}, urlencode({**form, "token": "nope"}).encode(), sink
        )
        assert wrong.status == 401
        assert len(sink.accepting) == 1


async def test_a_resend_after_a_crash_finds_the_post_already_made(
    mm: FakeMattermostServer, tmp_path: Path
) -> None:
    async with adapter_for(mm, tmp_path) as first:
        sent = await first.send(chunk(DM, "the answer", key="turn-9:0"))
    mm.forget_pending()  # the server's own window has passed: only Herald's look finds it
    async with adapter_for(mm, tmp_path) as second:
        again = await second.send(chunk(DM, "the answer", key="turn-9:0", recovered=True))
        fresh = await second.send(chunk(DM, "another", key="turn-9:1", recovered=True))
    assert again.platform_message_id == sent.platform_message_id
    assert mm.texts_in(DM) == ["the answer", "another"]
    assert fresh.platform_message_id != sent.platform_message_id
    async with adapter_for(mm, tmp_path) as third:  # not marked recovered: posted again
        await third.send(chunk(DM, "the answer", key="turn-9:0"))
    assert mm.texts_in(DM) == ["the answer", "another", "the answer"]


async def test_a_repeated_post_within_the_servers_window_is_one_post(
    mm: FakeMattermostServer, tmp_path: Path
) -> None:
    """The same chunk tried again (its answer lost) carries the same pending_post_id."""
    async with adapter_for(mm, tmp_path) as adapter:
        one = await adapter.send(chunk(DM, "once", key="turn-3:0"))
        two = await adapter.send(chunk(DM, "once", key="turn-3:0"))
    assert one.platform_message_id == two.platform_message_id
    assert mm.texts_in(DM) == ["once"]


async def test_a_refused_token(mm: FakeMattermostServer, tmp_path: Path) -> None:
    with pytest.raises(AuthError):
        async with adapter_for(mm, tmp_path, token="x" * 26):
            pass


async def test_an_accounts_buttons_post_to_its_own_webhook_name(
    mm: FakeMattermostServer, tmp_path: Path
) -> None:
    """With several Mattermost accounts, the supervisor names each one's webhook
    `mattermost:<account>`: its buttons post there, not to another account's path."""
    context = AdapterContext(tmp_path / "files", MemoryCheckpoints(), webhook="mattermost:ops")
    make = MATTERMOST_SPEC.factory(config(mm, public_url="https://herald.example"), context)
    async with make() as adapter:
        buttons = (Button("Approve", "/approve 3"), Button("Deny", "/deny 3"))
        await adapter.send(chunk(TOWN, "Approval needed #3", buttons=buttons))
    [question] = mm.posted
    urls = {a["integration"]["url"] for a in question["props"]["attachments"][0]["actions"]}
    assert urls == {"https://herald.example/webhooks/mattermost:ops/actions"}
