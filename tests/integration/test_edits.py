"""Edited messages through the real session manager and store (SQLite and PostgreSQL): an
edit of a waiting message, of the message being answered in each busy mode, of an answered
one (answered, or ignored by config), and edits that must change nothing (someone else's,
a stranger's, a redelivery). The LLM is gated per user text, as in `test_busy_modes.py`.

Each platform's conversion of its edit event is tested on recorded payloads
(`tests/unit/test_*_convert.py`) and end to end through its fake (`test_*_edits.py`)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import select, text

from gateway.contracts.config import BusyMode, EditedMessages, EditRule, PlatformSection
from gateway.contracts.history import Role
from gateway.contracts.ids import ExternalUserId, PlatformMessageId, ThreadId
from gateway.contracts.messages import InboundMessage
from gateway.sessions.admission import EDIT_OF_ANSWERED, EDIT_OF_CURRENT
from gateway.store import Store
from gateway.store.inbox import Outcome
from gateway.store.tables import inbox
from tests.fakes.platform import inbound
from tests.integration.rig import running_rig
from tests.integration.test_busy_modes import (
    KEY,
    assert_one_outcome_each,
    busy_config,
    by_text,
    entered_tool,
    quiet,
    replies,
    transcript,
    wait_replies,
)

pytestmark = pytest.mark.timeout(60)


class EditSection(PlatformSection):
    """The fake platform's section with the edit key of chat platforms."""

    edited_messages: EditedMessages = EditRule.ANSWER


def edit(original: InboundMessage, text: str, n: int = 1, **changes: object) -> InboundMessage:
    """An edit of `original` as an adapter normalizes it."""
    key = PlatformMessageId(f"{original.platform_message_id}:e{n}")
    return replace(
        original,
        text=text,
        platform_message_id=key,
        edit_of=original.platform_message_id,
        **changes,  # type: ignore[arg-type]
    )


async def test_an_edit_of_a_waiting_message_replaces_its_text(store: Store, tmp_path: Path) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config(BusyMode.QUEUE)) as rig:
        await rig.manager.accept(inbound("one"))
        await rig.llm.wait_started("one")
        two = inbound("twp")
        await rig.manager.accept(two)
        await rig.manager.accept(edit(two, "two"))
        await rig.manager.accept(edit(two, "two"))  # a redelivery changes nothing
        rig.llm.release("one", "two")

        assert await wait_replies(rig, 2) == ["answer to one", "answer to two"]
        rows = {r.platform_message_id: r for r in await rig.settled(KEY, 3)}
        assert len(rows) == 3
        assert rows[two.platform_message_id].text == "two"
        assert rows[two.platform_message_id].outcome is Outcome.ANSWERED
        edited = rows[PlatformMessageId(f"{two.platform_message_id}:e1")]
        assert edited.outcome is Outcome.MERGED
        assert f"#{rows[two.platform_message_id].id}" in (edited.outcome_detail or "")
        history = await transcript(store)
        assert [m.content for m in history if m.role is Role.USER] == ["one", "two"]
        await quiet(rig)
        assert_one_outcome_each(list(rows.values()), rig)


async def test_an_edit_of_a_waiting_steer_message_is_steered_with_its_new_text(
    store: Store, tmp_path: Path
) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config(BusyMode.STEER)) as rig:
        rig.llm.release("tool:look", "and the weather")
        await rig.manager.accept(inbound("tool:look"))
        await entered_tool(rig)
        steer = inbound("and the waether")
        await rig.manager.accept(steer)
        await rig.manager.accept(edit(steer, "and the weather"))
        rig.tool.gate.set()

        assert await wait_replies(rig, 1) == ["answer to and the weather"]
        rows = {r.platform_message_id: r for r in await rig.settled(KEY, 3)}
        assert rows[steer.platform_message_id].outcome is Outcome.STEERED
        assert rows[steer.platform_message_id].text == "and the weather"


@pytest.mark.parametrize("mode", [BusyMode.STEER, BusyMode.INTERRUPT])
async def test_an_edit_of_the_message_being_answered_reaches_the_running_turn(
    store: Store, tmp_path: Path, mode: BusyMode
) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config(mode)) as rig:
        first = inbound("tool:what is 2+3")
        edited = f"{EDIT_OF_CURRENT} what is 2+2"
        rig.llm.release(first.text, edited)
        await rig.manager.accept(first)
        await entered_tool(rig)  # the turn waits inside a tool: a boundary is next
        await rig.manager.accept(edit(first, "what is 2+2"))
        rig.tool.gate.set()

        assert await wait_replies(rig, 1) == [f"answer to {edited}"]
        rows = by_text(await rig.settled(KEY, 2))
        if mode is BusyMode.STEER:  # the same turn takes the new text
            assert rows[first.text].outcome is Outcome.ANSWERED
            assert rows[edited].outcome is Outcome.STEERED
            assert rows[edited].turn_id == rows[first.text].turn_id
        else:  # the turn answering the old text stops; the edit is answered instead
            assert rows[first.text].outcome is Outcome.DROPPED
            assert rows[edited].outcome is Outcome.ANSWERED
        await quiet(rig)
        assert len([d for d in rig.adapter.delivered if d.text.startswith("answer")]) == 1


@pytest.mark.parametrize("mode", [BusyMode.QUEUE, BusyMode.COLLECT])
async def test_an_edit_of_the_message_being_answered_is_answered_next(
    store: Store, tmp_path: Path, mode: BusyMode
) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config(mode)) as rig:
        first = inbound("what is 2+3")
        await rig.manager.accept(first)
        await rig.llm.wait_started(first.text)
        await rig.manager.accept(edit(first, "what is 2+2"))
        edited = f"{EDIT_OF_CURRENT} what is 2+2"
        rig.llm.release(first.text, edited)

        assert await wait_replies(rig, 2) == [f"answer to {first.text}", f"answer to {edited}"]
        rows = by_text(await rig.settled(KEY, 2))
        assert rows[first.text].outcome is Outcome.ANSWERED
        assert rows[edited].outcome is Outcome.ANSWERED
        history = await transcript(store)
        assert [m.content for m in history if m.role is Role.USER] == [first.text, edited]


async def test_an_edit_of_an_answered_message_is_a_new_message_marked_as_an_edit(
    store: Store, tmp_path: Path
) -> None:
    section = EditSection(account="acct", allowed_users=("*",))
    async with running_rig(store, tmp_path, gated=False, section=section) as rig:
        first = inbound("capital of Austrlia?")
        await rig.manager.accept(first)
        await wait_replies(rig, 1)
        await rig.manager.accept(edit(first, "capital of Australia?"))
        edited = f"{EDIT_OF_ANSWERED} capital of Australia?"
        assert (await wait_replies(rig, 2))[1] == f"answer to {edited}"
        history = await transcript(store)
        assert [m.content for m in history if m.role is Role.USER] == [first.text, edited]


async def test_an_edit_of_an_answered_message_can_be_ignored(store: Store, tmp_path: Path) -> None:
    section = EditSection(account="acct", allowed_users=("*",), edited_messages=EditRule.IGNORE)
    async with running_rig(store, tmp_path, gated=False, section=section) as rig:
        first = inbound("hello")
        await rig.manager.accept(first)
        await wait_replies(rig, 1)
        await rig.manager.accept(edit(first, "hello there"))
        rows = await rig.settled(KEY, 2)
        assert rows[-1].outcome is Outcome.DROPPED
        assert "edited_messages: ignore" in (rows[-1].outcome_detail or "")
        await quiet(rig)
        assert len(await wait_replies(rig, 1)) == 1


def test_the_old_name_new_is_read_as_answer() -> None:
    section = EditSection.model_validate({"edited_messages": "new"})
    assert section.edited_messages is EditRule.ANSWER


async def test_an_edit_by_someone_else_or_a_stranger_changes_nothing(
    store: Store, tmp_path: Path
) -> None:
    section = EditSection(account="acct", allowed_users=("ann", "bob"), pairing=False)
    async with running_rig(
        store, tmp_path, sessions=busy_config(BusyMode.QUEUE), section=section
    ) as rig:
        await rig.manager.accept(inbound("one", chat="ann"))
        await rig.llm.wait_started("one")
        mine = inbound("mine", chat="ann")
        await rig.manager.accept(mine)
        # Bob claims Ann's message id; a stranger does too: neither changes her words.
        bob, eve = (
            replace(mine.sender, id=ExternalUserId("bob")),
            replace(mine.sender, id=ExternalUserId("eve")),
        )
        await rig.manager.accept(edit(mine, "bob's words", 1, sender=bob))
        await rig.manager.accept(edit(mine, "eve's words", 2, sender=eve))
        rig.llm.release("one", "mine")

        await wait_replies(rig, 2)
        assert replies(rig, "ann") == ["answer to one", "answer to mine"]
        await rig.settled("test:acct:ann", 2)
        by_id = {r.platform_message_id: r for r in await rig.inbox.recent(limit=10)}
        assert len(by_id) == 4
        key = mine.platform_message_id
        assert by_id[PlatformMessageId(f"{key}:e1")].outcome is Outcome.DROPPED
        assert by_id[PlatformMessageId(f"{key}:e2")].outcome is Outcome.REJECTED
        assert by_id[mine.platform_message_id].text == "mine"


async def test_an_edit_of_a_message_never_stored_is_a_new_message(
    store: Store, tmp_path: Path
) -> None:
    async with running_rig(store, tmp_path, gated=False) as rig:
        unseen = inbound("never stored")
        await rig.manager.accept(edit(unseen, "now it says this"))
        assert await wait_replies(rig, 1) == ["answer to now it says this"]


async def test_an_edit_is_words_never_a_command(store: Store, tmp_path: Path) -> None:
    async with running_rig(store, tmp_path, gated=False) as rig:
        first = inbound("hello")
        await rig.manager.accept(first)
        await wait_replies(rig, 1)
        await rig.manager.accept(edit(first, "/new"))
        assert (await wait_replies(rig, 2))[1] == f"answer to {EDIT_OF_ANSWERED} /new"


@pytest.mark.parametrize("mode", [BusyMode.QUEUE, BusyMode.STEER])
async def test_edits_of_the_message_being_answered_replace_each_other_while_they_wait(
    store: Store, tmp_path: Path, mode: BusyMode
) -> None:
    """A flood of edits of the message being answered is one edit, the newest: an edit of a
    message whose earlier edit still waits replaces that edit's text (no turn per version)."""
    async with running_rig(store, tmp_path, sessions=busy_config(mode)) as rig:
        first = inbound("tool:what is 2+3")
        versions = [f"{EDIT_OF_CURRENT} what is 2+{n}" for n in (1, 2, 4)]
        rig.llm.release(first.text, *versions)
        await rig.manager.accept(first)
        await entered_tool(rig)
        for n, version in enumerate(("what is 2+1", "what is 2+2", "what is 2+4"), start=1):
            await rig.manager.accept(edit(first, version, n))
        rig.tool.gate.set()

        await wait_replies(rig, 1)
        await quiet(rig)
        answers = [d.text for d in rig.adapter.delivered if d.text.startswith("answer")]
        if mode is BusyMode.QUEUE:
            assert answers == [f"answer to {first.text}", f"answer to {versions[-1]}"]
        else:  # steered into the running turn: its answer is the last version's
            assert answers == [f"answer to {versions[-1]}"]
        rows = await rig.settled(KEY, 4)
        history = await transcript(store)
        assert [m.content for m in history if m.role is Role.USER] == [first.text, versions[-1]]
        merged = [r for r in rows if r.outcome is Outcome.MERGED]
        assert len(merged) == 2
        assert_one_outcome_each(rows, rig)


async def test_an_edit_belongs_to_the_session_of_the_message_it_changes(
    store: Store, tmp_path: Path
) -> None:
    """An edit whose event names another thread (Slack gives a DM message a `thread_ts` once
    someone replied under it) is still about the message in its own session: answered there,
    with that session's history, not in a new session of the other thread."""
    async with running_rig(store, tmp_path, gated=False) as rig:
        first = inbound("capital of Austrlia?")
        await rig.manager.accept(first)
        await wait_replies(rig, 1)
        await rig.manager.accept(edit(first, "capital of Australia?", thread_id=ThreadId("t9")))
        edited = f"{EDIT_OF_ANSWERED} capital of Australia?"
        assert (await wait_replies(rig, 2))[1] == f"answer to {edited}"
        assert [d.thread_id for d in rig.adapter.delivered if d.text.startswith("answer")] == [
            None,
            None,
        ]
        history = await transcript(store)
        assert [m.content for m in history if m.role is Role.USER] == [first.text, edited]
        rows = await rig.inbox.recent(limit=10)
        assert {r.session_key for r in rows} == {KEY}


async def test_an_edit_racing_the_steer_boundary_is_never_lost(
    store: Store, tmp_path: Path
) -> None:
    """An edit of a waiting steer message whose commit waits (here: on a row lock) while the
    turn reaches its boundary: the turn reads the new text, not the old one with the edit
    stored as merged into text nobody reads. PostgreSQL only (SQLite runs one writer)."""
    if store.engine.dialect.name != "postgresql":
        pytest.skip("needs concurrent writers")
    async with running_rig(store, tmp_path, sessions=busy_config(BusyMode.STEER)) as rig:
        rig.llm.release("tool:look", "and the waether", "and the weather")
        await rig.manager.accept(inbound("tool:look"))
        await entered_tool(rig)
        steer = inbound("and the waether")
        await rig.manager.accept(steer)
        row = by_text(await rig.rows(KEY))[steer.text]

        locked, unlock = asyncio.Event(), asyncio.Event()

        async def hold_row() -> None:
            async with store.write() as conn:
                await conn.execute(select(inbox.c.id).where(inbox.c.id == row.id).with_for_update())
                locked.set()
                await unlock.wait()

        async def lock_waiters() -> int:
            async with store.read() as conn:
                found = await conn.scalar(
                    text(
                        "select count(*) from pg_stat_activity where wait_event_type = 'Lock'"
                        " and datname = current_database()"
                    )
                )
            return int(found or 0)

        async with asyncio.TaskGroup() as tg:
            tg.create_task(hold_row())
            await locked.wait()
            edited = tg.create_task(rig.manager.accept(edit(steer, "and the weather")))
            async with asyncio.timeout(10):  # the edit's UPDATE waits on the lock
                while not await lock_waiters():
                    await asyncio.sleep(0.01)
            rig.tool.gate.set()  # the turn reaches its boundary and takes the steer text
            async with asyncio.timeout(10):
                while len(rig.llm.calls) < 2:
                    await asyncio.sleep(0.01)
            unlock.set()
            await edited

        assert await wait_replies(rig, 1) == ["answer to and the weather"]
