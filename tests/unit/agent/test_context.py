"""Building the prompt: system prompt, sanitize, build_context, estimate_tokens."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from agent_core.context import BASE_PROMPT, build_context, estimate_tokens, sanitize, system_prompt
from gateway.contracts.history import ChatMessage, History, Role, SessionInfo
from gateway.contracts.ids import SessionId, SessionKey, UserId
from tests.unit.agent.fakes import call
from tests.unit.agent.transcripts import assistant, user

NOW = datetime(2025, 1, 2, 3, 4, tzinfo=UTC)
SESSION = SessionInfo(
    id=SessionId(1),
    key=SessionKey("test:bot:chat"),
    epoch=0,
    platform="test",
    user_id=UserId("u_ada"),
    busy_mode=None,
    user_snapshot="- Name: Ada\n",
    memory_snapshot="- thesis due in May\n",
    created_at=NOW,
    updated_at=NOW,
    message_count=0,
)


def asks(*call_ids: str, content: str = "") -> ChatMessage:
    """An assistant message asking for tool calls with these ids."""
    return ChatMessage(
        Role.ASSISTANT, content, tool_calls=tuple(call(i, "clock") for i in call_ids)
    )


def result(call_id: str, text: str = "12:00") -> ChatMessage:
    """The tool result for `call_id`."""
    return ChatMessage(Role.TOOL, text, tool_call_id=call_id, name="clock")


# system prompt -------------------------------------------------------------------------------


def test_system_prompt_has_base_soul_snapshots_and_summary_in_order() -> None:
    prompt = system_prompt("You are Jeeves.", SESSION, "  ## Goal\n- plan a trip  ")

    assert prompt == (
        f"{BASE_PROMPT}\n\n"
        "# Persona (SOUL.md)\nYou are Jeeves.\n\n"
        "# About the user (USER.md)\n- Name: Ada\n\n"
        "# Your notes (MEMORY.md)\n- thesis due in May\n\n"
        "# Summary of the conversation so far\n## Goal\n- plan a trip"
    )


def test_system_prompt_leaves_out_empty_sections() -> None:
    empty = replace(SESSION, user_snapshot=" \n", memory_snapshot="")

    prompt = system_prompt("You are Jeeves.", empty, None)

    assert prompt == f"{BASE_PROMPT}\n\n# Persona (SOUL.md)\nYou are Jeeves."
    assert system_prompt("You are Jeeves.", None, "") == prompt


def test_system_prompt_shows_only_the_memory_snapshot_when_user_md_is_empty() -> None:
    prompt = system_prompt("soul", replace(SESSION, user_snapshot=""), None)
    assert "USER.md" not in prompt
    assert "# Your notes (MEMORY.md)\n- thesis due in May" in prompt


def test_build_context_is_system_then_sanitized_history_then_extra() -> None:
    history = History(
        summary="earlier: talked about ferns",
        messages=(user("hi"), asks("orphan"), assistant("hello")),
    )
    extra = [user("and now?")]

    context = build_context("soul", SESSION, history, extra)

    assert context[0].role is Role.SYSTEM
    assert context[0].content == system_prompt("soul", SESSION, "earlier: talked about ferns")
    assert context[1:] == [user("hi"), assistant("hello"), user("and now?")]


def test_build_context_of_an_empty_history_is_the_system_message() -> None:
    context = build_context("soul", None, History(None, ()))
    assert [m.role for m in context] == [Role.SYSTEM]


# sanitize ------------------------------------------------------------------------------------


def test_sanitize_keeps_complete_tool_exchanges() -> None:
    messages = [user("time?"), asks("a", "b"), result("a"), result("b", "13:00"), assistant("ok")]
    assert sanitize(messages) == messages


def test_sanitize_drops_a_tool_call_message_without_results() -> None:
    # An interrupted turn stopped between the call and its result.
    messages = [user("time?"), asks("a"), user("never mind")]
    assert sanitize(messages) == [user("time?"), user("never mind")]


def test_sanitize_keeps_the_text_of_a_call_message_without_results() -> None:
    messages = [user("time?"), asks("a", content="Let me check."), user("never mind")]
    assert sanitize(messages) == [user("time?"), assistant("Let me check."), user("never mind")]


def test_sanitize_drops_only_the_unanswered_calls_of_a_message() -> None:
    messages = [user("time?"), asks("a", "b"), result("b"), assistant("ok")]

    cleaned = sanitize(messages)

    assert cleaned == [user("time?"), asks("b"), result("b"), assistant("ok")]


def test_sanitize_drops_orphan_results_at_the_start_of_a_window() -> None:
    # The window begins in the middle of a tool exchange.
    messages = [result("a"), result("b"), assistant("it is noon"), user("thanks")]
    assert sanitize(messages) == [assistant("it is noon"), user("thanks")]


def test_sanitize_drops_a_result_whose_call_is_not_the_one_open() -> None:
    messages = [user("q"), asks("a"), result("a"), user("more"), result("a")]
    assert sanitize(messages) == [user("q"), asks("a"), result("a"), user("more")]


def test_sanitize_keeps_plain_conversations_as_they_are() -> None:
    messages = [ChatMessage(Role.SYSTEM, "note"), user("a"), assistant("b"), user("c")]
    assert sanitize(messages) == messages
    assert sanitize([]) == []


def test_sanitize_drops_an_unanswered_call_whose_id_was_used_in_an_earlier_turn() -> None:
    messages = [
        user("time?"),
        asks("call_0"),
        result("call_0"),
        assistant("noon"),
        user("and now?"),
        asks("call_0"),  # interrupted before its result
    ]
    assert sanitize(messages) == messages[:5]


def test_sanitize_drops_a_call_whose_only_result_came_before_it() -> None:
    messages = [result("a"), asks("a"), user("q")]
    assert sanitize(messages) == [user("q")]


# estimate_tokens -----------------------------------------------------------------------------


def test_estimate_tokens_is_about_characters_over_four() -> None:
    text = "x" * 4_000
    assert estimate_tokens([user(text)]) == (4_000 + 16) // 4
    assert estimate_tokens([]) == 0


def test_estimate_tokens_counts_tool_call_names_and_arguments() -> None:
    plain = ChatMessage(Role.ASSISTANT, "")
    calling = ChatMessage(Role.ASSISTANT, "", tool_calls=(call("id", "clock", '{"zone": "UTC"}'),))
    assert (
        estimate_tokens([calling]) - estimate_tokens([plain])
        == (len("clock") + len('{"zone": "UTC"}')) // 4
    )


def test_estimate_tokens_grows_with_every_message() -> None:
    one = estimate_tokens([user("a" * 400)])
    two = estimate_tokens([user("a" * 400), assistant("b" * 400)])
    assert one == 104
    assert two == 208
