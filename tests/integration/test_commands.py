"""Chat commands through the real session manager and store (SQLite and PostgreSQL).

Commands bypass the session's queue: each is answered at once (even while a turn is still
running), its row gets the outcome `answered`, and its reply is keyed `cmd:<inbox id>`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.commands import HELP_TEXT, Command
from gateway.config import AccessConfig, SessionsConfig
from gateway.contracts.config import BusyMode
from gateway.contracts.history import ChatMessage, Role
from gateway.contracts.ids import SessionKey
from gateway.sessions import ACKS, HOME_SETTING
from gateway.store import Store
from gateway.store.inbox import InboxRow, Outcome, Status
from tests.fakes.platform import Delivered, inbound
from tests.integration.rig import Rig, running_rig

pytestmark = pytest.mark.timeout(60)

KEY = SessionKey("test:acct:c1")


# helpers ---------------------------------------------------------------------------------------


OPERATOR = AccessConfig(operators=("test:c1",))
"""The sender of `inbound()` messages in c1 operates Herald."""


def busy_config(mode: BusyMode = BusyMode.QUEUE) -> SessionsConfig:
    """Sessions config for these tests: no debounce, an ack per busy message, short drain."""
    return SessionsConfig(
        busy_mode=mode, debounce_seconds=0, ack_interval=0, queue_cap=20, drain_timeout=0.5
    )


async def command(
    rig: Rig,
    text: str,
    *,
    chat: str = "c1",
    thread: str | None = None,
    direct: bool = True,
    sender: str | None = None,
) -> str:
    """Send a command and return its reply, as delivered to the chat.

    `accept` runs the command before it returns, so the row is answered (or refused) by then.
    """
    key = f"test:acct:{chat}" + (f":{thread}" if thread else "")
    sender = sender or (chat if direct else "u1")  # a direct chat's id is its sender's
    await rig.manager.accept(inbound(text, chat=chat, thread=thread, direct=direct, sender=sender))
    rows = await rig.rows(key)
    row = next(r for r in reversed(rows) if r.is_command and r.text == text)
    assert row.outcome in (Outcome.ANSWERED, Outcome.REJECTED), f"{text!r} was not answered"
    assert row.status is Status.DONE
    reply = await wait_key(rig, f"cmd:{row.id}")
    return reply.text


async def wait_key(rig: Rig, key: str) -> Delivered:
    """Wait for the delivery with that idempotency key."""
    delivered = await rig.adapter.wait_for(lambda d: any(x.key == key for x in d))
    return next(x for x in delivered if x.key == key)


def replies(rig: Rig, chat: str = "c1") -> list[str]:
    """The answers of turns delivered to `chat` (not acks, notices or command replies)."""
    return [
        d.text
        for d in rig.adapter.delivered
        if d.chat_id == chat and d.key.startswith("s") and ":t" in d.key
    ]


async def wait_replies(rig: Rig, n: int) -> list[str]:
    """Wait until `n` turn answers were delivered; return them."""
    await rig.adapter.wait_for(lambda d: len([x for x in d if x.key.startswith("s")]) >= n)
    return replies(rig)


async def quiet(rig: Rig, timeout: float = 10.0) -> None:
    """Wait until no lane is busy and the outbox has nothing left to send."""
    await rig.idle(timeout)
    async with asyncio.timeout(timeout):
        while True:
            counts = await rig.outbox.counts()
            if not counts.get("pending") and not counts.get("sending"):
                return
            await asyncio.sleep(0.01)


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


async def all_settled(rig: Rig, n: int) -> list[InboxRow]:
    """Wait until the `n` rows of the session have an outcome; check each has exactly one."""
    rows = await rig.settled(KEY, n)
    assert len(rows) == n
    assert all(r.status is Status.DONE and r.outcome is not None for r in rows)
    counted = 0.0
    for outcome in Outcome:
        value = rig.manager.metrics.registry.get_sample_value(
            "herald_message_outcomes_total", {"outcome": str(outcome)}
        )
        counted += value or 0.0
    assert int(counted) == n, "an outcome was recorded twice (or not at all)"
    return rows


def assert_commands_answered(rows: list[InboxRow]) -> None:
    """Every command row ends answered, with the command named in its detail."""
    commands = [r for r in rows if r.is_command]
    assert commands
    for row in commands:
        assert row.outcome is Outcome.ANSWERED
        assert row.outcome_detail is not None
        assert row.outcome_detail.startswith("/")


# bypassing the queue ---------------------------------------------------------------------------


async def test_commands_are_answered_while_a_turn_is_still_running(
    store: Store, tmp_path: Path
) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config(), access=OPERATOR) as rig:
        await rig.manager.accept(inbound("long question"))
        await rig.llm.wait_started("long question")
        await rig.manager.accept(inbound("queued question"))

        for text in ("/status", "/help", "/mode", "/mode collect", "/sethome", "/queue"):
            reply = await command(rig, text)
            assert reply
            # Still gated: the command did not wait for the turn.
            assert rig.manager.running(KEY)
            assert not rig.llm.gate("long question").is_set()
        assert rig.llm.started == ["long question"]
        assert not replies(rig)

        rig.llm.open_all()
        rows = await all_settled(rig, 8)
        assert await wait_replies(rig, 2) == [
            "answer to long question",
            "answer to queued question",
        ]
        assert_commands_answered(rows)


async def test_a_duplicate_command_delivery_runs_once(store: Store, tmp_path: Path) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config()) as rig:
        message = inbound("/sethome", message_id="cmd-1")
        await asyncio.gather(rig.manager.accept(message), rig.manager.accept(message))
        await rig.manager.accept(message)
        rows = await all_settled(rig, 1)
        await quiet(rig)
        assert [d.key for d in rig.adapter.delivered] == [f"cmd:{rows[0].id}"]


async def test_an_unknown_slash_command_is_an_ordinary_message(
    store: Store, tmp_path: Path
) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config(), gated=False) as rig:
        await rig.manager.accept(inbound("/weather tomorrow"))
        rows = await all_settled(rig, 1)
        assert rows[0].kind == "message"
        assert rows[0].outcome is Outcome.ANSWERED
        assert await wait_replies(rig, 1) == ["answer to /weather tomorrow"]


# /stop -----------------------------------------------------------------------------------------


async def test_stop_cancels_the_running_turn_and_clears_the_queue(
    store: Store, tmp_path: Path
) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config()) as rig:
        await rig.manager.accept(inbound("one"))
        await rig.llm.wait_started("one")
        await rig.manager.accept(inbound("two"))
        await rig.manager.accept(inbound("three"))

        reply = await command(rig, "/stop")
        assert reply == "⏹ Stopped. Cleared 2 queued messages."
        rows = by_text(await all_settled(rig, 4))
        assert rows["one"].outcome is Outcome.DROPPED
        assert rows["one"].outcome_detail == "stopped by /stop"
        assert rows["one"].turn_id is not None
        assert await store.turn_status(rows["one"].turn_id) == "interrupted"
        for text in ("two", "three"):
            assert rows[text].outcome is Outcome.DROPPED
            assert rows[text].outcome_detail == "cleared by /stop"
            assert rows[text].turn_id is None
        assert rows["/stop"].outcome is Outcome.ANSWERED

        # Nothing of the stopped work comes out, even once its gates open.
        rig.llm.release("one", "two", "three")
        await quiet(rig)
        assert replies(rig) == []
        assert rig.llm.started == ["one"]

        # The session still works afterwards.
        rig.llm.release("four")
        await rig.manager.accept(inbound("four"))
        assert await wait_replies(rig, 1) == ["answer to four"]
        assert_commands_answered(await all_settled(rig, 5))


async def test_stop_when_idle_says_nothing_was_running(store: Store, tmp_path: Path) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config()) as rig:
        assert await command(rig, "/stop") == "⏹ Nothing was running. Cleared 0 queued messages."
        assert_commands_answered(await all_settled(rig, 1))


async def test_stop_addressed_to_the_bot_by_name_works(store: Store, tmp_path: Path) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config()) as rig:
        await rig.manager.accept(inbound("one"))
        await rig.llm.wait_started("one")
        await rig.manager.accept(inbound("two"))
        reply = await command(rig, "/stop@herald_bot")
        assert reply == "⏹ Stopped. Cleared 1 queued message."
        rows = by_text(await all_settled(rig, 3))
        assert rows["one"].outcome is Outcome.DROPPED
        assert rows["two"].outcome is Outcome.DROPPED
        assert rows["/stop@herald_bot"].outcome_detail == "/stop"


# /new and /reset -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["/new", "/reset"])
async def test_new_and_reset_start_a_fresh_conversation(
    store: Store, tmp_path: Path, name: str
) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config(), gated=False) as rig:
        await rig.manager.accept(inbound("remember the blue door"))
        await wait_replies(rig, 1)
        await rig.idle()
        old = await store.get_session(KEY)
        assert old is not None

        reply = await command(rig, name)
        assert "new conversation" in reply
        new = await store.get_session(KEY)
        assert new is not None
        assert new.epoch == old.epoch + 1
        assert new.id != old.id
        assert await store.transcript(new.id) == []

        await rig.manager.accept(inbound("what door?"))
        assert await wait_replies(rig, 2) == [
            "answer to remember the blue door",
            "answer to what door?",
        ]
        rows = await all_settled(rig, 3)
        # Answered in the new session: the model did not see the old conversation.
        prompt = calls_answering(rig, "what door?")[0]
        assert user_texts(prompt) == ["what door?"]
        assert user_texts(await store.transcript(new.id)) == ["what door?"]
        assert user_texts(await store.transcript(old.id)) == ["remember the blue door"]
        current = await store.get_session(KEY)
        assert current is not None
        assert current.id == new.id
        assert_commands_answered(rows)


async def test_new_while_busy_cancels_the_turn_and_answers_queued_messages_in_the_new_session(
    store: Store, tmp_path: Path
) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config()) as rig:
        await rig.manager.accept(inbound("old topic"))
        await rig.llm.wait_started("old topic")
        old = await store.get_session(KEY)
        assert old is not None

        await command(rig, "/new")
        rig.llm.release("new topic")
        await rig.manager.accept(inbound("new topic"))
        rows = by_text(await all_settled(rig, 3))
        assert rows["old topic"].outcome is Outcome.DROPPED
        assert rows["new topic"].outcome is Outcome.ANSWERED
        assert await wait_replies(rig, 1) == ["answer to new topic"]

        rig.llm.release("old topic")
        await quiet(rig)
        assert replies(rig) == ["answer to new topic"]
        new = await store.get_session(KEY)
        assert new is not None
        assert new.id != old.id
        assert user_texts(await store.transcript(new.id)) == ["new topic"]
        assert user_texts(calls_answering(rig, "new topic")[0]) == ["new topic"]
        assert_commands_answered(list(rows.values()))


# /queue, /steer, /interrupt TEXT ---------------------------------------------------------------


async def test_queue_text_is_queued_even_in_interrupt_mode(store: Store, tmp_path: Path) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config(BusyMode.INTERRUPT)) as rig:
        await rig.manager.accept(inbound("one"))
        await rig.llm.wait_started("one")
        await rig.manager.accept(inbound("/queue later please"))

        rows = by_text(await rig.rows(KEY))
        queued = rows["later please"]  # stored without the command
        assert queued.kind == "message"
        assert queued.outcome is None
        ack = await wait_key(rig, f"ack:{queued.id}")
        assert ack.text == ACKS[BusyMode.QUEUE]
        assert rig.manager.running(KEY)  # the running turn was not interrupted

        rig.llm.release("one", "later please")
        settled = by_text(await all_settled(rig, 2))
        assert await wait_replies(rig, 2) == ["answer to one", "answer to later please"]
        assert settled["one"].outcome is Outcome.ANSWERED
        assert settled["later please"].outcome is Outcome.ANSWERED
        assert settled["later please"].turn_id != settled["one"].turn_id


async def test_steer_text_steers_even_in_queue_mode(store: Store, tmp_path: Path) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config(BusyMode.QUEUE)) as rig:
        rig.llm.release("tool:fetch", "and summarise it")
        await rig.manager.accept(inbound("tool:fetch"))
        async with asyncio.timeout(10):
            await rig.tool.entered.wait()
        await rig.manager.accept(inbound("/steer and summarise it"))
        pending = by_text(await rig.rows(KEY))
        ack = await wait_key(rig, f"ack:{pending['and summarise it'].id}")
        assert ack.text == ACKS[BusyMode.STEER]

        rig.tool.gate.set()
        rows = by_text(await all_settled(rig, 2))
        assert rows["tool:fetch"].outcome is Outcome.ANSWERED
        assert rows["and summarise it"].outcome is Outcome.STEERED
        assert rows["and summarise it"].turn_id == rows["tool:fetch"].turn_id
        assert await wait_replies(rig, 1) == ["answer to and summarise it"]
        await quiet(rig)
        assert len(replies(rig)) == 1
        assert rig.llm.calls[-1][-1].content == "and summarise it"


async def test_interrupt_text_interrupts_even_in_queue_mode_and_goes_first(
    store: Store, tmp_path: Path
) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config(BusyMode.QUEUE)) as rig:
        await rig.manager.accept(inbound("one"))
        await rig.llm.wait_started("one")
        await rig.manager.accept(inbound("two"))  # queued before the interruption
        rig.llm.release("urgent", "two")
        await rig.manager.accept(inbound("/interrupt urgent"))

        rows = by_text(await all_settled(rig, 3))
        assert rows["one"].outcome is Outcome.DROPPED
        assert rows["one"].outcome_detail is not None
        assert "interrupted" in rows["one"].outcome_detail
        assert rows["urgent"].outcome is Outcome.ANSWERED
        assert rows["two"].outcome is Outcome.ANSWERED
        urgent_turn, two_turn = rows["urgent"].turn_id, rows["two"].turn_id
        assert urgent_turn is not None
        assert two_turn is not None
        assert urgent_turn < two_turn  # the interrupting message jumps the queue
        assert await wait_replies(rig, 2) == ["answer to urgent", "answer to two"]
        rig.llm.release("one")
        await quiet(rig)
        assert replies(rig) == ["answer to urgent", "answer to two"]


@pytest.mark.parametrize("name", ["queue", "steer", "interrupt"])
async def test_a_text_command_without_text_answers_with_its_usage(
    store: Store, tmp_path: Path, name: str
) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config()) as rig:
        assert await command(rig, f"/{name}") == f"Usage: /{name} TEXT"
        assert_commands_answered(await all_settled(rig, 1))
        assert rig.llm.calls == []


# /mode -----------------------------------------------------------------------------------------


async def test_mode_sets_the_session_mode_persistently_and_it_survives_new(
    store: Store, tmp_path: Path
) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config(BusyMode.QUEUE)) as rig:
        assert await command(rig, "/mode COLLECT") == "Busy mode set to collect."
        session = await store.get_session(KEY)
        assert session is not None
        assert session.busy_mode == "collect"
        assert (await command(rig, "/mode")).startswith("Busy mode: collect.")

        await command(rig, "/new")
        renewed = await store.get_session(KEY)
        assert renewed is not None
        assert renewed.epoch == session.epoch + 1
        assert renewed.busy_mode == "collect"
        assert (await command(rig, "/mode")).startswith("Busy mode: collect.")
        assert_commands_answered(await all_settled(rig, 4))


async def test_mode_changes_how_busy_time_messages_are_handled(
    store: Store, tmp_path: Path
) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config(BusyMode.QUEUE)) as rig:
        await command(rig, "/mode interrupt")
        await rig.manager.accept(inbound("one"))
        await rig.llm.wait_started("one")
        rig.llm.release("two")
        await rig.manager.accept(inbound("two"))
        rows = by_text(await all_settled(rig, 3))
        assert rows["one"].outcome is Outcome.DROPPED
        assert rows["two"].outcome is Outcome.ANSWERED
        assert await wait_replies(rig, 1) == ["answer to two"]


async def test_mode_with_an_unknown_name_is_refused_and_changes_nothing(
    store: Store, tmp_path: Path
) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config(BusyMode.QUEUE)) as rig:
        await command(rig, "/mode steer")
        reply = await command(rig, "/mode sideways")
        assert reply.startswith("Unknown mode 'sideways'")
        assert "queue, collect, steer, interrupt" in reply
        session = await store.get_session(KEY)
        assert session is not None
        assert session.busy_mode == "steer"
        assert (await command(rig, "/mode")).startswith("Busy mode: steer.")
        assert_commands_answered(await all_settled(rig, 3))


async def test_mode_without_a_name_reports_the_configured_default(
    store: Store, tmp_path: Path
) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config(BusyMode.COLLECT)) as rig:
        reply = await command(rig, "/mode")
        assert reply == "Busy mode: collect. Choose with /mode queue|collect|steer|interrupt."
        assert await store.get_session(KEY) is None  # asking changes nothing


@pytest.mark.parametrize("first", ["/mode steer", "/new"])
async def test_a_command_as_the_first_message_keeps_the_session_linked_to_its_user(
    store: Store, tmp_path: Path, first: str
) -> None:
    """A direct chat's session belongs to its sender (memory, USER.md), command first or not."""
    async with running_rig(store, tmp_path, sessions=busy_config(), gated=False) as rig:
        await rig.manager.accept(inbound("hello", chat="c2"))
        await rig.settled("test:acct:c2", 1)
        plain = await store.get_session("test:acct:c2")
        assert plain is not None
        assert plain.user_id is not None  # the reference: a direct chat is personal

        await rig.manager.accept(inbound(first, chat="c1"))
        await rig.manager.accept(inbound("hello", chat="c1"))
        await rig.settled(KEY, 2)
        await wait_replies(rig, 2)
        assert replies(rig, "c1") == replies(rig, "c2") == ["answer to hello"]
        session = await store.get_session(KEY)
        assert session is not None
        assert session.user_id == await store.resolve_user("test", "c1"), (
            f"a session opened by {first} is never linked to the sender's user"
        )


# /status, /sethome, /help ----------------------------------------------------------------------


async def test_status_reports_idle_busy_and_the_waiting_count(store: Store, tmp_path: Path) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config(BusyMode.QUEUE)) as rig:
        idle = await command(rig, "/status")
        assert f"Session {KEY}" in idle
        assert "Busy mode: queue" in idle
        assert "Idle" in idle
        assert "Waiting: 0" in idle

        await rig.manager.accept(inbound("one"))
        await rig.llm.wait_started("one")
        await rig.manager.accept(inbound("two"))
        await rig.manager.accept(inbound("three"))
        busy = (await command(rig, "/status")).splitlines()
        assert any(line.startswith("Answering now") for line in busy)
        assert "Idle" not in busy
        assert "Waiting: 2" in busy

        rig.llm.open_all()
        await all_settled(rig, 5)
        await rig.idle()
        after = await command(rig, "/status")
        assert "Idle" in after
        assert "Waiting: 0" in after
        assert_commands_answered(await all_settled(rig, 6))


async def test_sethome_stores_the_home_target(store: Store, tmp_path: Path) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config(), access=OPERATOR) as rig:
        assert await store.get_setting(HOME_SETTING) is None
        reply = await command(rig, "/sethome")
        assert "test:c1" in reply
        assert await store.get_setting(HOME_SETTING) == "test:c1"

        # From a thread of a group: the thread is part of the target; last one wins.
        await command(rig, "/sethome", chat="g1", thread="t9", direct=False, sender="c1")
        assert await store.get_setting(HOME_SETTING) == "test:g1:t9"
        assert_commands_answered([*await rig.rows(KEY), *await rig.rows("test:acct:g1:t9")])


async def test_sethome_from_anyone_but_an_operator_is_refused(store: Store, tmp_path: Path) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config(), access=OPERATOR) as rig:
        reply = await command(rig, "/sethome", chat="c2")
        assert "Only Herald's operator" in reply
        assert "test:c2" in reply  # what the operator would list
        # In a group too, even addressed to the bot.
        await command(rig, "/sethome", chat="g1", direct=False, sender="u2")
        assert await store.get_setting(HOME_SETTING) is None
        [row] = await rig.rows("test:acct:c2")
        assert row.outcome is Outcome.REJECTED
        assert row.outcome_detail == "/sethome: not an operator"


async def test_help_lists_every_command(store: Store, tmp_path: Path) -> None:
    async with running_rig(store, tmp_path, sessions=busy_config()) as rig:
        reply = await command(rig, "/help")
        assert reply == HELP_TEXT
        for name in Command:
            assert f"/{name}" in reply
        assert_commands_answered(await all_settled(rig, 1))
        assert rig.llm.calls == []
