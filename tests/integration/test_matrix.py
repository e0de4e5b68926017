"""Matrix through the whole daemon on a real Synapse (see tests/contract/harness.py's
`MatrixHarness`): a group room joined on an allowed person's invite, answered only when the
bot is mentioned, with typing and read receipts; a thread answered in the thread; a reply
quoted to the agent; a stranger's invite declined; an encrypted room refused with a notice; a
picture both ways; Synapse's own rate limiter; the homeserver restarted under a running
daemon; reactions passed on as reactions."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from nio import RoomCreateResponse, RoomSendResponse

from adapters.matrix import PLATFORM
from adapters.matrix.adapter import MAX_CHUNK, MatrixAdapter
from adapters.matrix.config import MatrixConfig
from adapters.matrix.convert import E2E_REFUSAL
from gateway.access import Pairings
from gateway.contracts.adapter import Adapter
from gateway.contracts.errors import RateLimited
from gateway.contracts.ids import AccountId, ChatId
from gateway.contracts.messages import Attachment, Button, InboundMessage, OutboundMessage
from tests.contract.harness import MatrixHarness, started
from tests.contract.test_adapters import daemon
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.matrix_people import (
    open_direct_chat,
    open_room,
    person_client,
    say,
    say_content,
    say_file,
)
from tests.fakes.matrix_proxy import MatrixProxy
from tests.fakes.sink import ListSink, receiving
from tests.fakes.synapse import private_synapse
from tests.integration.inproc import running_daemon
from tests.integration.test_access import code_in

pytestmark = pytest.mark.timeout(90)
WAIT = 30.0


async def test_a_group_room_a_thread_and_a_reply(tmp_path: Path) -> None:
    async with started("matrix") as harness, FakeLLM() as llm:
        assert isinstance(harness, MatrixHarness)
        ann, bob = harness.people
        proxy = harness.proxy
        # No 👀: it is put first, and a turn this short may end before "typing…" would start.
        async with daemon(tmp_path, harness, llm, working_reaction="") as h:
            client = harness.clients[ann]
            group = await open_room(client, [harness.bot.user_id, bob], direct=False)
            # Herald joins on the invite of an allowed person.
            await proxy.wait_for(lambda: ("POST", "join", group) in proxy.calls, WAIT)
            await say(client, group, "just chatting among ourselves")
            mention = {
                "msgtype": "m.text",
                "body": "herald, what time is it?",
                "m.mentions": {"user_ids": [harness.bot.user_id]},
            }
            await say_content(client, group, mention)
            [answer] = await _texts(proxy, group, 1)
            assert answer.endswith("] herald, what time is it?")  # the sender's name first
            rows = await h.answered(1)
            assert [r["text"] for r in rows] == ["herald, what time is it?"]
            # The turn showed "typing…"; the messages taken in got read receipts.
            assert group in proxy.typing
            assert group in proxy.receipts

            # A thread is a session of its own, answered in the thread.
            root = await say(client, group, "a new topic")
            in_thread = {
                "msgtype": "m.text",
                "body": "in the thread",
                "m.relates_to": {"rel_type": "m.thread", "event_id": root},
                "m.mentions": {"user_ids": [harness.bot.user_id]},
            }
            await say_content(client, group, in_thread)
            await _texts(proxy, group, 2)
            sent = [s for s in proxy.sent if s.room == group][-1]
            assert sent.content["body"].endswith("] in the thread")
            assert sent.content["m.relates_to"]["rel_type"] == "m.thread"
            assert sent.content["m.relates_to"]["event_id"] == root
            [first, second] = (await h.answered(2))[:2]
            assert first["session_key"] != second["session_key"]

            # A reply carries the quoted text to the agent.
            dm = harness.rooms[ann]
            reply = {
                "msgtype": "m.text",
                "body": "> <@bob:herald.test> the earlier words\n\nand my answer",
                "m.relates_to": {"m.in_reply_to": {"event_id": root}},
            }
            await say_content(client, dm, reply)
            [quoted] = await _texts(proxy, dm, 1)
            assert quoted == "You said: [replying to: the earlier words]\nand my answer"


async def test_a_strangers_invite_is_declined(tmp_path: Path) -> None:
    async with started("matrix") as harness, FakeLLM() as llm:
        assert isinstance(harness, MatrixHarness)
        proxy = harness.proxy
        async with daemon(tmp_path, harness, llm):
            stranger = harness.clients[harness.stranger]
            room = await open_room(stranger, [harness.bot.user_id], direct=True)
            await proxy.wait_for(lambda: ("POST", "leave", room) in proxy.calls, WAIT)
            assert ("POST", "join", room) not in proxy.calls


async def until_sent(adapter: Adapter, message: OutboundMessage) -> None:
    """Send `message`, waiting out each `RateLimited` as the delivery worker does."""
    for _ in range(20):
        try:
            await adapter.send(message)
        except RateLimited as limited:
            await asyncio.sleep(limited.retry_after)
        else:
            return
    raise AssertionError("still rate limited after 20 tries")


async def _texts(proxy: MatrixProxy, room: str, count: int) -> list[str]:
    await proxy.wait_for(lambda: len(proxy.texts_in(room)) >= count, WAIT)
    return proxy.texts_in(room)


async def test_an_encrypted_room_is_refused_once_with_a_notice(tmp_path: Path) -> None:
    async with started("matrix") as harness, FakeLLM() as llm:
        assert isinstance(harness, MatrixHarness)
        ann = harness.people[0]
        proxy = harness.proxy
        client = harness.clients[ann]
        encryption = {
            "type": "m.room.encryption",
            "state_key": "",
            "content": {"algorithm": "m.megolm.v1.aes-sha2"},
        }
        made = await client.room_create(
            is_direct=True, invite=[harness.bot.user_id], initial_state=[encryption]
        )
        assert isinstance(made, RoomCreateResponse)
        room = str(made.room_id)
        ciphertext = {
            "algorithm": "m.megolm.v1.aes-sha2",
            "ciphertext": "AwgAEnB4cQ",
            "device_id": "ANNDEVICE",
            "sender_key": "c2VuZGVyLWtleQ",
            "session_id": "c2Vzc2lvbg",
        }
        async with daemon(tmp_path, harness, llm) as h:
            await proxy.wait_for(lambda: ("POST", "join", room) in proxy.calls, WAIT)
            # A plain message sent into the encrypted room (a raw client can) is not answered
            # in the clear either.
            await say(client, room, "plain words in an encrypted room")
            for _ in range(2):
                sent = await client.room_send(room, "m.room.encrypted", ciphertext)
                assert isinstance(sent, RoomSendResponse)
            await proxy.wait_for(lambda: bool(proxy.texts_in(room)), WAIT)
            # In a room without encryption an "encrypted" event (any client can send one) is
            # no reason to claim the room is encrypted; a plain message there is answered.
            sent = await client.room_send(harness.rooms[ann], "m.room.encrypted", ciphertext)
            assert isinstance(sent, RoomSendResponse)
            await say(harness.clients[ann], harness.rooms[ann], "and in plain text")
            await _texts(proxy, harness.rooms[ann], 1)
            assert await h.answered(1)
        assert proxy.texts_in(room) == [E2E_REFUSAL]
        assert E2E_REFUSAL not in proxy.texts_in(harness.rooms[ann])
        assert len(llm.requests) == 1


async def test_a_picture_both_ways(tmp_path: Path) -> None:
    """A picture from an allowed person is downloaded (the authenticated media API) and kept;
    a picture Herald sends is uploaded to the media repository and reads back the same."""
    picture = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
    async with started("matrix") as harness, FakeLLM() as llm:
        assert isinstance(harness, MatrixHarness)
        ann = harness.people[0]
        room = harness.rooms[ann]
        async with daemon(tmp_path, harness, llm) as h:
            await say_file(harness.clients[ann], room, picture, "p.png", "image/png")
            [row] = await h.answered(1)
            assert row["outcome"] == "answered"
            assert list((await h.kept_files()).values()) == [picture]
        path = tmp_path / "out.png"
        path.write_bytes(picture)
        outbound = OutboundMessage(
            platform=PLATFORM,
            account=AccountId("default"),
            chat_id=ChatId(room),
            text="",
            idempotency_key="picture",
            attachments=(Attachment(path, "image/png", len(picture), "out.png"),),
        )
        async with harness.adapter(tmp_path / "files") as adapter:
            receipt = await adapter.send(outbound)
        assert receipt.platform_message_id is not None
        [sent] = [s for s in harness.proxy.sent if s.content.get("msgtype") == "m.image"]
        assert sent.content["info"] == {"mimetype": "image/png", "size": len(picture)}
        server, media = str(sent.content["url"]).removeprefix("mxc://").split("/")
        async with httpx.AsyncClient() as http:
            got = await http.get(
                f"{harness.synapse.url}/_matrix/client/v1/media/download/{server}/{media}",
                headers={"Authorization": f"Bearer {harness.bot.access_token}"},
            )
        assert got.content == picture


async def test_synapses_own_rate_limit_is_rate_limited_with_its_retry_after(
    tmp_path: Path,
) -> None:
    """The bot's message rate set low through Synapse's admin API: the homeserver's own 429
    becomes `RateLimited` with its `retry_after_ms`, and the send goes after that wait."""
    async with started("matrix") as harness:
        assert isinstance(harness, MatrixHarness)
        admin = await harness.synapse.register("admin", admin=True)
        async with httpx.AsyncClient() as http:
            answer = await http.post(
                f"{harness.synapse.url}/_synapse/admin/v1/users/{harness.bot.user_id}"
                "/override_ratelimit",
                json={"messages_per_second": 1, "burst_count": 1},
                headers={"Authorization": f"Bearer {admin.access_token}"},
            )
            answer.raise_for_status()
        ann, bob = harness.people
        async with harness.adapter(tmp_path / "files") as adapter:
            # The bot's joins still count in Synapse's bucket: this send may wait for them.
            await until_sent(adapter, harness.outbound(adapter, ann, "first"))
            with pytest.raises(RateLimited) as caught:
                await adapter.send(harness.outbound(adapter, bob, "too soon"))
            assert 0 < caught.value.retry_after <= 5
            await asyncio.sleep(caught.value.retry_after)
            await until_sent(adapter, harness.outbound(adapter, bob, "after the wait"))
        assert (429, harness.rooms[bob]) in harness.proxy.refused
        assert harness.texts_to(bob) == ["after the wait"]


async def test_the_homeserver_restarted_mid_conversation(tmp_path: Path) -> None:
    """Synapse stopped and started again under a running daemon: the adapter reconnects, and
    the conversation goes on with nothing lost and nothing answered twice."""
    async with (
        private_synapse(tmp_path / "synapse") as hs,
        MatrixProxy(hs.url) as proxy,
        FakeLLM() as llm,
    ):
        bot = await hs.server.register("herald")
        ann = await hs.server.register("ann")
        async with person_client(hs.url, ann) as client, person_client(hs.url, bot) as bots:
            room = await open_direct_chat(client, bots, bot.user_id)
        section = {
            "homeserver": proxy.url,
            "user_id": bot.user_id,
            "access_token": bot.access_token,
            "allowed_users": [ann.user_id],
            "stream_edits": False,
            "min_send_interval": 0,
            "sync_timeout": 2,
        }
        async with running_daemon(tmp_path / "herald", llm, "matrix", section) as h:
            async with person_client(hs.url, ann) as client:
                await say(client, room, "before")
            await _texts(proxy, room, 1)
            await hs.stop()
            await hs.start()
            async with person_client(hs.url, ann) as client:
                await say(client, room, "after")
            texts = await _texts(proxy, room, 2)
            rows = await h.answered(2)
        assert texts == ["You said: before", "You said: after"]
        assert [r["outcome"] for r in rows] == ["answered", "answered"]
        assert len(llm.requests) == 2


async def test_a_reaction_reaches_the_gateway_as_a_reaction(tmp_path: Path) -> None:
    """Buttons (an approval's) are offered as reactions; every reaction by someone else comes
    to the sink as a `Reaction` naming the event it is on (the gateway judges what it means:
    `tests/integration/test_matrix_edits.py` approves through it); the bot's own do not."""
    async with started("matrix") as harness:
        assert isinstance(harness, MatrixHarness)
        ann = harness.people[0]
        room = harness.rooms[ann]
        client = harness.clients[ann]
        sink = ListSink()
        async with harness.adapter(tmp_path / "files") as adapter:
            question = replace(
                harness.outbound(adapter, ann, "Run `rm -rf build`?"),
                buttons=(Button("✅ Approve", "/approve 7"), Button("❌ Deny", "/deny 7")),
            )
            asked = await adapter.send(question)
            assert asked.platform_message_id is not None
            [_, event] = asked.platform_message_id.rsplit(":", 1)
            [sent] = [s for s in harness.proxy.sent if s.event_id == event]
            assert "React ✅ Approve, ❌ Deny" in sent.content["body"]
            plain = await say(client, room, "an ordinary message")
            async with receiving(adapter, sink):
                assert isinstance(adapter, MatrixAdapter)
                await adapter.working(ChatId(room), asked.platform_message_id)  # the bot's own
                for target, key in ((plain, "👀"), (event, "✅")):
                    annotation = {"rel_type": "m.annotation", "event_id": target, "key": key}
                    await client.room_send(room, "m.reaction", {"m.relates_to": annotation})
                await sink.until(lambda: len(sink.reactions) == 2)
        assert sink.texts == ["an ordinary message"]
        assert [(r.message, r.emoji) for r in sink.reactions] == [
            (f"{room}:{plain}", "👀"),
            (asked.platform_message_id, "✅"),
        ]
        assert {r.sender.id for r in sink.reactions} == {ann}


class ScreeningListSink(ListSink):
    """A sink that allows only `allowed` (as the inbox's access decision would)."""

    def __init__(self, allowed: set[str]) -> None:
        super().__init__()
        self.allowed = allowed

    async def may_fetch(self, message: InboundMessage) -> bool:
        return str(message.sender.id) in self.allowed


async def test_a_strangers_invite_is_left_pending_when_configured(tmp_path: Path) -> None:
    """`invites: pending`: a stranger's invite is neither joined nor declined; an allowed
    person's is joined; once the stranger is allowed (paired) their pending invite is joined
    (inviting again changes nothing on the homeserver, so Herald must look again itself)."""
    async with started("matrix") as harness:
        assert isinstance(harness, MatrixHarness)
        proxy = harness.proxy
        ann = harness.people[0]
        section = {**harness.section(0), "invites": "pending"}
        adapter = MatrixAdapter(
            MatrixConfig.model_validate(section), tmp_path / "files", harness.checkpoints
        )
        sink = ScreeningListSink({ann})
        async with adapter, receiving(adapter, sink):
            strangers = await open_room(
                harness.clients[harness.stranger], [harness.bot.user_id], direct=True
            )
            anns = await open_room(harness.clients[ann], [harness.bot.user_id], direct=False)
            await proxy.wait_for(lambda: ("POST", "join", anns) in proxy.calls, WAIT)
            await say(harness.clients[ann], anns, "after the invites")
            await sink.until(lambda: "after the invites" in sink.texts)
            assert not [c for c in proxy.calls if c[2] == strangers and c[1] in ("join", "leave")]
            sink.allowed.add(harness.stranger)
            await say(harness.clients[ann], anns, "the stranger is paired now")
            await proxy.wait_for(lambda: ("POST", "join", strangers) in proxy.calls, WAIT)


async def test_a_long_answer_streams_then_goes_in_chunks(tmp_path: Path) -> None:
    """A long answer with `stream_edits`: a preview edited in place as the model writes, and
    in the end the whole answer, each message within the limit, nothing dropped."""
    words = [f"word{i}" for i in range(1000)]  # about 7,900 characters: two messages
    async with started("matrix") as harness, FakeLLM() as llm:
        assert isinstance(harness, MatrixHarness)
        llm.responder = lambda body: Reply(text=" ".join(words), chunk_delay=0.001)
        ann = harness.people[0]
        room = harness.rooms[ann]
        async with daemon(tmp_path, harness, llm, stream_edits=True, min_edit_interval=0.2) as h:
            await say(harness.clients[ann], room, "tell me everything")
            await harness.proxy.wait_for(
                lambda: [w for t in harness.shown_to(ann) for w in t.split()] == words, WAIT
            )
            [row] = await h.answered(1)
        assert row["outcome"] == "answered"
        shown = harness.shown_to(ann)
        assert harness.edits() > 0
        assert len(shown) >= 2
        assert max(len(t) for t in shown) <= MAX_CHUNK


async def test_pairing_a_stranger_and_an_operator_by_matrix_id(tmp_path: Path) -> None:
    """A stranger's direct message gets a pairing code; once approved, their next message is
    answered. An operator is named by Matrix id (`matrix:@ann:server`)."""
    async with started("matrix") as harness, FakeLLM() as llm:
        assert isinstance(harness, MatrixHarness)
        eve = harness.stranger
        room = harness.rooms[eve]
        extra = {"access": {"operators": [f"matrix:{harness.people[0]}"]}}
        async with daemon(tmp_path, harness, llm, extra=extra) as h:
            assert h.config.access.operators == (f"matrix:{harness.people[0]}",)
            await say(harness.clients[eve], room, "let me in")
            [reply] = await _texts(harness.proxy, room, 1)
            code = code_in(reply)
            await Pairings(h.store).approve_and_tell(code)
            await _texts(harness.proxy, room, 2)
            await say(harness.clients[eve], room, "thanks")
            texts = await _texts(harness.proxy, room, 3)
        assert texts[-1] == "You said: thanks"
        assert len(llm.requests) == 1


async def test_the_gap_after_a_restart_is_read_nothing_skipped_nothing_twice(
    tmp_path: Path,
) -> None:
    """More messages arrive while the adapter is away than one `/sync` batch holds (the
    homeserver cuts the timeline short): the gap is read through `/messages` from the stored
    token, so every message arrives once, in order."""
    async with started("matrix") as harness:
        assert isinstance(harness, MatrixHarness)
        ann = harness.people[0]
        room, client = harness.rooms[ann], harness.clients[ann]
        config = MatrixConfig.model_validate(harness.section(0))
        sink = ListSink()
        first = MatrixAdapter(config, tmp_path / "files", harness.checkpoints, timeline_limit=3)
        async with first, receiving(first, sink):
            before = await say(client, room, "before")
            await harness.wait_acknowledged(before)  # its batch's token is stored
        away = [f"while away {n}" for n in range(10)]
        for text in away:
            await say(client, room, text)
        again = MatrixAdapter(config, tmp_path / "files", harness.checkpoints, timeline_limit=3)
        async with again, receiving(again, sink):
            await sink.until(lambda: len(sink.texts) >= 1 + len(away))
            await say(client, room, "after")
            await sink.until(lambda: "after" in sink.texts)
        assert sink.texts == ["before", *away, "after"]
        assert ("GET", "messages", room) in harness.proxy.calls  # the gap was read


async def test_a_since_token_the_homeserver_refuses_starts_a_full_sync(tmp_path: Path) -> None:
    """A stored token the homeserver calls invalid (a database restored next to another
    server, a move to another homeserver) would fail every /sync for ever: it is dropped and
    a full sync starts again (the inbox answers each event once)."""
    async with started("matrix") as harness:
        assert isinstance(harness, MatrixHarness)
        ann = harness.people[0]
        room, client = harness.rooms[ann], harness.clients[ann]
        await harness.checkpoints.set("since", "not-a-token")
        config = MatrixConfig.model_validate(harness.section(0))
        sink = ListSink()
        adapter = MatrixAdapter(config, tmp_path / "files", harness.checkpoints)
        async with adapter, receiving(adapter, sink):
            await say(client, room, "after a bad token")
            await sink.until(lambda: "after a bad token" in sink.texts)
            # The batch's token is stored just after its events are accepted.
            async with asyncio.timeout(WAIT):
                while await harness.checkpoints.get("since") == "not-a-token":
                    await asyncio.sleep(0.05)


async def test_the_e2e_notice_is_tried_again_after_a_429(tmp_path: Path) -> None:
    """A notice the homeserver rate-limited is not marked as told: the next encrypted message
    tries again (the same transaction id, so never twice)."""
    async with started("matrix") as harness:
        assert isinstance(harness, MatrixHarness)
        ann = harness.people[0]
        client, proxy = harness.clients[ann], harness.proxy
        encryption = {
            "type": "m.room.encryption",
            "state_key": "",
            "content": {"algorithm": "m.megolm.v1.aes-sha2"},
        }
        made = await client.room_create(
            is_direct=True, invite=[harness.bot.user_id], initial_state=[encryption]
        )
        assert isinstance(made, RoomCreateResponse)
        room = str(made.room_id)
        proxy.rate_limit(room, 0.05)
        config = MatrixConfig.model_validate(harness.section(0))
        sink = ScreeningListSink({ann})
        adapter = MatrixAdapter(config, tmp_path / "files", harness.checkpoints)
        async with adapter, receiving(adapter, sink):
            await proxy.wait_for(lambda: ("POST", "join", room) in proxy.calls, WAIT)
            await say(client, room, "first")
            await proxy.wait_for(lambda: not proxy.still_limited(room), WAIT)
            await say(client, room, "second")
            await proxy.wait_for(lambda: bool(proxy.texts_in(room)), WAIT)
        assert proxy.texts_in(room) == [E2E_REFUSAL]
        assert sink.texts == []
