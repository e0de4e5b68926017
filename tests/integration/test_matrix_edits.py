"""Edits, reactions and voice replies on Matrix, the whole daemon against the run's real
Synapse (see tests/contract/harness.py's `MatrixHarness`): an `m.replace` of a waiting message
changes what is answered, one of an answered message is answered again, and Herald's own
streamed edits never come back; 👀 marks the message being answered and is redacted after; a
✅ on an approval question approves it (the asker's; another person's or a stranger's does
nothing); a voice note is answered by a voice message; an edit
whose replaced event cannot be read for now is read again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from nio import AsyncClient, UploadResponse

from gateway.contracts.errors import NotReady
from gateway.sessions.admission import EDIT_OF_ANSWERED
from gateway.store.inbox import Outcome
from gateway.store.outbox import Outbox
from tests.contract.harness import MatrixHarness, started
from tests.contract.test_adapters import daemon
from tests.fakes.llm import FakeLLM, Reply, last_user_text, you_said
from tests.fakes.matrix_people import join, open_room, say, say_content
from tests.fakes.matrix_proxy import Sent
from tests.fakes.sink import ListSink, receiving, run_until_error
from tests.fakes.speech import FakeSpeech
from tests.integration.button_rig import MCP, mcp_ready, responder, tool_runs
from tests.integration.inproc import Herald
from tests.integration.test_voice_replies import OGG, herald

pytestmark = pytest.mark.timeout(90)
WAIT = 30.0


async def edit(client: AsyncClient, room: str, event_id: str, text: str) -> str:
    """Replace the text of `event_id` as Element does (`m.replace` with `m.new_content`)."""
    new = {"msgtype": "m.text", "body": text}
    content = {
        "msgtype": "m.text",
        "body": f"* {text}",
        "m.new_content": new,
        "m.relates_to": {"rel_type": "m.replace", "event_id": event_id},
    }
    return await say_content(client, room, content)


async def react(client: AsyncClient, room: str, event_id: str, key: str) -> None:
    annotation = {"rel_type": "m.annotation", "event_id": event_id, "key": key}
    await client.room_send(room, "m.reaction", {"m.relates_to": annotation})


async def receipt(h: Herald, key: str) -> bool:
    """Whether Herald stored the receipt of its message (a person reacts to what they see)."""
    return await Outbox(h.store).sent_as("matrix", "default", key) is not None


def answers(harness: MatrixHarness, person: str) -> list[str]:
    """What Herald's messages to `person` read after its edits, acknowledgements left out."""
    return [t for t in harness.shown_to(person) if not t.startswith("⏳")]


def sent_in(harness: MatrixHarness, room: str, kind: str) -> list[Sent]:
    return [s for s in harness.proxy.sent if s.room == room and s.type == kind]


async def test_edits_of_a_waiting_and_an_answered_message(tmp_path: Path) -> None:
    gate = asyncio.Event()

    def answer(body: dict[str, Any]) -> Reply:
        if last_user_text(body) == "one":
            return Reply(text="answer one", gate=gate)
        return you_said(body)

    async with started("matrix") as harness, FakeLLM() as llm:
        assert isinstance(harness, MatrixHarness)
        llm.responder = answer
        ann = harness.people[0]
        room, client = harness.rooms[ann], harness.clients[ann]
        async with daemon(tmp_path, harness, llm, busy_mode="queue", stream_edits=True) as h:
            one = await say(client, room, "one")
            await llm.wait_for_requests(1, WAIT)
            # The message being answered carries 👀 while its turn runs.
            await harness.proxy.wait_for(lambda: bool(sent_in(harness, room, "m.reaction")), WAIT)
            [mark] = sent_in(harness, room, "m.reaction")
            assert mark.content["m.relates_to"] == {
                "rel_type": "m.annotation",
                "event_id": one,
                "key": "👀",
            }
            two = await say(client, room, "twp")
            await edit(client, room, two, "two")

            async def merged() -> bool:
                return any(r["outcome"] == Outcome.MERGED for r in await h.rows())

            await h.until(merged, WAIT)  # the waiting message took the edit's text
            gate.set()
            await harness.proxy.wait_for(lambda: len(answers(harness, ann)) >= 2, WAIT)
            await edit(client, room, one, "one, fixed")
            expected = [
                "answer one",
                "You said: two",
                f"You said: {EDIT_OF_ANSWERED} one, fixed",
            ]
            # The third answer streams: its first edits end with "…"; wait for the last one.
            await harness.proxy.wait_for(lambda: answers(harness, ann) == expected, WAIT)
            rows = await h.rows()
        assert answers(harness, ann) == expected
        assert harness.edits() > 0  # the answers streamed as edits of Herald's own messages
        # Herald's own messages and edits never came back in: four rows, all Ann's.
        assert len(rows) == 4
        assert {r["sender_id"] for r in rows} == {ann}
        # The working reaction was taken off again (a redaction of it).
        assert any(c[1] == f"done-{mark.event_id}" for c in harness.proxy.calls)


async def test_an_edit_whose_message_cannot_be_read_now_is_read_again(tmp_path: Path) -> None:
    """The homeserver fails to give the replaced event (503): the receive loop stops with
    NotReady before the batch's token is stored, and the next run reads the edit again."""
    async with started("matrix") as harness:
        assert isinstance(harness, MatrixHarness)
        ann = harness.people[0]
        room, client = harness.rooms[ann], harness.clients[ann]
        sink = ListSink()
        async with harness.adapter(tmp_path / "files") as adapter:
            async with receiving(adapter, sink):
                first = await say(client, room, "helo")
                await sink.until(lambda: "helo" in sink.texts)
            harness.proxy.fail_reads(1)
            await edit(client, room, first, "hello")
            with pytest.raises(NotReady, match="reading an edited event"):
                await run_until_error(adapter, sink)
            async with receiving(adapter, sink):
                await sink.until(lambda: "hello" in sink.texts)
        [edited] = [m for m in sink.messages if m.edit_of is not None]
        assert edited.edit_of == f"{room}:{first}"
        assert edited.platform_message_id.startswith(f"{room}:{first}:e")


async def test_a_first_batch_that_fails_is_read_again_in_full(tmp_path: Path) -> None:
    """No token stored yet and the first batch fails: the next run syncs in full again (nio
    would go on from the token of the batch it last saw, past the edit never stored)."""
    async with started("matrix") as harness:
        assert isinstance(harness, MatrixHarness)
        ann = harness.people[0]
        room, client = harness.rooms[ann], harness.clients[ann]
        first = await say(client, room, "helo")
        await edit(client, room, first, "hello")
        harness.proxy.fail_reads(1)
        sink = ListSink()
        async with harness.adapter(tmp_path / "files") as adapter:
            with pytest.raises(NotReady, match="reading an edited event"):
                await run_until_error(adapter, sink)
            async with receiving(adapter, sink):
                await sink.until(lambda: "hello" in sink.texts)
        assert [m.edit_of for m in sink.messages if m.text == "hello"] == [f"{room}:{first}"]


async def test_a_reaction_approves_a_tool_call_a_strangers_does_nothing(tmp_path: Path) -> None:
    async with started("matrix") as harness, FakeLLM() as llm:
        assert isinstance(harness, MatrixHarness)
        llm.responder = responder
        ann, bob = harness.people
        eve = harness.stranger
        client = harness.clients[ann]
        group = await open_room(client, [harness.bot.user_id, bob, eve], direct=False)
        await asyncio.gather(*(join(harness.clients[p], group) for p in (bob, eve)))
        async with daemon(
            tmp_path, harness, llm, extra={"mcp": MCP}, working_reaction="", pairing=False
        ) as h:
            await mcp_ready(h.url)
            await harness.proxy.wait_for(lambda: ("POST", "join", group) in harness.proxy.calls)
            mention = {
                "msgtype": "m.text",
                "body": "herald, run pid",
                "m.mentions": {"user_ids": [harness.bot.user_id]},
            }
            await say_content(client, group, mention)
            await harness.proxy.wait_for(
                lambda: any("Approval needed" in t for t in harness.proxy.texts_in(group)), WAIT
            )
            [question] = [
                s
                for s in sent_in(harness, group, "m.room.message")
                if "Approval needed" in s.content["body"]
            ]
            await h.until(lambda: receipt(h, f"{group}:{question.event_id}"), WAIT)

            await react(harness.clients[eve], group, question.event_id, "👍")
            await react(harness.clients[bob], group, question.event_id, "✅")  # not his to decide
            await react(client, group, question.event_id, "✅")
            await harness.proxy.wait_for(
                lambda: any(t.startswith("done:") for t in harness.proxy.texts_in(group)), WAIT
            )
            rows = await h.rows()
        [done] = [t for t in harness.proxy.texts_in(group) if t.startswith("done:")]
        assert f"[approved by matrix:{ann}]" in done  # Bob's came first and decided nothing
        assert not [t for t in harness.proxy.texts_in(group) if "Only the person who asked" in t]
        assert tool_runs(llm) == 1
        assert not sent_in(harness, group, "m.reaction")  # working_reaction: "" puts none
        assert not [r for r in rows if r["sender_id"] == eve]  # the stranger left no trace


async def test_a_voice_note_is_answered_by_a_voice_message(tmp_path: Path) -> None:
    async with started("matrix") as harness, FakeLLM() as llm, FakeSpeech() as speech:
        assert isinstance(harness, MatrixHarness)
        ann = harness.people[0]
        room, client = harness.rooms[ann], harness.clients[ann]
        llm.script(Reply(text="Spoken back to you."))
        async with herald(tmp_path, harness, llm, speech):
            uploaded, _ = await client.upload(
                lambda *_: OGG, content_type="audio/ogg", filename="v.ogg", filesize=len(OGG)
            )
            assert isinstance(uploaded, UploadResponse)
            note = {
                "msgtype": "m.audio",
                "body": "Voice message",
                "url": uploaded.content_uri,
                "info": {"mimetype": "audio/ogg", "size": len(OGG), "duration": 1000},
                "org.matrix.msc3245.voice": {},
            }
            await say_content(client, room, note)
            await harness.proxy.wait_for(lambda: len(harness.texts_to(ann)) >= 2, WAIT)
        assert speech.said == ["Spoken back to you."]
        [voice, text] = sent_in(harness, room, "m.room.message")
        assert text.content["body"] == "Spoken back to you."  # the words, after the audio
        content = voice.content
        assert (content["msgtype"], content["org.matrix.msc3245.voice"]) == ("m.audio", {})
        assert content["info"]["mimetype"] == "audio/ogg"
        assert "org.matrix.msc1767.audio" in content
        server, media = str(content["url"]).removeprefix("mxc://").split("/")
        async with httpx.AsyncClient() as http:
            got = await http.get(
                f"{harness.synapse.url}/_matrix/client/v1/media/download/{server}/{media}",
                headers={"Authorization": f"Bearer {harness.bot.access_token}"},
            )
        assert got.content.startswith(b"OggS")
        assert content["info"]["size"] == len(got.content)
