"""The steer buffer of a running turn: messages with files are made ready (a voice note
transcribed) when they are taken; one settled instead is not injected; a turn cancelled while
one is being made ready leaves it and the rest waiting (they go back to the queue)."""

from __future__ import annotations

import asyncio

import pytest

from agent_core.loop import Steered
from gateway.contracts.ids import InboxId
from gateway.sessions.state import Speaker, Steer

pytestmark = pytest.mark.timeout(10)

ANN = Speaker("test:ann", operator=True)


async def test_messages_with_files_are_prepared_and_settled_ones_left_out() -> None:
    asked: list[InboxId] = []

    async def prepare(row_id: InboxId, text: str) -> str | None:
        asked.append(row_id)
        return None if row_id == 2 else f"{text} [voice note v.ogg, transcribed]: hi"

    steer = Steer(prepare)
    steer.add(InboxId(1), "plain", speaker=ANN)
    steer.add(InboxId(2), "", speaker=ANN, files=True)
    steer.add(InboxId(3), "and", speaker=ANN, files=True)

    assert [s.text for s in await steer.take()] == [
        "plain",
        "and [voice note v.ogg, transcribed]: hi",
    ]
    assert asked == [2, 3]
    assert steer.taken == [1, 3]
    assert steer.waiting == []


async def test_cancelled_while_preparing_leaves_the_rest_waiting() -> None:
    started = asyncio.Event()

    async def prepare(row_id: InboxId, text: str) -> str | None:
        started.set()
        await asyncio.Event().wait()
        return text

    steer = Steer(prepare)
    steer.add(InboxId(1), "first", speaker=ANN)
    steer.add(InboxId(2), "voice", speaker=ANN, files=True)
    steer.add(InboxId(3), "after", speaker=ANN)
    task = asyncio.create_task(steer.take())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert steer.taken == [1]
    assert steer.waiting == [(2, "voice"), (3, "after")]


async def test_a_message_carries_its_writer_and_their_name_in_a_group() -> None:
    """Steered words join a turn as a batch's do: `[name]` in a group, and with who wrote
    them (the turn's rights are decided again from it)."""
    steer = Steer()
    steer.add(InboxId(1), "mine", speaker=ANN)
    steer.add(InboxId(2), "TOOL:x", speaker=Speaker("test:bob", operator=False, name="Bob"))

    assert await steer.take() == [
        Steered("mine", "test:ann", operator=True),
        Steered("[Bob] TOOL:x", "test:bob", operator=False),
    ]
