"""Matrix through the whole daemon on a real Synapse (see tests/contract/harness.py's
`MatrixHarness`): a group room joined on an allowed person's invite, answered only when the
bot is mentioned; a thread answered in the thread; a reply quoted to the agent; a stranger's
invite declined; an encrypted room refused with a notice."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.contract.harness import MatrixHarness, started
from tests.contract.test_adapters import daemon
from tests.fakes.llm import FakeLLM
from tests.fakes.matrix_people import open_room, say, say_content

pytestmark = pytest.mark.timeout(90)
WAIT = 30.0


async def test_a_group_room_a_thread_and_a_reply(tmp_path: Path) -> None:
    async with started("matrix") as harness, FakeLLM() as llm:
        assert isinstance(harness, MatrixHarness)
        ann, bob = harness.people
        proxy = harness.proxy
        async with daemon(tmp_path, harness, llm) as h:
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


async def _texts(proxy: object, room: str, count: int) -> list[str]:
    from tests.fakes.matrix_proxy import MatrixProxy

    assert isinstance(proxy, MatrixProxy)
    await proxy.wait_for(lambda: len(proxy.texts_in(room)) >= count, WAIT)
    return proxy.texts_in(room)
