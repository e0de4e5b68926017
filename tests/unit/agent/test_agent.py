"""Agent: turns built from the SQL transcript, compression first, memory pass, stateless."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from agent_core.agent import MEMORY_MARKER, Agent, AgentSettings
from agent_core.compress import MARKER
from agent_core.context import system_prompt
from agent_core.llm import Usage
from agent_core.loop import TurnProgress
from agent_core.memory import MemoryFiles, MemoryScope, person
from agent_core.tools import MemoryTool, SessionSearchTool, ToolContext, ToolRegistry
from gateway.contracts.errors import LLMError, LLMRejected, LLMUnavailable
from gateway.contracts.history import ChatMessage, Role, SessionInfo
from gateway.contracts.ids import SessionKey, UserId
from gateway.store import Store
from tests.unit.agent.fakes import (
    EchoTool,
    QueueSteer,
    ScriptedProvider,
    Tokens,
    answer,
    call,
    use_tools,
)
from tests.unit.agent.transcripts import (
    add_exchanges,
    add_turn,
    assistant,
    contents,
    open_session,
    start_user_turn,
    user,
)

SOUL = "You are Jeeves, a discreet butler."
SUMMARY = "## Goal\n- keep the conversation going"


@pytest.fixture
def files(tmp_path: Path) -> MemoryFiles:
    """Memory files with a custom SOUL.md."""
    root = tmp_path / "state"
    root.mkdir()
    (root / "SOUL.md").write_text(SOUL + "\n", encoding="utf-8")
    return MemoryFiles(root)


def _uid(user_id: UserId | None) -> UserId:
    assert user_id is not None
    return user_id


def make_agent(
    provider: ScriptedProvider,
    store: Store,
    files: MemoryFiles,
    tools: ToolRegistry | None = None,
    settings: AgentSettings | None = None,
) -> Agent:
    registry = tools if tools is not None else ToolRegistry([MemoryTool(files), EchoTool()])
    return Agent(provider, store, files, registry, settings or AgentSettings())


async def ada_session(store: Store, **snapshots: str) -> SessionInfo:
    ada = await store.resolve_user("telegram", "1", "Ada")
    return await open_session(store, "telegram:bot:1", user_id=ada, **snapshots)


# run_turn ------------------------------------------------------------------------------------


async def test_a_turn_sees_the_history_rebuilt_from_sql(
    sql_store: Store, files: MemoryFiles
) -> None:
    session = await ada_session(sql_store, user_md="- Name: Ada", memory_md="- thesis due May")
    await add_turn(sql_store, session, "My name is Ada.", "Nice to meet you, Ada.")
    await add_turn(sql_store, session, "I like ferns.", "Ferns are lovely.")
    await start_user_turn(sql_store, session, "What is my name?")
    provider = ScriptedProvider(answer("Your name is Ada."))
    agent = make_agent(provider, sql_store, files)
    progress = TurnProgress()

    text = await agent.run_turn(session, progress)

    assert text == "Your name is Ada."
    assert progress.messages == [assistant("Your name is Ada.")]
    [sent] = provider.calls
    assert sent.system == system_prompt(SOUL, session, None)
    assert "# About the user (USER.md)\n- Name: Ada" in sent.system
    assert "# Your notes (MEMORY.md)\n- thesis due May" in sent.system
    assert [(m.role, m.content) for m in sent.messages[1:]] == [
        (Role.USER, "My name is Ada."),
        (Role.ASSISTANT, "Nice to meet you, Ada."),
        (Role.USER, "I like ferns."),
        (Role.ASSISTANT, "Ferns are lovely."),
        (Role.USER, "What is my name?"),
    ]
    assert sent.tool_names == ["memory", "echo"]


async def test_a_new_agent_on_the_same_store_sees_the_same_history(
    sql_store: Store, files: MemoryFiles
) -> None:
    session = await ada_session(sql_store)
    await add_turn(sql_store, session, "remember: blue", "Noted: blue.")
    await start_user_turn(sql_store, session, "what colour?")
    first, second = ScriptedProvider(answer("blue")), ScriptedProvider(answer("blue"))

    await make_agent(first, sql_store, files).run_turn(session, TurnProgress())
    await make_agent(second, sql_store, files).run_turn(session, TurnProgress())

    assert first.calls[0].messages == second.calls[0].messages


async def test_the_memory_snapshot_is_the_one_taken_when_the_session_started(
    sql_store: Store, files: MemoryFiles
) -> None:
    ada = await sql_store.resolve_user("telegram", "1", "Ada")
    await files.add(MemoryScope.USER, person(ada), "Name: Ada")
    session = await sql_store.open_session(
        SessionKey("telegram:bot:1"), platform="test", user_id=ada, snapshot=files.snapshot
    )
    await files.add(MemoryScope.USER, person(ada), "LATER-FACT")
    await start_user_turn(sql_store, session, "hi")
    provider = ScriptedProvider(answer("hello"))

    await make_agent(provider, sql_store, files).run_turn(session, TurnProgress())

    assert "- Name: Ada" in provider.calls[0].system
    assert "LATER-FACT" not in provider.calls[0].system


async def test_another_users_memory_never_reaches_the_prompt(
    sql_store: Store, files: MemoryFiles
) -> None:
    ada = await sql_store.resolve_user("telegram", "1", "Ada")
    bob = await sql_store.resolve_user("telegram", "2", "Bob")
    await files.add(MemoryScope.USER, person(ada), "ADA-PRIVATE allergy")
    await files.add(MemoryScope.MEMORY, person(ada), "ADA-PRIVATE project")
    session = await sql_store.open_session(
        SessionKey("telegram:bot:2"), platform="test", user_id=bob, snapshot=files.snapshot
    )
    await start_user_turn(sql_store, session, "what do you know about me?")
    provider = ScriptedProvider(answer("not much"))

    await make_agent(provider, sql_store, files).run_turn(session, TurnProgress())

    assert all("ADA-PRIVATE" not in m.content for m in provider.calls[0].messages)


async def test_tools_act_for_the_sessions_user(sql_store: Store, files: MemoryFiles) -> None:
    session = await ada_session(sql_store)
    await start_user_turn(sql_store, session, "call me Ada")
    echo = EchoTool()
    memory_add = {"action": "add", "target": "user", "content": "Name: Ada"}
    provider = ScriptedProvider(
        use_tools(call("c1", "echo", {"x": 1}), call("c2", "memory", memory_add)),
        answer("Done, Ada."),
    )
    agent = make_agent(provider, sql_store, files, ToolRegistry([MemoryTool(files), echo]))

    await agent.run_turn(session, TurnProgress())

    assert echo.calls == [({"x": 1}, ToolContext(session=session, user_id=session.user_id))]
    assert await files.read(MemoryScope.USER, person(_uid(session.user_id))) == "- Name: Ada\n"


async def test_a_turn_streams_and_takes_steer(sql_store: Store, files: MemoryFiles) -> None:
    session = await ada_session(sql_store)
    await start_user_turn(sql_store, session, "time?")
    provider = ScriptedProvider(use_tools(call("c1", "echo")), answer("Noon in Paris."))
    tokens, steer, progress = Tokens(), QueueSteer("in Paris"), TurnProgress()

    await make_agent(provider, sql_store, files).run_turn(
        session, progress, on_token=tokens, steer=steer
    )

    assert tokens.text == "Noon in Paris."
    assert progress.steered == 1
    assert provider.calls[1].messages[-1] == user("in Paris")


async def test_the_tool_iterations_follow_the_settings(
    sql_store: Store, files: MemoryFiles
) -> None:
    session = await ada_session(sql_store)
    await start_user_turn(sql_store, session, "loop forever")
    provider = ScriptedProvider(use_tools(call("c1", "echo")), answer("stopping"))

    await make_agent(
        provider, sql_store, files, settings=AgentSettings(max_tool_iterations=1)
    ).run_turn(session, TurnProgress())

    assert [c.tool_names for c in provider.calls] == [["memory", "echo"], []]


async def test_a_model_error_propagates_from_run_turn(sql_store: Store, files: MemoryFiles) -> None:
    session = await ada_session(sql_store)
    await start_user_turn(sql_store, session, "hi")
    agent = make_agent(ScriptedProvider(LLMRejected("bad key")), sql_store, files)

    with pytest.raises(LLMRejected):
        await agent.run_turn(session, TurnProgress())


# compression before the turn ------------------------------------------------------------------


async def test_a_long_history_is_compressed_before_the_turn(
    sql_store: Store, files: MemoryFiles
) -> None:
    session = await ada_session(sql_store)
    ids = await add_exchanges(sql_store, session, 6)
    await start_user_turn(sql_store, session, "and now?")
    provider = ScriptedProvider(answer(SUMMARY), answer("Carrying on."))
    agent = make_agent(
        provider,
        sql_store,
        files,
        settings=AgentSettings(context_window=100, compression_threshold=0.5),
    )

    assert await agent.run_turn(session, TurnProgress()) == "Carrying on."

    summarize, turn = provider.calls
    assert summarize.system.startswith(MARKER)
    assert summarize.tools == ()
    assert "user: question 1" in summarize.messages[1].content
    assert turn.system == system_prompt(SOUL, session, SUMMARY)
    # The cut lands on the user message that leaves at least KEEP_RECENT messages.
    assert contents(turn.messages[1:]) == [
        "question 4",
        "answer 4",
        "question 5",
        "answer 5",
        "question 6",
        "answer 6",
        "and now?",
    ]
    history = await sql_store.load_history(session.id, 40)
    assert history.summary == SUMMARY
    assert history.summary_upto == ids[5]


async def test_reported_usage_triggers_compression(sql_store: Store, files: MemoryFiles) -> None:
    session = await ada_session(sql_store)
    await add_exchanges(sql_store, session, 3)
    await add_turn(sql_store, session, "short", "reply", usage=Usage(90_000, 1_000))
    await start_user_turn(sql_store, session, "next")
    provider = ScriptedProvider(answer(SUMMARY), answer("ok"))

    await make_agent(
        provider, sql_store, files, settings=AgentSettings(context_window=128_000)
    ).run_turn(session, TurnProgress())

    assert provider.calls[0].system.startswith(MARKER)
    assert SUMMARY in provider.calls[1].system


async def test_a_full_window_triggers_compression(sql_store: Store, files: MemoryFiles) -> None:
    session = await ada_session(sql_store)
    await add_exchanges(sql_store, session, 4)
    await start_user_turn(sql_store, session, "ninth message")
    provider = ScriptedProvider(answer(SUMMARY), answer("ok"))

    await make_agent(provider, sql_store, files, settings=AgentSettings(history_window=9)).run_turn(
        session, TurnProgress()
    )

    assert provider.calls[0].system.startswith(MARKER)
    assert contents(provider.calls[1].messages[1:]) == [
        "question 2",
        "answer 2",
        "question 3",
        "answer 3",
        "question 4",
        "answer 4",
        "ninth message",
    ]


async def test_a_short_history_is_not_compressed(sql_store: Store, files: MemoryFiles) -> None:
    session = await ada_session(sql_store)
    await add_exchanges(sql_store, session, 5)
    await start_user_turn(sql_store, session, "next")
    provider = ScriptedProvider(answer("ok"))

    await make_agent(provider, sql_store, files).run_turn(session, TurnProgress())

    [turn] = provider.calls
    assert len(turn.messages) == 1 + 11
    assert (await sql_store.load_history(session.id, 40)).summary is None


async def test_a_failed_compression_still_answers_with_the_full_window(
    sql_store: Store, files: MemoryFiles
) -> None:
    session = await ada_session(sql_store)
    await add_exchanges(sql_store, session, 6)
    await start_user_turn(sql_store, session, "and now?")
    provider = ScriptedProvider(LLMUnavailable("overloaded"), answer("Still here."))
    agent = make_agent(provider, sql_store, files, settings=AgentSettings(context_window=100))

    assert await agent.run_turn(session, TurnProgress()) == "Still here."

    turn = provider.calls[1]
    assert turn.system == system_prompt(SOUL, session, None)
    assert len(turn.messages) == 1 + 13
    assert (await sql_store.load_history(session.id, 40)).summary is None


async def test_compression_never_skips_messages_outside_the_window(
    sql_store: Store, files: MemoryFiles
) -> None:
    session = await ada_session(sql_store)
    await add_exchanges(sql_store, session, 6)  # 12 messages, window 8
    await start_user_turn(sql_store, session, "and now?")
    provider = ScriptedProvider(answer(SUMMARY), answer("ok"))

    await make_agent(provider, sql_store, files, settings=AgentSettings(history_window=8)).run_turn(
        session, TurnProgress()
    )

    summarized = provider.calls[0].messages[1].content
    assert "question 1" in summarized
    assert "answer 2" in summarized


# memory pass ---------------------------------------------------------------------------------

EXCHANGE = (
    user("I'm Ada, I study ferns."),
    ChatMessage(Role.ASSISTANT, "", tool_calls=(call("c9", "echo"),)),
    ChatMessage(Role.TOOL, "TOOL-OUTPUT", tool_call_id="c9", name="echo"),
    assistant("Nice, Ada!"),
)


async def test_the_memory_pass_saves_what_the_model_asks(
    sql_store: Store, files: MemoryFiles
) -> None:
    session = await ada_session(sql_store)
    await files.add(MemoryScope.MEMORY, person(_uid(session.user_id)), "existing note")
    add = {"action": "add", "target": "user", "content": "Name: Ada; studies ferns"}
    provider = ScriptedProvider(use_tools(call("m1", "memory", add)), answer("saved"))
    registry = ToolRegistry([MemoryTool(files), EchoTool(), SessionSearchTool(sql_store)])

    await make_agent(provider, sql_store, files, registry).memory_pass(session, EXCHANGE)

    assert (
        await files.read(MemoryScope.USER, person(_uid(session.user_id)))
        == "- Name: Ada; studies ferns\n"
    )
    first = provider.calls[0]
    assert first.system.startswith(MEMORY_MARKER)
    assert first.tool_names == ["memory"]
    assert provider.calls[1].tool_names == ["memory"]
    [prompt] = first.messages[1:]
    assert prompt.content.startswith("USER.md now:\n(empty)\n\nMEMORY.md now:\n- existing note\n")
    assert prompt.content.endswith(
        "Latest exchange:\nuser: I'm Ada, I study ferns.\nassistant: Nice, Ada!"
    )
    assert "TOOL-OUTPUT" not in prompt.content


async def test_the_memory_pass_writes_only_the_sessions_user(
    sql_store: Store, files: MemoryFiles
) -> None:
    session = await ada_session(sql_store)
    bob = await sql_store.resolve_user("telegram", "2", "Bob")
    add = {"action": "add", "target": "user", "content": "likes ferns"}
    provider = ScriptedProvider(use_tools(call("m1", "memory", add)), answer("saved"))

    await make_agent(provider, sql_store, files).memory_pass(session, EXCHANGE)

    assert await files.read(MemoryScope.USER, person(bob)) == ""
    assert await files.read(MemoryScope.USER, person(_uid(session.user_id))) == "- likes ferns\n"


async def test_a_memory_pass_with_nothing_to_save(sql_store: Store, files: MemoryFiles) -> None:
    session = await ada_session(sql_store)
    provider = ScriptedProvider(answer("nothing to save"))

    await make_agent(provider, sql_store, files).memory_pass(session, EXCHANGE)

    assert len(provider.calls) == 1
    assert await files.read(MemoryScope.USER, person(_uid(session.user_id))) == ""


async def test_a_memory_pass_that_keeps_calling_tools_is_capped(
    sql_store: Store, files: MemoryFiles
) -> None:
    session = await ada_session(sql_store)
    provider = ScriptedProvider(
        *(use_tools(call(f"m{i}", "memory", {"action": "add"})) for i in range(3)),
        answer("giving up"),
    )

    await make_agent(provider, sql_store, files).memory_pass(session, EXCHANGE)

    assert [c.tool_names for c in provider.calls] == [["memory"]] * 3 + [[]]
    assert provider.pending == 0


@pytest.mark.parametrize("failure", [LLMUnavailable("overloaded"), LLMRejected("bad key")])
async def test_the_memory_pass_swallows_model_errors(
    sql_store: Store, files: MemoryFiles, caplog: pytest.LogCaptureFixture, failure: LLMError
) -> None:
    session = await ada_session(sql_store)
    provider = ScriptedProvider(failure)

    with caplog.at_level(logging.WARNING, logger="agent_core.agent"):
        await make_agent(provider, sql_store, files).memory_pass(session, EXCHANGE)

    assert len(provider.calls) == 1
    assert f"memory pass for {session.key} skipped" in caplog.text


async def test_the_memory_pass_can_be_switched_off(sql_store: Store, files: MemoryFiles) -> None:
    session = await ada_session(sql_store)
    provider = ScriptedProvider()

    await make_agent(
        provider, sql_store, files, settings=AgentSettings(memory_pass=False)
    ).memory_pass(session, EXCHANGE)

    assert provider.calls == []


async def test_no_memory_tool_means_no_memory_pass(sql_store: Store, files: MemoryFiles) -> None:
    session = await ada_session(sql_store)
    provider = ScriptedProvider()

    agent = make_agent(provider, sql_store, files, ToolRegistry([EchoTool()]))
    await agent.memory_pass(session, EXCHANGE)

    assert provider.calls == []


async def test_an_exchange_without_text_makes_no_call(sql_store: Store, files: MemoryFiles) -> None:
    session = await ada_session(sql_store)
    provider = ScriptedProvider()

    await make_agent(provider, sql_store, files).memory_pass(
        session, (user(""), *EXCHANGE[1:3], ChatMessage(Role.SYSTEM, "note"))
    )

    assert provider.calls == []


# answer_stateless ------------------------------------------------------------------------------


async def test_answer_stateless_uses_the_given_messages_and_no_tools(
    sql_store: Store, files: MemoryFiles
) -> None:
    conversation = (user("2+2?"), assistant("4"), user("and 3+3?"))
    provider = ScriptedProvider(answer("6"))
    tokens = Tokens()

    progress = await make_agent(provider, sql_store, files).answer_stateless(
        conversation, on_token=tokens
    )

    assert progress.final_text == "6"
    assert tokens.text == "6"
    [sent] = provider.calls
    assert sent.tools == ()
    assert sent.system == system_prompt(SOUL, None, None)
    assert sent.messages[1:] == conversation
    assert await sql_store.list_sessions() == []


async def test_answer_stateless_ignores_tool_calls(sql_store: Store, files: MemoryFiles) -> None:
    provider = ScriptedProvider(use_tools(call("c1", "memory"), content="I would save that."))

    progress = await make_agent(provider, sql_store, files).answer_stateless([user("hi")])

    assert progress.messages == [assistant("I would save that.")]
    assert len(provider.calls) == 1
