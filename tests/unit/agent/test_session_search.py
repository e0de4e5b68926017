"""SessionSearchTool against a real SQLite store: search, recent sessions, scoping."""

from __future__ import annotations

from typing import Any

import pytest

from agent_core.tools import SessionSearchTool, ToolContext, ToolError, ToolRegistry
from agent_core.tools.session_search import EXCERPT_CHARS, MAX_LIMIT
from gateway.contracts.history import ChatMessage, Role, SessionInfo
from gateway.contracts.ids import UserId
from gateway.store import Store
from tests.unit.agent.fakes import call
from tests.unit.agent.transcripts import add_turn, open_session


def as_owner(session: SessionInfo) -> ToolContext:
    """The context of a tool call made in `session`."""
    return ToolContext(session=session, user_id=session.user_id)


async def users(store: Store) -> tuple[UserId, UserId]:
    """Two people: Ada and Bob."""
    return (
        await store.resolve_user("telegram", "1", "Ada"),
        await store.resolve_user("telegram", "2", "Bob"),
    )


async def test_a_match_comes_with_its_surrounding_turns(sql_store: Store) -> None:
    ada, _ = await users(sql_store)
    session = await open_session(sql_store, "telegram:bot:1", user_id=ada)
    await add_turn(sql_store, session, "what is a good houseplant", "try a pothos")
    await add_turn(sql_store, session, "do ferns need much light", "ferns like shade")
    await add_turn(sql_store, session, "thanks", "you are welcome")
    await add_turn(sql_store, session, "unrelated later question", "unrelated later answer")

    result = await SessionSearchTool(sql_store)({"query": "pothos"}, as_owner(session))

    lines = result.splitlines()
    assert lines[0].startswith("## telegram:bot:1 at ")
    assert lines[0].endswith(" UTC")
    assert lines[1] == "match (assistant): try a «pothos»"
    assert lines[2:] == [
        "user: what is a good houseplant",
        "assistant: try a pothos",
        "user: do ferns need much light",
        "assistant: ferns like shade",
    ]


async def test_every_hit_gets_a_block(sql_store: Store) -> None:
    ada, _ = await users(sql_store)
    session = await open_session(sql_store, "telegram:bot:1", user_id=ada)
    await add_turn(sql_store, session, "do ferns need much light", "ferns like shade")

    result = await SessionSearchTool(sql_store)({"query": "ferns"}, as_owner(session))

    blocks = result.split("\n\n")
    assert len(blocks) == 2
    assert sorted(b.splitlines()[1] for b in blocks) == [
        "match (assistant): «ferns» like shade",
        "match (user): do «ferns» need much light",
    ]


async def test_surrounding_tool_messages_are_left_out(sql_store: Store) -> None:
    ada, _ = await users(sql_store)
    session = await open_session(sql_store, "telegram:bot:1", user_id=ada)
    asked = ChatMessage(Role.ASSISTANT, "", tool_calls=(call("c1", "clock"),))
    answered = ChatMessage(Role.TOOL, "TOOL-OUTPUT 12:00", tool_call_id="c1", name="clock")
    await add_turn(sql_store, session, "what time is it", asked, answered, "it is noon")

    result = await SessionSearchTool(sql_store)({"query": "noon"}, as_owner(session))

    assert "TOOL-OUTPUT" not in result
    assert "assistant: it is noon" in result.splitlines()


async def test_the_surrounding_turns_skip_the_tool_exchange(sql_store: Store) -> None:
    ada, _ = await users(sql_store)
    session = await open_session(sql_store, "telegram:bot:1", user_id=ada)
    asked = ChatMessage(Role.ASSISTANT, "", tool_calls=(call("c1", "clock"),))
    answered = ChatMessage(Role.TOOL, "TOOL-OUTPUT 12:00", tool_call_id="c1", name="clock")
    await add_turn(sql_store, session, "what time is it", asked, answered, "it is noon")

    result = await SessionSearchTool(sql_store)({"query": "noon"}, as_owner(session))

    lines = result.splitlines()
    assert "user: what time is it" in lines
    assert "assistant: " not in lines


async def test_long_surrounding_messages_are_cut(sql_store: Store) -> None:
    ada, _ = await users(sql_store)
    session = await open_session(sql_store, "telegram:bot:1", user_id=ada)
    await add_turn(sql_store, session, "zebra " + "word " * 200, "ok")

    result = await SessionSearchTool(sql_store)({"query": "zebra"}, as_owner(session))

    [line] = [ln for ln in result.splitlines() if ln.startswith("user: ")]
    assert len(line) == len("user: ") + EXCERPT_CHARS + 1
    assert line.endswith("…")


async def test_another_users_transcript_never_appears(sql_store: Store) -> None:
    ada, bob = await users(sql_store)
    ada_session = await open_session(sql_store, "telegram:bot:1", user_id=ada)
    bob_session = await open_session(sql_store, "telegram:bot:2", user_id=bob)
    await add_turn(sql_store, ada_session, "my fern is dying", "water it less")
    await add_turn(sql_store, bob_session, "my secret fern diagnosis", "BOB-PRIVATE")
    tool = SessionSearchTool(sql_store)

    as_ada = await tool({"query": "fern"}, as_owner(ada_session))
    as_bob = await tool({"query": "fern"}, as_owner(bob_session))

    assert "telegram:bot:1" in as_ada
    assert "telegram:bot:2" not in as_ada
    assert "secret" not in as_ada
    assert "BOB-PRIVATE" not in as_ada
    assert "dying" not in as_bob
    assert "telegram:bot:1" not in as_bob
    assert await tool({"query": "diagnosis"}, as_owner(ada_session)) == (
        "No messages match 'diagnosis'."
    )


async def test_a_users_other_sessions_are_searched(sql_store: Store) -> None:
    ada, _ = await users(sql_store)
    telegram = await open_session(sql_store, "telegram:bot:1", user_id=ada)
    slack = await open_session(sql_store, "slack:team:D1", user_id=ada)
    await add_turn(sql_store, telegram, "remember the walrus", "noted")

    result = await SessionSearchTool(sql_store)({"query": "walrus"}, as_owner(slack))

    assert result.startswith("## telegram:bot:1 at ")


async def test_a_session_without_a_user_cannot_read_private_transcripts(
    sql_store: Store,
) -> None:
    ada, _ = await users(sql_store)
    private = await open_session(sql_store, "telegram:bot:1", user_id=ada)
    await add_turn(sql_store, private, "my bank pin is 4321", "noted")
    job = await open_session(sql_store, "cron:jobs:daily", user_id=None)
    tool = SessionSearchTool(sql_store)

    found = await tool({"query": "bank pin"}, as_owner(job))
    listed = await tool({}, as_owner(job))

    assert "4321" not in found
    assert "telegram:bot:1" not in listed


async def test_nothing_found(sql_store: Store) -> None:
    ada, _ = await users(sql_store)
    session = await open_session(sql_store, "telegram:bot:1", user_id=ada)
    await add_turn(sql_store, session, "hello", "hi")
    tool = SessionSearchTool(sql_store)

    assert await tool({"query": "quantum"}, as_owner(session)) == "No messages match 'quantum'."
    assert await tool({"query": "?!"}, as_owner(session)) == "No messages match '?!'."


async def test_without_a_query_lists_the_users_recent_sessions(sql_store: Store) -> None:
    ada, bob = await users(sql_store)
    older = await open_session(sql_store, "telegram:bot:1", user_id=ada)
    newer = await open_session(sql_store, "slack:team:D1", user_id=ada)
    bobs = await open_session(sql_store, "telegram:bot:2", user_id=bob)
    await add_turn(sql_store, older, "first", "one")
    await add_turn(sql_store, newer, "second", "two")
    await add_turn(sql_store, newer, "third", "three")
    await add_turn(sql_store, bobs, "bob", "hi bob")
    tool = SessionSearchTool(sql_store)

    result = await tool({}, as_owner(newer))

    lines = result.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("- slack:team:D1 (last active ")
    assert lines[0].endswith(" UTC, 4 messages)")
    assert lines[1].startswith("- telegram:bot:1 (last active ")
    assert lines[1].endswith(" UTC, 2 messages)")
    assert await tool({"query": "   "}, as_owner(newer)) == result
    assert await tool({"query": None, "limit": 1}, as_owner(newer)) == lines[0]


async def test_a_user_without_sessions_has_none_listed(sql_store: Store) -> None:
    ada, bob = await users(sql_store)
    session = await open_session(sql_store, "telegram:bot:2", user_id=bob)
    await add_turn(sql_store, session, "hello", "hi")

    result = await SessionSearchTool(sql_store)({}, ToolContext(session=None, user_id=ada))

    assert result == "No earlier sessions."


async def test_the_limit_is_clamped(sql_store: Store) -> None:
    ada, _ = await users(sql_store)
    session = await open_session(sql_store, "telegram:bot:1", user_id=ada)
    for i in range(MAX_LIMIT + 2):
        await add_turn(sql_store, session, f"kiwi number {i}", "ok")
    tool = SessionSearchTool(sql_store)

    many = await tool({"query": "kiwi", "limit": 1_000}, as_owner(session))
    one = await tool({"query": "kiwi", "limit": 0}, as_owner(session))
    default = await tool({"query": "kiwi"}, as_owner(session))

    assert many.count("\n## ") + 1 == MAX_LIMIT
    assert one.count("## ") == 1
    assert default.count("\n## ") + 1 == 5


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"limit": "5"}, "limit must be an integer"),
        ({"limit": 2.5}, "limit must be an integer"),
        ({"limit": True}, "limit must be an integer"),
        ({"limit": None}, "limit must be an integer"),
        ({"query": 42}, "query must be a string"),
        ({"query": ["fern"]}, "query must be a string"),
    ],
)
async def test_bad_argument_types_are_refused(
    sql_store: Store, args: dict[str, Any], message: str
) -> None:
    ada, _ = await users(sql_store)
    with pytest.raises(ToolError, match=message):
        await SessionSearchTool(sql_store)(args, ToolContext(session=None, user_id=ada))


async def test_through_the_registry(sql_store: Store) -> None:
    ada, _ = await users(sql_store)
    registry = ToolRegistry([SessionSearchTool(sql_store)])
    ctx = ToolContext(session=None, user_id=ada)

    refused = await registry.call(call("c1", "session_search", {"limit": "x"}), ctx)
    listed = await registry.call(call("c2", "session_search", {}), ctx)

    assert refused == "error: limit must be an integer"
    assert listed == "No earlier sessions."
    [spec] = registry.specs()
    assert spec["function"]["parameters"]["properties"]["limit"]["maximum"] == MAX_LIMIT
