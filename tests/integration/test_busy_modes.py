"""Busy sessions through the real session manager and store (SQLite and PostgreSQL).

Each busy mode (queue, collect, steer, interrupt), busy-time acknowledgements, the queue cap,
duplicate inbound deliveries and restarts. The LLM is gated per user text, so a turn stays
"busy" exactly as long as a test needs; nothing here waits on the wall clock to make
something happen.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from sqlalchemy import select

from gateway.config import SessionsConfig
from gateway.contracts.config import BusyMode
from gateway.contracts.history import ChatMessage, Role
from gateway.contracts.ids import SessionKey
from gateway.sessions import ACKS, INTERRUPTED_BY_NEWER
from gateway.store import Store
from gateway.store import inbox as inbox_sql
from gateway.store.inbox import InboxRow, Outcome, Status
from gateway.store.tables import sessions as sessions_table
from gateway.store.tables import turns as turns_table
from tests.fakes.platform import Delivered, inbound
from tests.integration.rig import Rig, outcomes, running_rig

pytestmark = pytest.mark.timeout(60)

KEY = "test:acct:c1"
REPLY_KEY = re.compile(r"s\d+:t(\d+):c\d+")


# helpers ---------------------------------------------------------------------------------------


def busy_config(
    mode: BusyMode = BusyMode.QUEUE,
    *,
    debounce: float = 0.0,
    ack_interval: float = 0.0,
    queue_cap: int = 20,
) -> SessionsConfig:
    """Sessions config for these tests: short drain, acks per message unless told otherwise."""
    return SessionsConfig(
        busy_mode=mode,
        debounce_seconds=debounce,
        ack_interval=ack_interval,
        queue_cap=queue_cap,
        drain_timeout=0.5,
    )


def is_reply(d: Delivered) -> bool:
    """A chunk of a turn's answer (not an ack, notice or command reply)."""
    return REPLY_KEY.fullmatch(d.key) is not None


def replies(rig: Rig, chat: str = "c1") -> list[str]:
    """The answers delivered to `chat`, in delivery order."""
    return [d.text for d in rig.adapter.delivered if d.chat_id == chat and is_reply(d)]


def reply_turns(rig: Rig) -> list[int]:
    """The turn id of every delivered answer chunk, in delivery order."""
    out: list[int] = []
    for d in rig.adapter.delivered:
        match = REPLY_KEY.fullmatch(d.key)
        if match:
            out.append(int(match.group(1)))
    return out


async def wait_replies(rig: Rig, n: int) -> list[str]:
    """Wait until `n` answer chunks have been delivered; return the answers."""
    await rig.adapter.wait_for(lambda d: sum(is_reply(x) for x in d) >= n)
    return replies(rig)


async def wait_key(rig: Rig, key: str) -> Delivered:
    """Wait for the delivery with that idempotency key."""
    delivered = await rig.adapter.wait_for(lambda d: any(x.key == key for x in d))
    return next(x for x in delivered if x.key == key)


async def flushed(rig: Rig, timeout: float = 10.0) -> None:
    """Wait until the outbox has nothing left to send."""
    async with asyncio.timeout(timeout):
        while True:
            counts = await rig.outbox.counts()
            if not counts.get("pending") and not counts.get("sending"):
                return
            await asyncio.sleep(0.01)


async def quiet(rig: Rig) -> None:
    """Wait until no lane is busy and everything queued for delivery was sent."""
    await rig.idle()
    await flushed(rig)


async def outbox_keys(rig: Rig) -> list[str]:
    """The idempotency keys of every outbox row, oldest first."""
    return [r.idempotency_key for r in reversed(await rig.outbox.list(limit=1000))]


async def entered_tool(rig: Rig, timeout: float = 10.0) -> None:
    """Wait until the turn is inside the gated `echo` tool (a tool boundary is next)."""
    async with asyncio.timeout(timeout):
        await rig.tool.entered.wait()


def by_text(rows: list[InboxRow]) -> dict[str, InboxRow]:
    """Rows keyed by their text (texts are unique within a test)."""
    return {r.text: r for r in rows}


def user_texts(messages: list[ChatMessage]) -> list[str]:
    """The user messages of a prompt or transcript, in order."""
    return [m.content for m in messages if m.role is Role.USER]


def calls_answering(rig: Rig, text: str) -> list[list[ChatMessage]]:
    """The LLM calls whose last user message is `text`."""
    return [
        call
        for call in rig.llm.calls
        if next((m.content for m in reversed(call) if m.role is Role.USER), None) == text
    ]


async def turn_ids(store: Store, key: str = KEY) -> list[int]:
    """Every turn ever started for the session key (all epochs), in order."""
    async with store.read() as conn:
        result = await conn.execute(
            select(turns_table.c.id)
            .join(sessions_table, turns_table.c.session_id == sessions_table.c.id)
            .where(sessions_table.c.key == key)
            .order_by(turns_table.c.id)
        )
        return [int(r[0]) for r in result]


async def transcript(store: Store, key: str = KEY) -> list[ChatMessage]:
    """The transcript of the current session of `key`."""
    session = await store.get_session(key)
    assert session is not None
    return await store.transcript(session.id)


def recorded_outcomes(rig: Rig) -> int:
    """Outcomes the manager recorded (its metric), to check none was recorded twice."""
    total = 0.0
    for outcome in Outcome:
        value = rig.manager.metrics.registry.get_sample_value(
            "herald_message_outcomes_total", {"outcome": str(outcome)}
        )
        total += value or 0.0
    return int(total)


def assert_one_outcome_each(rows: list[InboxRow], rig: Rig | None = None) -> None:
    """Every accepted message is done with exactly one outcome (and counted once)."""
    unsettled = [(r.text, r.status, r.outcome) for r in rows if r.outcome is None]
    assert not unsettled, f"messages without an outcome: {unsettled}"
    assert all(r.status is Status.DONE for r in rows)
    if rig is not None:
        assert recorded_outcomes(rig) == len(rows)


# queue -----------------------------------------------------------------------------------------


async def test_queue_answers_each_busy_message_in_its_own_turn_in_order(
    store: Store, tmp_path: Path
) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config(BusyMode.QUEUE)) as rig:
        await rig.manager.accept(inbound("one"))
        await rig.llm.wait_started("one")
        await rig.manager.accept(inbound("two"))
        await rig.manager.accept(inbound("three"))

        # Opening the later gates first changes nothing: the queue is FIFO.
        rig.llm.release("three", "two")
        rig.llm.release("one")
        rows = await rig.settled(KEY, 3)
        assert await wait_replies(rig, 3) == ["answer to one", "answer to two", "answer to three"]

        assert outcomes(rows) == [
            ("one", Outcome.ANSWERED),
            ("two", Outcome.ANSWERED),
            ("three", Outcome.ANSWERED),
        ]
        turns = [r.turn_id for r in rows]
        assert len(set(turns)) == 3
        assert turns == sorted(turns, key=lambda t: t or 0)
        assert reply_turns(rig) == turns
        # Each turn saw only its own new message as the latest one.
        assert [user_texts(c)[-1] for c in rig.llm.calls] == ["one", "two", "three"]
        assert await turn_ids(store) == turns
        assert_one_outcome_each(rows, rig)


async def test_queue_acknowledges_each_busy_message_when_ack_interval_is_zero(
    store: Store, tmp_path: Path
) -> None:
    config = busy_config(BusyMode.QUEUE, ack_interval=0)
    async with running_rig(store, tmp_path, sessions=config) as rig:
        await rig.manager.accept(inbound("one"))
        await rig.llm.wait_started("one")
        await rig.manager.accept(inbound("two"))
        await rig.manager.accept(inbound("three"))
        rows = by_text(await rig.rows(KEY))

        for text in ("two", "three"):
            ack = await wait_key(rig, f"ack:{rows[text].id}")
            assert ack.text == ACKS[BusyMode.QUEUE]
        # No ack for a message that found the session idle.
        assert f"ack:{rows['one'].id}" not in await outbox_keys(rig)

        rig.llm.open_all()
        assert_one_outcome_each(await rig.settled(KEY, 3), rig)


async def test_queue_sends_at_most_one_ack_per_ack_interval(store: Store, tmp_path: Path) -> None:
    config = busy_config(BusyMode.QUEUE, ack_interval=3600)
    async with running_rig(store, tmp_path, sessions=config) as rig:
        await rig.manager.accept(inbound("one"))
        await rig.llm.wait_started("one")
        for text in ("two", "three", "four"):
            await rig.manager.accept(inbound(text))
        rows = by_text(await rig.rows(KEY))

        # The ack is written with the message, in the same transaction: the outbox is final.
        acks = [k for k in await outbox_keys(rig) if k.startswith("ack:")]
        assert acks == [f"ack:{rows['two'].id}"]

        rig.llm.open_all()
        rows_after = await rig.settled(KEY, 4)
        await wait_replies(rig, 4)
        await quiet(rig)
        assert [d.text for d in rig.adapter.delivered if d.key.startswith("ack:")] == [
            ACKS[BusyMode.QUEUE]
        ]
        assert_one_outcome_each(rows_after, rig)


async def test_ack_interval_holds_across_busy_periods_of_a_session(
    store: Store, tmp_path: Path
) -> None:
    """At most one ack per session per interval, even when the session was idle in between."""
    config = busy_config(BusyMode.QUEUE, ack_interval=3600)
    async with running_rig(store, tmp_path, sessions=config) as rig:
        await rig.manager.accept(inbound("one"))
        await rig.llm.wait_started("one")
        await rig.manager.accept(inbound("two"))
        rig.llm.release("one", "two")
        await rig.settled(KEY, 2)
        await rig.idle()

        # A second busy period, well within the hour.
        await rig.manager.accept(inbound("three"))
        await rig.llm.wait_started("three")
        await rig.manager.accept(inbound("four"))
        rows = by_text(await rig.rows(KEY))

        acks = [k for k in await outbox_keys(rig) if k.startswith("ack:")]
        assert acks == [f"ack:{rows['two'].id}"], (
            "a second busy-time ack was sent within ack_interval after the session went idle"
        )
        rig.llm.open_all()
        assert_one_outcome_each(await rig.settled(KEY, 4), rig)


@pytest.mark.parametrize("mode", [BusyMode.QUEUE, BusyMode.COLLECT])
async def test_queue_overflow_drops_the_message_and_tells_the_sender(
    store: Store, tmp_path: Path, mode: BusyMode
) -> None:
    config = busy_config(mode, queue_cap=2)
    async with running_rig(store, tmp_path, sessions=config) as rig:
        await rig.manager.accept(inbound("m0"))
        await rig.llm.wait_started("m0")
        await rig.manager.accept(inbound("m1"))
        await rig.manager.accept(inbound("m2"))
        await rig.manager.accept(inbound("m3"))  # the cap is 2 waiting messages

        rows = by_text(await rig.rows(KEY))
        m3 = rows["m3"]
        assert m3.outcome is Outcome.DROPPED
        assert m3.status is Status.DONE
        assert m3.outcome_detail is not None
        assert "queue full" in m3.outcome_detail
        assert m3.turn_id is None
        assert [rows[t].outcome for t in ("m1", "m2")] == [None, None]

        notice = await wait_key(rig, f"drop:{m3.id}")
        assert notice.chat_id == "c1"
        assert "Not queued" in notice.text
        assert "2 messages are already waiting" in notice.text
        # The overflowing message gets the notice instead of an ack.
        assert f"ack:{m3.id}" not in await outbox_keys(rig)

        rig.llm.open_all()
        settled = await rig.settled(KEY, 4)
        await quiet(rig)
        final = by_text(settled)
        assert final["m0"].outcome is Outcome.ANSWERED
        assert final["m1"].outcome is Outcome.ANSWERED
        second = Outcome.ANSWERED if mode is BusyMode.QUEUE else Outcome.MERGED
        assert final["m2"].outcome is second
        assert final["m3"].outcome is Outcome.DROPPED
        assert final["m3"].turn_id is None
        # The model never saw the dropped message, and no turn answered it.
        assert all("m3" not in user_texts(call) for call in rig.llm.calls)
        assert all("m3" not in text for text in replies(rig))
        assert len(await turn_ids(store)) == (3 if mode is BusyMode.QUEUE else 2)
        assert_one_outcome_each(settled, rig)


# collect ---------------------------------------------------------------------------------------


async def test_collect_merges_messages_sent_while_busy_into_one_next_turn(
    store: Store, tmp_path: Path
) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config(BusyMode.COLLECT)) as rig:
        await rig.manager.accept(inbound("first"))
        await rig.llm.wait_started("first")
        await rig.manager.accept(inbound("second"))
        await rig.manager.accept(inbound("third"))
        pending = by_text(await rig.rows(KEY))
        for text in ("second", "third"):
            ack = await wait_key(rig, f"ack:{pending[text].id}")
            assert ack.text == ACKS[BusyMode.COLLECT]

        # The merged turn's last user message is "third".
        rig.llm.release("first", "third")
        rows = by_text(await rig.settled(KEY, 3))
        assert await wait_replies(rig, 2) == ["answer to first", "answer to third"]

        first, second, third = rows["first"], rows["second"], rows["third"]
        assert first.outcome is Outcome.ANSWERED
        assert second.outcome is Outcome.ANSWERED
        assert third.outcome is Outcome.MERGED
        assert second.turn_id == third.turn_id
        assert second.turn_id != first.turn_id
        assert len(await turn_ids(store)) == 2

        # The model sees the collected messages as consecutive user messages, in one call.
        merged_calls = calls_answering(rig, "third")
        assert len(merged_calls) == 1
        tail = merged_calls[0][-2:]
        assert [(m.role, m.content) for m in tail] == [(Role.USER, "second"), (Role.USER, "third")]
        assert calls_answering(rig, "second") == []
        await quiet(rig)
        assert replies(rig) == ["answer to first", "answer to third"]
        assert_one_outcome_each(list(rows.values()), rig)


async def test_collect_debounce_merges_messages_sent_together_while_idle(
    store: Store, tmp_path: Path
) -> None:
    config = busy_config(BusyMode.COLLECT, debounce=1.0)
    async with running_rig(store, tmp_path, sessions=config, gated=False) as rig:
        texts = ["part a", "part b", "part c"]
        await asyncio.gather(*(rig.manager.accept(inbound(t)) for t in texts))

        rows = await rig.settled(KEY, 3)
        assert [r.outcome for r in rows] == [Outcome.ANSWERED, Outcome.MERGED, Outcome.MERGED]
        assert len({r.turn_id for r in rows}) == 1
        assert rows[0].turn_id is not None

        # One model call, with every message of the burst in it, in arrival order.
        assert len(rig.llm.calls) == 1
        in_order = [r.text for r in rows]
        assert sorted(in_order) == texts
        assert user_texts(rig.llm.calls[0])[-3:] == in_order
        assert await wait_replies(rig, 1) == [f"answer to {in_order[-1]}"]
        await quiet(rig)
        assert len(replies(rig)) == 1
        assert await turn_ids(store) == [rows[0].turn_id]
        # Idle-time messages are not busy-time ones: nobody needs an ack.
        assert not [d for d in rig.adapter.delivered if d.key.startswith("ack:")]
        assert_one_outcome_each(rows, rig)


# steer -----------------------------------------------------------------------------------------


async def test_steer_at_a_tool_boundary_joins_the_running_turn(
    store: Store, tmp_path: Path
) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config(BusyMode.STEER)) as rig:
        rig.llm.release("tool:look it up", "also mention the weather")
        await rig.manager.accept(inbound("tool:look it up"))
        await entered_tool(rig)  # the turn now waits inside the tool

        await rig.manager.accept(inbound("also mention the weather"))
        pending = by_text(await rig.rows(KEY))
        ack = await wait_key(rig, f"ack:{pending['also mention the weather'].id}")
        assert ack.text == ACKS[BusyMode.STEER]

        rig.tool.gate.set()  # tool boundary: the steer message is injected here
        rows = by_text(await rig.settled(KEY, 2))
        assert await wait_replies(rig, 1) == ["answer to also mention the weather"]

        head, steered = rows["tool:look it up"], rows["also mention the weather"]
        assert head.outcome is Outcome.ANSWERED
        assert steered.outcome is Outcome.STEERED
        assert steered.turn_id == head.turn_id
        assert await turn_ids(store) == [head.turn_id]

        # The turn made two model calls; the second has the steer text after the tool result.
        assert len(rig.llm.calls) == 2
        second = rig.llm.calls[1]
        assert second[-2].role is Role.TOOL
        assert (second[-1].role, second[-1].content) == (Role.USER, "also mention the weather")
        assert "also mention the weather" not in user_texts(rig.llm.calls[0])

        history = await transcript(store)
        assert [(m.role, m.content) for m in history if m.role is not Role.TOOL] == [
            (Role.USER, "tool:look it up"),
            (Role.ASSISTANT, ""),
            (Role.USER, "also mention the weather"),
            (Role.ASSISTANT, "answer to also mention the weather"),
        ]
        await quiet(rig)
        assert len(replies(rig)) == 1
        assert_one_outcome_each(list(rows.values()), rig)


async def test_steer_after_the_last_boundary_becomes_the_next_turn(
    store: Store, tmp_path: Path
) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config(BusyMode.STEER)) as rig:
        await rig.manager.accept(inbound("question"))
        await rig.llm.wait_started("question")  # the final answer is being written
        await rig.manager.accept(inbound("follow-up"))
        rig.llm.release("question", "follow-up")

        rows = by_text(await rig.settled(KEY, 2))
        assert await wait_replies(rig, 2) == ["answer to question", "answer to follow-up"]
        question, follow_up = rows["question"], rows["follow-up"]
        assert question.outcome is Outcome.ANSWERED
        assert follow_up.outcome is Outcome.ANSWERED
        assert follow_up.turn_id is not None
        assert question.turn_id is not None
        assert follow_up.turn_id > question.turn_id
        assert not follow_up.steer

        # The first turn never saw the follow-up; the second turn answered it.
        assert len(rig.llm.calls) == 2
        assert "follow-up" not in user_texts(rig.llm.calls[0])
        assert user_texts(rig.llm.calls[1])[-1] == "follow-up"
        history = await transcript(store)
        assert user_texts(history) == ["question", "follow-up"]
        assert_one_outcome_each(list(rows.values()), rig)


# interrupt -------------------------------------------------------------------------------------


async def test_interrupt_cancels_the_running_turn_and_answers_the_new_message(
    store: Store, tmp_path: Path
) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config(BusyMode.INTERRUPT)) as rig:
        await rig.manager.accept(inbound("old question"))
        await rig.llm.wait_started("old question")
        rig.llm.release("new question")
        await rig.manager.accept(inbound("new question"))

        rows = by_text(await rig.settled(KEY, 2))
        old, new = rows["old question"], rows["new question"]
        assert old.outcome is Outcome.DROPPED
        assert old.outcome_detail is not None
        assert "interrupted" in old.outcome_detail
        assert old.turn_id is not None
        assert await store.turn_status(old.turn_id) == "interrupted"
        assert new.outcome is Outcome.ANSWERED
        assert new.turn_id is not None
        assert new.turn_id != old.turn_id
        ack = await wait_key(rig, f"ack:{new.id}")
        assert ack.text == ACKS[BusyMode.INTERRUPT]

        assert await wait_replies(rig, 1) == ["answer to new question"]
        # Opening the old gate now must not bring the stale answer back.
        rig.llm.release("old question")
        await quiet(rig)
        assert replies(rig) == ["answer to new question"]
        assert old.turn_id not in reply_turns(rig)
        assert all(r.turn_id != old.turn_id for r in await rig.outbox.list(limit=1000))
        assert len(calls_answering(rig, "old question")) == 1

        # The partial output of the cancelled turn stays in history, marked interrupted.
        history = await transcript(store)
        assert [(m.role, m.content, m.interrupted) for m in history] == [
            (Role.USER, "old question", False),
            (Role.ASSISTANT, "thinking ", True),
            (Role.USER, "new question", False),
            (Role.ASSISTANT, "answer to new question", False),
        ]
        assert_one_outcome_each(list(rows.values()), rig)


async def test_interrupt_inside_a_tool_call_cancels_it_and_answers_the_new_message(
    store: Store, tmp_path: Path
) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config(BusyMode.INTERRUPT)) as rig:
        rig.llm.release("tool:slow job", "never mind")
        await rig.manager.accept(inbound("tool:slow job"))
        await entered_tool(rig)
        await rig.manager.accept(inbound("never mind"))

        rows = by_text(await rig.settled(KEY, 2))
        old, new = rows["tool:slow job"], rows["never mind"]
        assert old.outcome is Outcome.DROPPED
        assert new.outcome is Outcome.ANSWERED
        assert old.turn_id is not None
        assert await store.turn_status(old.turn_id) == "interrupted"
        assert await wait_replies(rig, 1) == ["answer to never mind"]

        rig.tool.gate.set()  # the cancelled tool call cannot finish the old turn any more
        await quiet(rig)
        assert replies(rig) == ["answer to never mind"]
        # The next prompt has no tool call left without its result (an API would refuse it).
        prompt = calls_answering(rig, "never mind")[0]
        for i, message in enumerate(prompt):
            if message.role is Role.ASSISTANT and message.tool_calls:
                answered = {m.tool_call_id for m in prompt[i + 1 :] if m.role is Role.TOOL}
                assert {c.id for c in message.tool_calls} <= answered
        assert_one_outcome_each(list(rows.values()), rig)


# duplicate inbound delivery --------------------------------------------------------------------


async def test_duplicate_inbound_delivery_creates_one_row_and_one_turn(
    store: Store, tmp_path: Path
) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config(BusyMode.QUEUE)) as rig:
        first = inbound("one", message_id="dup-1")
        second = inbound("two", message_id="dup-2")
        # Delivered twice at the same moment, then again while the turn runs.
        await asyncio.gather(rig.manager.accept(first), rig.manager.accept(first))
        await rig.llm.wait_started("one")
        await rig.manager.accept(first)
        await asyncio.gather(rig.manager.accept(second), rig.manager.accept(second))
        await rig.manager.accept(second)

        rows = await rig.rows(KEY)
        assert [(r.text, r.platform_message_id) for r in rows] == [
            ("one", "dup-1"),
            ("two", "dup-2"),
        ]
        acks = [k for k in await outbox_keys(rig) if k.startswith("ack:")]
        assert acks == [f"ack:{rows[1].id}"]

        rig.llm.release("one", "two")
        settled = await rig.settled(KEY, 2)
        assert await wait_replies(rig, 2) == ["answer to one", "answer to two"]
        # And once more after it was answered: nothing happens.
        await rig.manager.accept(first)
        await rig.manager.accept(second)
        await quiet(rig)

        assert len(await rig.rows(KEY)) == 2
        assert len(await turn_ids(store)) == 2
        assert len(rig.llm.calls) == 2
        assert replies(rig) == ["answer to one", "answer to two"]
        assert user_texts(await transcript(store)) == ["one", "two"]
        assert_one_outcome_each(settled, rig)


async def test_duplicate_inbound_delivery_after_a_restart_is_ignored(
    store: Store, tmp_path: Path
) -> None:
    answered = inbound("answered before", message_id="r-1")
    waiting = inbound("waiting at the stop", message_id="r-2")
    config = busy_config(BusyMode.QUEUE)
    async with running_rig(store, tmp_path, sessions=config) as rig:
        await rig.manager.accept(answered)
        await rig.llm.wait_started("answered before")
        await rig.manager.accept(waiting)
        rig.llm.release("answered before")
        await rig.manager.drain(10)  # the running turn finishes; the queued one waits
        assert await wait_replies(rig, 1) == ["answer to answered before"]
        await flushed(rig)  # marked sent: a chunk still "sending" at a stop is resent
        rows = by_text(await rig.rows(KEY))
        assert rows["waiting at the stop"].outcome is None

    async with running_rig(store, tmp_path, sessions=config, gated=False) as rig:
        # The platform redelivers both (it never saw an acknowledgement it trusted).
        await rig.manager.accept(answered)
        await rig.manager.accept(waiting)
        rows_after = await rig.settled(KEY, 2)
        await wait_replies(rig, 1)
        await quiet(rig)

        assert [r.platform_message_id for r in rows_after] == ["r-1", "r-2"]
        assert replies(rig) == ["answer to waiting at the stop"]
        assert len(rig.llm.calls) == 1
        assert len(await turn_ids(store)) == 2
        assert user_texts(await transcript(store)) == ["answered before", "waiting at the stop"]
        assert_one_outcome_each(rows_after)


# restart ---------------------------------------------------------------------------------------


async def test_messages_queued_at_shutdown_are_answered_in_order_after_a_restart(
    store: Store, tmp_path: Path
) -> None:
    config = busy_config(BusyMode.QUEUE)
    async with running_rig(store, tmp_path, sessions=config) as rig:
        await rig.manager.accept(inbound("one"))
        await rig.llm.wait_started("one")
        await rig.manager.accept(inbound("two"))
        await rig.manager.accept(inbound("three"))
        rig.llm.release("one")
        await rig.manager.drain(10)  # stop accepting; "one" finishes, the queue waits
        assert await wait_replies(rig, 1) == ["answer to one"]
        await flushed(rig)  # marked sent: a chunk still "sending" at a stop is resent
        before = by_text(await rig.rows(KEY))
        assert before["one"].outcome is Outcome.ANSWERED
        assert [before[t].status for t in ("two", "three")] == [Status.PENDING] * 2
        assert rig.llm.started == ["one"]

    async with running_rig(store, tmp_path, sessions=config, gated=False) as rig:
        rows = await rig.settled(KEY, 3)
        assert await wait_replies(rig, 2) == ["answer to two", "answer to three"]
        assert outcomes(rows) == [
            ("one", Outcome.ANSWERED),
            ("two", Outcome.ANSWERED),
            ("three", Outcome.ANSWERED),
        ]
        assert len({r.turn_id for r in rows}) == 3
        assert user_texts(await transcript(store)) == ["one", "two", "three"]
        await quiet(rig)
        assert replies(rig) == ["answer to two", "answer to three"]
        assert_one_outcome_each(rows)


async def test_a_turn_cut_off_by_the_drain_is_answered_after_restart_without_a_second_copy(
    store: Store, tmp_path: Path
) -> None:
    config = busy_config(BusyMode.QUEUE)
    async with running_rig(store, tmp_path, sessions=config) as rig:
        await rig.manager.accept(inbound("one"))
        await rig.llm.wait_started("one")
        await rig.manager.accept(inbound("two"))
        await rig.manager.drain(0.05)  # "one" cannot finish: it is checkpointed
        rows = by_text(await rig.rows(KEY))
        cut = rows["one"]
        assert cut.status is Status.PENDING
        assert cut.outcome is None
        assert cut.turn_id is not None
        assert await store.turn_status(cut.turn_id) == "interrupted"
        assert rows["two"].status is Status.PENDING
        history = await transcript(store)
        assert [(m.role, m.content, m.interrupted) for m in history] == [
            (Role.USER, "one", False),
            (Role.ASSISTANT, "thinking ", True),
        ]
        await flushed(rig)
        assert replies(rig) == []

    async with running_rig(store, tmp_path, sessions=config, gated=False) as rig:
        settled = await rig.settled(KEY, 2)
        assert await wait_replies(rig, 2) == ["answer to one", "answer to two"]
        after = by_text(settled)
        assert after["one"].outcome is Outcome.ANSWERED
        assert after["one"].turn_id != cut.turn_id
        assert after["two"].outcome is Outcome.ANSWERED
        # The user message was stored once, by the turn that was cut off.
        assert user_texts(await transcript(store)) == ["one", "two"]
        assert user_texts(calls_answering(rig, "one")[0]) == ["one"]
        assert len(await turn_ids(store)) == 3  # the cut-off turn and two answers
        assert_one_outcome_each(settled)


async def test_an_interrupt_stored_before_a_stop_drops_the_turn_it_cut_off_after_restart(
    store: Store, tmp_path: Path
) -> None:
    """The process died after an interrupting message was stored but before the turn it
    interrupted was settled: after the restart the interrupted message is dropped as the
    interrupt would have dropped it, and the newer one answered once (answering the old one
    after it found the newer message at the end of its history: answered twice)."""
    config = busy_config(BusyMode.INTERRUPT)
    async with running_rig(store, tmp_path, sessions=config) as rig:
        await rig.manager.accept(inbound("old question"))
        await rig.llm.wait_started("old question")
        await rig.manager.drain(0.05)  # cut off: pending again, in the history already
    async with store.write() as conn:  # stored with priority, as while the turn ran
        await inbox_sql.insert(
            conn, inbound("new question"), key=SessionKey(KEY), user_id=None, priority=1
        )

    async with running_rig(store, tmp_path, sessions=config, gated=False) as rig:
        rows = by_text(await rig.settled(KEY, 2))
        old, new = rows["old question"], rows["new question"]
        assert old.outcome is Outcome.DROPPED
        assert old.outcome_detail == INTERRUPTED_BY_NEWER
        assert new.outcome is Outcome.ANSWERED
        assert await wait_replies(rig, 1) == ["answer to new question"]
        await quiet(rig)
        assert replies(rig) == ["answer to new question"]
        assert user_texts(await transcript(store)) == ["old question", "new question"]
        assert_one_outcome_each(list(rows.values()))


async def test_a_steered_message_cut_off_by_the_drain_is_stored_once_after_restart(
    store: Store, tmp_path: Path
) -> None:
    config = busy_config(BusyMode.STEER)
    async with running_rig(store, tmp_path, sessions=config) as rig:
        rig.llm.release("tool:one")
        await rig.manager.accept(inbound("tool:one"))
        await entered_tool(rig)
        await rig.manager.accept(inbound("extra"))
        rig.tool.gate.set()
        await rig.llm.wait_started("extra")  # injected; the turn's next call is gated
        await rig.manager.drain(0.05)
        history = await transcript(store)
        assert user_texts(history) == ["tool:one", "extra"]
        assert all(r.outcome is None for r in await rig.rows(KEY))

    async with running_rig(store, tmp_path, sessions=config, gated=False) as rig:
        settled = await rig.settled(KEY, 2)
        await wait_replies(rig, 1)
        await quiet(rig)
        assert user_texts(await transcript(store)) == ["tool:one", "extra"], (
            "the steered message was stored a second time after the restart"
        )
        assert_one_outcome_each(settled)
