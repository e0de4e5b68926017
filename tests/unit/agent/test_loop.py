"""run_tool_loop and TurnProgress: answers, tool rounds, the cap, streaming, steer, cancel."""

from __future__ import annotations

import asyncio

import pytest

from agent_core.context import build_context
from agent_core.llm import Usage
from agent_core.loop import ITERATION_CAP_NOTE, SteerSource, TurnProgress, run_tool_loop
from agent_core.tools import ToolContext, ToolRegistry
from gateway.contracts.errors import LLMUnavailable
from gateway.contracts.history import ChatMessage, Role
from gateway.contracts.ids import UserId
from gateway.store import Store
from tests.turns import finish_turn, start_turn
from tests.unit.agent.fakes import (
    BlockingTool,
    EchoTool,
    QueueSteer,
    ScriptedProvider,
    Stall,
    Tokens,
    answer,
    call,
    use_tools,
)
from tests.unit.agent.transcripts import assistant, open_session, user

CONTEXT = (ChatMessage(Role.SYSTEM, "be brief"), user("what time is it?"))
CTX = ToolContext(session=None, user_id=UserId("u_ada"))


def tool_result(call_id: str, output: str, name: str = "echo") -> ChatMessage:
    return ChatMessage(Role.TOOL, output, tool_call_id=call_id, name=name)


async def run(
    provider: ScriptedProvider,
    tools: ToolRegistry | None = None,
    progress: TurnProgress | None = None,
    *,
    max_iterations: int = 4,
    tokens: Tokens | None = None,
    steer: SteerSource | None = None,
) -> str:
    return await run_tool_loop(
        provider,
        CONTEXT,
        tools if tools is not None else ToolRegistry([EchoTool()]),
        CTX,
        progress if progress is not None else TurnProgress(),
        max_iterations=max_iterations,
        on_token=tokens,
        steer=steer,
    )


async def test_a_plain_answer_is_one_call() -> None:
    provider = ScriptedProvider(answer("It is noon."))
    registry = ToolRegistry([EchoTool()])
    progress = TurnProgress()

    text = await run(provider, registry, progress)

    assert text == "It is noon."
    assert progress.messages == [assistant("It is noon.")]
    assert progress.final_text == "It is noon."
    [sent] = provider.calls
    assert sent.messages == CONTEXT
    assert list(sent.tools) == registry.specs()


async def test_a_tool_round_then_the_answer() -> None:
    asked = call("c1", "echo", {"zone": "UTC"})
    provider = ScriptedProvider(use_tools(asked, content="Checking."), answer("It is noon."))
    echo = EchoTool()
    progress = TurnProgress()

    text = await run(provider, ToolRegistry([echo]), progress)

    assert text == "It is noon."
    expected = [
        ChatMessage(Role.ASSISTANT, "Checking.", tool_calls=(asked,)),
        tool_result("c1", '{"zone": "UTC"}'),
        assistant("It is noon."),
    ]
    assert progress.messages == expected
    assert echo.calls == [({"zone": "UTC"}, CTX)]
    first, second = provider.calls
    assert first.messages == CONTEXT
    assert second.messages == (*CONTEXT, *expected[:2])
    assert second.tool_names == ["echo"]


async def test_several_calls_in_one_response_are_answered_in_order() -> None:
    calls = (call("c1", "echo", {"n": 1}), call("c2", "missing"), call("c3", "echo", {"n": 3}))
    provider = ScriptedProvider(use_tools(*calls), answer("done"))
    progress = TurnProgress()

    await run(provider, progress=progress)

    assert progress.messages[1:4] == [
        tool_result("c1", '{"n": 1}'),
        tool_result("c2", "error: there is no tool named 'missing'", name="missing"),
        tool_result("c3", '{"n": 3}'),
    ]
    assert [m.tool_call_id for m in provider.calls[1].messages[-3:]] == ["c1", "c2", "c3"]
    assert progress.final_text == "done"


async def test_after_the_iteration_cap_the_model_must_answer_without_tools() -> None:
    provider = ScriptedProvider(
        use_tools(call("c1", "echo")),
        use_tools(call("c2", "echo")),
        use_tools(call("c3", "echo"), content="Best I can say: noon."),
    )
    progress = TurnProgress()

    text = await run(provider, progress=progress, max_iterations=2)

    assert text == "Best I can say: noon."
    first, second, last = provider.calls
    assert first.tool_names == second.tool_names == ["echo"]
    assert last.tools == ()
    assert last.messages[-1] == ChatMessage(Role.SYSTEM, ITERATION_CAP_NOTE)
    assert all(ITERATION_CAP_NOTE not in m.content for m in second.messages)
    # The calls of the capped answer are never run, and never stored as open calls.
    assert progress.messages[-1] == assistant("Best I can say: noon.")
    assert [m.tool_call_id for m in progress.messages if m.role is Role.TOOL] == ["c1", "c2"]


async def test_with_no_iterations_allowed_the_first_call_has_no_tools() -> None:
    provider = ScriptedProvider(answer("hi"), answer("hi again"))

    await run(provider, ToolRegistry([EchoTool()]), max_iterations=0)
    await run(provider, ToolRegistry(), max_iterations=0)

    with_tools, without_tools = provider.calls
    assert with_tools.tools == without_tools.tools == ()
    assert with_tools.messages[-1] == ChatMessage(Role.SYSTEM, ITERATION_CAP_NOTE)
    assert without_tools.messages == CONTEXT


async def test_streamed_tokens_reach_on_token_and_partial_is_cleared() -> None:
    provider = ScriptedProvider(
        use_tools(call("c1", "echo"), content="Let me look."), answer("It is noon."), piece_chars=3
    )
    progress = TurnProgress()
    seen: list[tuple[str, str]] = []

    async def on_token(token: str) -> None:
        seen.append((token, "".join(progress.partial)))

    await run_tool_loop(
        provider,
        CONTEXT,
        ToolRegistry([EchoTool()]),
        CTX,
        progress,
        max_iterations=4,
        on_token=on_token,
    )

    assert "".join(t for t, _ in seen) == "Let me look.It is noon."
    assert seen[:3] == [("Let", "Let"), (" me", "Let me"), (" lo", "Let me lo")]
    # The partial text starts over with each model call...
    assert ("It ", "It ") in seen
    # ...and nothing is left in flight once the loop returns.
    assert progress.partial == []
    assert all(c.streamed for c in provider.calls)


async def test_calls_stream_for_the_partial_text_unless_nobody_reads_it() -> None:
    kept = ScriptedProvider(use_tools(call("c1", "echo")), answer("It is noon."))
    await run(kept)  # no callback, but a turn cut off would keep its partial text
    assert [c.streamed for c in kept.calls] == [True, True]

    unread = ScriptedProvider(use_tools(call("c1", "echo")), answer("It is noon."))
    progress = TurnProgress()
    done = await run_tool_loop(
        unread,
        CONTEXT,
        ToolRegistry([EchoTool()]),
        CTX,
        progress,
        max_iterations=4,
        partial=False,
    )
    assert done == "It is noon."
    assert [c.streamed for c in unread.calls] == [False, False]

    # A callback always gets the stream.
    tokens = Tokens()
    read = ScriptedProvider(answer("It is noon."))
    await run_tool_loop(
        read,
        CONTEXT,
        ToolRegistry(),
        CTX,
        TurnProgress(),
        max_iterations=4,
        on_token=tokens,
        partial=False,
    )
    assert [c.streamed for c in read.calls] == [True]
    assert tokens.text == "It is noon."


async def test_streaming_without_a_callback_still_tracks_nothing_after_return() -> None:
    progress = TurnProgress()
    await run(ScriptedProvider(answer("abcdefgh")), progress=progress)
    assert progress.partial == []


async def test_steer_messages_are_injected_after_a_tool_round() -> None:
    provider = ScriptedProvider(use_tools(call("c1", "echo")), answer("Noon, in Paris too."))
    steer = QueueSteer("also for Paris", "and quickly")
    progress = TurnProgress()

    await run(provider, progress=progress, steer=steer)

    assert progress.steered == 2
    assert steer.waiting == []
    assert progress.messages[2:4] == [user("also for Paris"), user("and quickly")]
    assert provider.calls[1].messages[-2:] == (user("also for Paris"), user("and quickly"))


async def test_steer_is_asked_after_every_tool_round() -> None:
    steer = QueueSteer()
    provider = ScriptedProvider(
        use_tools(call("c1", "echo")), use_tools(call("c2", "echo")), answer("done")
    )
    progress = TurnProgress()

    await run(provider, progress=progress, steer=steer)

    assert steer.takes == 2
    assert progress.steered == 0
    assert all(m.role is not Role.USER for m in progress.messages)


async def test_steer_is_left_waiting_when_the_model_answers_without_tools() -> None:
    steer = QueueSteer("one more thing")
    progress = TurnProgress()

    await run(ScriptedProvider(answer("It is noon.")), progress=progress, steer=steer)

    assert steer.takes == 0
    assert steer.waiting == ["one more thing"]
    assert progress.steered == 0


async def test_steer_arriving_during_the_final_answer_is_left_for_the_next_turn() -> None:
    stall = Stall(tokens=("It is",), then=answer("It is noon."))
    steer = QueueSteer()
    provider = ScriptedProvider(use_tools(call("c1", "echo")), stall)
    progress = TurnProgress()
    task = asyncio.create_task(run(provider, progress=progress, steer=steer))

    await stall.reached.wait()
    steer.push("actually, Paris time")
    stall.release.set()
    text = await task

    assert text == "It is noon."
    assert steer.waiting == ["actually, Paris time"]
    assert progress.steered == 0


async def test_usage_keeps_the_latest_prompt_and_sums_completions() -> None:
    provider = ScriptedProvider(
        use_tools(call("c1", "echo"), usage=Usage(100, 10)),
        use_tools(call("c2", "echo")),  # a call that reports nothing
        answer("done", usage=Usage(180, 25)),
    )
    progress = TurnProgress()

    await run(provider, progress=progress)

    assert progress.usage == Usage(prompt_tokens=180, completion_tokens=35)
    stored = progress.result("completed")
    assert (stored.prompt_tokens, stored.completion_tokens) == (180, 35)


async def test_no_usage_reported_means_none() -> None:
    progress = TurnProgress()
    await run(ScriptedProvider(answer("x")), progress=progress)
    assert progress.usage is None
    assert progress.result("completed").prompt_tokens is None


async def test_a_model_error_propagates_and_earlier_messages_stay() -> None:
    provider = ScriptedProvider(use_tools(call("c1", "echo")), LLMUnavailable("down"))
    progress = TurnProgress()

    with pytest.raises(LLMUnavailable, match="down"):
        await run(provider, progress=progress)

    assert [m.role for m in progress.messages] == [Role.ASSISTANT, Role.TOOL]
    result = progress.result("failed", error="down")
    assert result.status == "failed"
    assert result.error == "down"
    assert result.messages == tuple(progress.messages)


async def test_cancelling_mid_call_keeps_the_partial_text_marked_interrupted(
    sql_store: Store,
) -> None:
    asked = call("c1", "echo", {"q": 1})
    stall = Stall(tokens=("It is ", "twelve"))
    provider = ScriptedProvider(use_tools(asked, content="Checking."), stall)
    tokens = Tokens()
    progress = TurnProgress()
    task = asyncio.create_task(run(provider, progress=progress, tokens=tokens))

    await stall.reached.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert tokens.text == "Checking.It is twelve"
    assert progress.partial == ["It is ", "twelve"]
    result = progress.result("interrupted", "cancelled")
    complete = [
        ChatMessage(Role.ASSISTANT, "Checking.", tool_calls=(asked,)),
        tool_result("c1", '{"q": 1}'),
    ]
    assert result.status == "interrupted"
    assert result.error == "cancelled"
    assert result.messages == (
        *complete,
        ChatMessage(Role.ASSISTANT, "It is twelve", interrupted=True),
    )

    # Stored and read back, the complete messages and the interrupted partial are intact.
    session = await open_session(sql_store)
    turn_id, _ = await start_turn(sql_store, session.id, user("what time is it?"))
    await finish_turn(sql_store, session.id, turn_id, result)
    history = await sql_store.load_history(session.id, 10)
    assert [(m.role, m.content, m.interrupted) for m in history.messages] == [
        (Role.USER, "what time is it?", False),
        (Role.ASSISTANT, "Checking.", False),
        (Role.TOOL, '{"q": 1}', False),
        (Role.ASSISTANT, "It is twelve", True),
    ]
    assert history.messages[1].tool_calls == (asked,)
    assert history.messages[2].tool_call_id == "c1"
    assert await sql_store.turn_status(turn_id) == "interrupted"


async def test_cancelling_during_a_tool_leaves_a_call_that_the_next_context_drops(
    sql_store: Store,
) -> None:
    waiting = BlockingTool()
    asked = call("c1", "wait")
    provider = ScriptedProvider(use_tools(asked))
    progress = TurnProgress()
    task = asyncio.create_task(run(provider, ToolRegistry([waiting]), progress))

    await waiting.entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    result = progress.result("interrupted")
    assert result.messages == (ChatMessage(Role.ASSISTANT, "", tool_calls=(asked,)),)

    session = await open_session(sql_store)
    turn_id, _ = await start_turn(sql_store, session.id, user("wait for it"))
    await finish_turn(sql_store, session.id, turn_id, result)
    context = build_context("soul", session, await sql_store.load_history(session.id, 10))
    assert [(m.role, m.content) for m in context[1:]] == [(Role.USER, "wait for it")]


def test_a_blank_partial_is_not_kept() -> None:
    progress = TurnProgress(messages=[assistant("done")], partial=["  ", "\n"])
    assert progress.result("interrupted").messages == (assistant("done"),)


def test_a_completed_turn_never_keeps_a_partial() -> None:
    progress = TurnProgress(messages=[assistant("done")], partial=["stale"])
    assert progress.result("completed").messages == (assistant("done"),)


def test_a_failed_turn_keeps_its_partial_marked_interrupted() -> None:
    progress = TurnProgress(partial=["It is", " no"])
    assert progress.result("failed", "boom").messages == (
        ChatMessage(Role.ASSISTANT, "It is no", interrupted=True),
    )


def test_final_text_is_the_last_answer_without_tool_calls() -> None:
    progress = TurnProgress()
    assert progress.final_text == ""
    progress.messages.append(assistant("first"))
    progress.messages.append(ChatMessage(Role.ASSISTANT, "look", tool_calls=(call("c", "x"),)))
    assert progress.final_text == "first"
