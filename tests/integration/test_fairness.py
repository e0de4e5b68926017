"""Fairness under abuse: one allowed person flooding their chat cannot delay another person's
reply beyond a bound (the per-session queue cap refuses the overflow, and the turn slots go to
waiting sessions in turn), and a flood of strangers gets a bounded number of pairing replies
and no turns. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from agent_core.llm import Completion, TokenCallback
from gateway.config import AccessConfig, SessionsConfig
from gateway.contracts.config import PlatformSection
from gateway.contracts.history import ChatMessage
from gateway.contracts.ids import SessionKey
from gateway.store import Store
from gateway.store.inbox import Outcome
from gateway.store.tables import turns
from tests.fakes.platform import GatedLLM, inbound
from tests.integration.rig import running_rig

pytestmark = pytest.mark.timeout(90)

TURN = 0.1
"""Seconds the model takes for every call."""
FLOOD = 150
CAP = 30


class SlowLLM(GatedLLM):
    """Answers `answer to <text>` after `TURN` seconds, every call; `begun` lists the texts
    in the order their calls began (before the wait, unlike `started`)."""

    def __init__(self) -> None:
        super().__init__(gated=False)
        self.begun: list[str] = []

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[Mapping[str, Any]] = (),
        on_token: TokenCallback | None = None,
    ) -> Completion:
        self.begun.append(messages[-1].content if messages else "")
        await asyncio.sleep(TURN)
        return await super().complete(messages, tools=tools, on_token=on_token)


async def test_a_flooding_person_cannot_hold_up_another_persons_reply(
    store: Store, tmp_path: Path
) -> None:
    # One turn slot for everyone: the strictest case for fairness between sessions.
    sessions = SessionsConfig(
        debounce_seconds=0,
        ack_interval=30,
        drain_timeout=0.5,
        queue_cap=CAP,
        max_concurrent_turns=1,
    )
    llm = SlowLLM()
    async with running_rig(store, tmp_path, sessions=sessions, llm=llm) as rig:

        async def flood() -> None:
            for n in range(FLOOD):
                await rig.manager.accept(inbound(f"flood {n}", chat="flooder"))

        flooding = asyncio.create_task(flood())
        # Bob writes when the flooder's queue is full and the flood goes on.
        await rig.wait_rows("test:acct:flooder", lambda rows: len(rows) >= CAP + 10)

        # Counted in model calls begun, not in answers delivered: delivery runs behind the
        # turns by however much the outbox lags on a loaded machine.
        begun_before = len(llm.begun)
        await rig.manager.accept(inbound("hello", chat="bob"))
        await rig.adapter.wait_for(lambda d: any(x.chat_id == "bob" for x in d), timeout=30)
        order = llm.begun[begun_before:]
        waited_for = order.index("hello")
        await flooding
        await rig.manager.accept(inbound("/stop", chat="flooder"))  # and the queue goes

        # The flooder's backlog alone is CAP turns; Bob's turn began after at most one more of
        # the flooder's (taken while his message was being stored), never after the queue:
        # counted in turns, not seconds.
        assert waited_for <= 1, f"bob waited for {waited_for} of the flooder's answers: {order}"
        bob = [d for d in rig.adapter.delivered if d.chat_id == "bob"]
        assert [d.text for d in bob] == ["answer to hello"]

        # Every flooded message has one outcome: answered in turn, refused as overflow, or
        # cleared by the flooder's /stop.
        key = SessionKey("test:acct:flooder")
        async with asyncio.timeout(60):
            while True:
                rows = await rig.inbox.for_session(key, limit=FLOOD + 1)
                if all(r.outcome for r in rows):
                    break
                await asyncio.sleep(0.05)
        rows = [r for r in rows if r.text != "/stop"]
        assert len(rows) == FLOOD
        answered = [r for r in rows if r.outcome is Outcome.ANSWERED]
        dropped = [r for r in rows if r.outcome is Outcome.DROPPED]
        assert len(answered) + len(dropped) == FLOOD
        details = Counter(r.outcome_detail for r in dropped)
        assert set(details) <= {"queue full", "cleared by /stop", "stopped by /stop"}, details
        assert details["queue full"] > 0  # the cap refused the overflow
        # The overflow was told, but not once per refused message: the notices to the flooder
        # are rate-limited like the busy acknowledgements.
        await rig.idle(timeout=60)
        notices = [
            d
            for d in rig.adapter.delivered
            if d.chat_id == "flooder" and not d.text.startswith("answer to")
        ]
        assert any("Not queued" in d.text for d in notices)
        assert len(notices) <= 4, [d.text for d in notices]


async def test_a_flood_of_strangers_gets_bounded_pairing_replies_and_no_turns(
    store: Store, tmp_path: Path
) -> None:
    section = PlatformSection(account="acct", allowed_users=("alice",))
    access = AccessConfig(max_pending_pairings=3, pairing_reply_interval=600)
    strangers = 60
    async with running_rig(store, tmp_path, section=section, access=access, llm=SlowLLM()) as rig:
        for n in range(strangers):
            for attempt in range(2):
                await rig.manager.accept(inbound(f"let me in {attempt}", chat=f"s{n}"))
        await rig.manager.accept(inbound("hello", chat="alice"))
        await rig.adapter.wait_for(lambda d: any(x.chat_id == "alice" for x in d), timeout=30)
        await rig.idle()
        # Let every notice that was queued go out before counting.
        async with asyncio.timeout(30):
            while (await rig.outbox.counts()).keys() - {"sent"}:
                await asyncio.sleep(0.02)

        replies = [d for d in rig.adapter.delivered if d.chat_id != "alice"]
        # Codes for the first three, a "try again later" to at most as many more; then silence.
        assert 3 <= len(replies) <= 2 * access.max_pending_pairings, len(replies)
        assert [d.text for d in rig.adapter.delivered if d.chat_id == "alice"] == [
            "answer to hello"
        ]
        # No stranger's message became a turn: the only model call was Alice's.
        assert rig.llm.started == ["hello"]
        async with store.read() as conn:
            assert await conn.scalar(select(func.count()).select_from(turns)) == 1
        for n in range(strangers):
            rows = await rig.rows(f"test:acct:s{n}")
            assert [r.outcome for r in rows] == [Outcome.REJECTED] * 2
