"""A first pass over the message path: one message in, one reply out."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.store import Store
from gateway.store.inbox import Outcome
from tests.fakes.platform import inbound
from tests.integration.rig import outcomes, running_rig

pytestmark = pytest.mark.timeout(60)


async def test_a_message_is_answered_and_delivered(store: Store, tmp_path: Path) -> None:
    async with running_rig(store, tmp_path, gated=False) as rig:
        await rig.manager.accept(inbound("hello", chat="c1"))
        delivered = await rig.adapter.wait_for(lambda d: len(d) >= 1)
        assert delivered[0].text == "answer to hello"
        rows = await rig.settled("test:acct:c1", 1)
        assert outcomes(rows) == [("hello", Outcome.ANSWERED)]


async def test_queue_mode_answers_each_in_order(store: Store, tmp_path: Path) -> None:
    async with running_rig(store, tmp_path) as rig:
        await rig.manager.accept(inbound("one", chat="c1"))
        await rig.llm.wait_started("one")
        await rig.manager.accept(inbound("two", chat="c1"))
        rig.llm.release("one", "two")
        await rig.settled("test:acct:c1", 2)
        await rig.adapter.wait_for(lambda d: len([x for x in d if x.key.startswith("s")]) >= 2)
        texts = [d.text for d in rig.adapter.delivered if d.chat_id == "c1"]
        assert texts[-2:] == ["answer to one", "answer to two"]
