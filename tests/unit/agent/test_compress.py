"""Compression: when it is needed, where the cut lands, and what compress() stores."""

from __future__ import annotations

import logging

import pytest

from agent_core.compress import KEEP_RECENT, MARKER, compress, needs_compression, split_point
from agent_core.context import estimate_tokens
from agent_core.llm import Usage
from gateway.contracts.errors import LLMError, LLMRejected, LLMUnavailable
from gateway.contracts.history import ChatMessage, History, Role
from gateway.store import Store
from tests.unit.agent.fakes import ScriptedProvider, answer, call
from tests.unit.agent.transcripts import add_exchanges, add_turn, assistant, open_session, user

SUMMARY = "## Goal\n- learn about ferns\n## Constraints\n- none"


def exchanges(count: int, size: int = 10) -> tuple[ChatMessage, ...]:
    """`count` user/assistant pairs whose contents are `size` characters long."""
    out: list[ChatMessage] = []
    for i in range(count):
        out += [user(f"q{i}".ljust(size, ".")), assistant(f"a{i}".ljust(size, "."))]
    return tuple(out)


def needs(
    history: History,
    *,
    usage: Usage | None = None,
    incoming_chars: int = 0,
    context_window: int = 1_000,
    window: int = 40,
) -> bool:
    return needs_compression(
        history,
        incoming_chars=incoming_chars,
        last_usage=usage,
        context_window=context_window,
        threshold=0.5,
        window=window,
    )


# needs_compression ---------------------------------------------------------------------------


def test_a_short_history_is_never_compressed() -> None:
    history = History(None, exchanges(3, size=10_000))
    assert len(history.messages) == KEEP_RECENT
    assert not needs(history)
    assert not needs(history, usage=Usage(1_000_000, 0))


def test_before_usage_the_size_is_estimated_from_characters() -> None:
    small = History(None, exchanges(4, size=50))
    large = History(None, exchanges(4, size=300))
    assert estimate_tokens(small.messages) <= 500 < estimate_tokens(large.messages)

    assert not needs(small)
    assert needs(large)


def test_the_estimate_counts_the_summary() -> None:
    messages = exchanges(4, size=50)
    assert not needs(History("s" * 100, messages))
    assert needs(History("s" * 2_000, messages))


def test_after_usage_the_reported_tokens_stand_for_the_history() -> None:
    huge_text = History(None, exchanges(4, size=5_000))
    tiny_text = History(None, exchanges(4, size=1))

    # Reported usage wins over the estimate in both directions.
    assert not needs(huge_text, usage=Usage(300, 50))
    assert needs(tiny_text, usage=Usage(450, 60))


def test_the_threshold_is_exclusive_and_counts_the_incoming_message() -> None:
    history = History(None, exchanges(4, size=1))

    assert not needs(history, usage=Usage(400, 50), incoming_chars=200)  # exactly 500
    assert needs(history, usage=Usage(400, 50), incoming_chars=204)  # 501
    assert needs(history, usage=Usage(401, 50), incoming_chars=200)


def test_a_full_window_needs_compression_whatever_the_size() -> None:
    history = History(None, exchanges(5, size=1))
    assert needs(history, window=10, context_window=10**9)
    assert needs(history, window=10, usage=Usage(1, 1))
    assert not needs(history, window=11, context_window=10**9)


# split_point ---------------------------------------------------------------------------------


def test_split_point_keeps_the_recent_messages_from_a_user_message() -> None:
    messages = exchanges(10)

    cut = split_point(messages)

    assert cut == len(messages) - KEEP_RECENT
    assert messages[cut].role is Role.USER


def test_split_point_moves_back_to_a_user_message() -> None:
    asked = ChatMessage(Role.ASSISTANT, "", tool_calls=(call("c1", "clock"),))
    done = ChatMessage(Role.TOOL, "12:00", tool_call_id="c1", name="clock")
    messages = (
        *exchanges(3),
        user("time?"),
        asked,
        done,
        assistant("noon"),
        user("thanks"),
        assistant("welcome"),
        assistant("anything else?"),
    )

    cut = split_point(messages)

    assert messages[cut] == user("time?")
    assert len(messages) - cut == KEEP_RECENT + 1


@pytest.mark.parametrize("layout", ["uauauauauauauaua", "uaaaaaaaaaaaaa", "uattatattauaua"])
def test_split_point_always_lands_on_a_user_message_keeping_enough(layout: str) -> None:
    roles = {"u": Role.USER, "a": Role.ASSISTANT, "t": Role.TOOL}
    messages = [ChatMessage(roles[c], c) for c in layout]

    cut = split_point(messages)

    assert cut >= 0
    assert messages[cut].role is Role.USER
    assert len(messages) - cut >= KEEP_RECENT


def test_split_point_without_an_earlier_user_message_is_zero() -> None:
    messages = [user("hi"), *[assistant(str(i)) for i in range(10)]]
    assert split_point(messages) == 0


def test_split_point_of_a_short_history_keeps_everything() -> None:
    assert split_point(exchanges(2)) <= 0


# compress ------------------------------------------------------------------------------------


async def test_compress_stores_a_summary_and_the_next_load_starts_after_it(
    sql_store: Store,
) -> None:
    session = await open_session(sql_store)
    ids = await add_exchanges(sql_store, session, 10)
    history = await sql_store.load_history(session.id, 40)
    provider = ScriptedProvider(answer(f"  {SUMMARY}\n"))

    assert await compress(provider, sql_store, session, history)

    reloaded = await sql_store.load_history(session.id, 40)
    assert reloaded.summary == SUMMARY
    assert reloaded.summary_upto == ids[13]
    assert [m.content for m in reloaded.messages] == [
        "question 8",
        "answer 8",
        "question 9",
        "answer 9",
        "question 10",
        "answer 10",
    ]
    assert [m.id for m in reloaded.messages] == ids[14:]


async def test_the_summary_request_carries_the_marker_and_the_older_part(
    sql_store: Store,
) -> None:
    session = await open_session(sql_store)
    await add_exchanges(sql_store, session, 2)
    asked = ChatMessage(Role.ASSISTANT, "", tool_calls=(call("c1", "clock"),))
    done = ChatMessage(Role.TOOL, "TOOL-OUTPUT", tool_call_id="c1", name="clock")
    await add_turn(sql_store, session, "question 3", asked, done, "answer 3")
    for i in (4, 5, 6):
        await add_turn(sql_store, session, f"question {i}", f"answer {i}")
    history = await sql_store.load_history(session.id, 40)
    provider = ScriptedProvider(answer(SUMMARY))

    await compress(provider, sql_store, session, history)

    [request] = provider.calls
    system, prompt = request.messages
    assert system.role is Role.SYSTEM
    assert system.content.startswith(MARKER)
    assert "## Open questions" in system.content
    assert prompt.role is Role.USER
    assert prompt.content.startswith(
        "Conversation:\nuser: question 1\nassistant: answer 1\nuser: question 2\n"
    )
    assert prompt.content.endswith("assistant: answer 3")
    assert "TOOL-OUTPUT" not in prompt.content
    assert "question 4" not in prompt.content
    assert request.tools == ()


async def test_the_summary_request_carries_the_earlier_summary(sql_store: Store) -> None:
    session = await open_session(sql_store)
    await add_exchanges(sql_store, session, 5)
    provider = ScriptedProvider(answer("FIRST SUMMARY"), answer("SECOND SUMMARY"))
    assert await compress(
        provider, sql_store, session, await sql_store.load_history(session.id, 40)
    )
    for i in (6, 7, 8):
        await add_turn(sql_store, session, f"question {i}", f"answer {i}")

    history = await sql_store.load_history(session.id, 40)
    assert history.summary == "FIRST SUMMARY"
    assert await compress(provider, sql_store, session, history)

    prompt = provider.calls[1].messages[1].content
    assert prompt.startswith("Earlier summary:\nFIRST SUMMARY\n\nConversation:\n")
    assert "question 1" not in prompt
    assert "user: question 3\nassistant: answer 3" in prompt
    reloaded = await sql_store.load_history(session.id, 40)
    assert reloaded.summary == "SECOND SUMMARY"
    assert reloaded.messages[0].content == "question 6"


@pytest.mark.parametrize("failure", [LLMUnavailable("overloaded"), LLMRejected("bad key")])
async def test_a_model_failure_leaves_the_history_unchanged(
    sql_store: Store, caplog: pytest.LogCaptureFixture, failure: LLMError
) -> None:
    session = await open_session(sql_store)
    await add_exchanges(sql_store, session, 6)
    before = await sql_store.load_history(session.id, 40)
    provider = ScriptedProvider(failure)

    with caplog.at_level(logging.WARNING, logger="agent_core.compress"):
        assert not await compress(provider, sql_store, session, before)

    assert await sql_store.load_history(session.id, 40) == before
    assert f"compression of session {session.key} failed" in caplog.text


async def test_an_empty_summary_is_not_stored(sql_store: Store) -> None:
    session = await open_session(sql_store)
    await add_exchanges(sql_store, session, 6)
    before = await sql_store.load_history(session.id, 40)

    assert not await compress(ScriptedProvider(answer(" \n")), sql_store, session, before)

    assert await sql_store.load_history(session.id, 40) == before


async def test_nothing_to_cut_makes_no_model_call(sql_store: Store) -> None:
    session = await open_session(sql_store)
    await add_exchanges(sql_store, session, 3)
    provider = ScriptedProvider()

    history = await sql_store.load_history(session.id, 40)
    assert not await compress(provider, sql_store, session, history)

    assert provider.calls == []


async def test_messages_without_ids_are_not_compressed(sql_store: Store) -> None:
    session = await open_session(sql_store)
    provider = ScriptedProvider()

    assert not await compress(provider, sql_store, session, History(None, exchanges(6)))

    assert provider.calls == []
