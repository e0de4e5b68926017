"""MemoryTool: the model's edits of USER.md / MEMORY.md, through the registry."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent_core.memory import MemoryFiles, MemoryLimits, MemoryScope, person
from agent_core.tools import MemoryTool, ToolContext, ToolError, ToolRegistry
from gateway.contracts.ids import SessionKey, UserId
from gateway.store import Store
from tests.unit.agent.fakes import call

ADA = UserId("u_ada")
BOB = UserId("u_bob")
AS_ADA = ToolContext(session=None, user_id=ADA)
AS_BOB = ToolContext(session=None, user_id=BOB)
SHARED = ToolContext(session=None, user_id=None)


async def empty(*_: object) -> tuple[str, str]:
    return "", ""


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with Store.open(f"sqlite+aiosqlite:///{tmp_path / 'herald.db'}") as opened:
        yield opened


async def test_add_saves_to_the_users_file(memory: MemoryFiles) -> None:
    tool = MemoryTool(memory)
    result = await tool({"action": "add", "target": "user", "content": "Name: Ada"}, AS_ADA)

    assert result == "saved to user"
    assert await memory.read(MemoryScope.USER, person(ADA)) == "- Name: Ada\n"
    assert await memory.read(MemoryScope.USER, person(BOB)) == ""


async def test_add_to_memory_goes_to_memory_md(memory: MemoryFiles) -> None:
    tool = MemoryTool(memory)
    await tool({"action": "add", "target": "memory", "content": "thesis due in May"}, AS_ADA)

    assert await memory.read(MemoryScope.MEMORY, person(ADA)) == "- thesis due in May\n"
    assert await memory.read(MemoryScope.USER, person(ADA)) == ""


async def test_replace_and_remove(memory: MemoryFiles) -> None:
    tool = MemoryTool(memory)
    await tool({"action": "add", "target": "user", "content": "likes tea"}, AS_ADA)
    await tool({"action": "add", "target": "user", "content": "lives in Lyon"}, AS_ADA)

    replaced = await tool(
        {"action": "replace", "target": "user", "old_text": "tea", "content": "likes coffee"},
        AS_ADA,
    )
    removed = await tool({"action": "remove", "target": "user", "old_text": "Lyon"}, AS_ADA)

    assert (replaced, removed) == ("replaced in user", "removed from user")
    assert await memory.read(MemoryScope.USER, person(ADA)) == "- likes coffee\n"


async def test_without_a_user_or_group_there_is_no_memory(memory: MemoryFiles) -> None:
    tool = MemoryTool(memory)
    with pytest.raises(ToolError, match="no memory"):
        await tool({"action": "add", "target": "memory", "content": "team uses Postgres"}, SHARED)


async def test_in_a_group_edits_that_groups_own_scope(memory: MemoryFiles, store: Store) -> None:
    tool = MemoryTool(memory)
    group_a = await store.open_session(
        SessionKey("telegram:default:-100111"), platform="telegram", user_id=None, snapshot=empty
    )
    group_b = await store.open_session(
        SessionKey("telegram:default:-100222"), platform="telegram", user_id=None, snapshot=empty
    )
    in_a = ToolContext(session=group_a, user_id=None)
    await tool({"action": "add", "target": "user", "content": "Carol has asthma"}, in_a)

    assert await memory.snapshot(group_a.key, None) == ("- Carol has asthma\n", "")
    assert await memory.snapshot(group_b.key, None) == ("", "")
    assert await memory.read(MemoryScope.USER, person(ADA)) == ""


async def test_one_user_cannot_edit_anothers_entries(memory: MemoryFiles) -> None:
    tool = MemoryTool(memory)
    await tool({"action": "add", "target": "user", "content": "Ada's pin is 1234"}, AS_ADA)

    with pytest.raises(ToolError, match="no entry contains"):
        await tool({"action": "remove", "target": "user", "old_text": "pin"}, AS_BOB)

    assert await memory.read(MemoryScope.USER, person(ADA)) == "- Ada's pin is 1234\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"target": "user", "content": "x"}, "missing argument 'action'"),
        ({"action": "add", "content": "x"}, "missing argument 'target'"),
        ({"action": "add", "target": "soul", "content": "x"}, "target must be 'user' or 'memory'"),
        ({"action": "add", "target": 3, "content": "x"}, "argument 'target' must be a string"),
        ({"action": "add", "target": "user"}, "missing argument 'content'"),
        ({"action": "add", "target": "user", "content": ["x"]}, "'content' must be a string"),
        ({"action": "replace", "target": "user", "content": "x"}, "missing argument 'old_text'"),
        ({"action": "replace", "target": "user", "old_text": "x"}, "missing argument 'content'"),
        ({"action": "remove", "target": "user"}, "missing argument 'old_text'"),
        ({"action": "append", "target": "user", "content": "x"}, "action must be 'add'"),
        ({"action": 1, "target": "user"}, "argument 'action' must be a string"),
    ],
)
async def test_invalid_arguments_are_refused(
    memory: MemoryFiles, args: dict[str, Any], message: str
) -> None:
    with pytest.raises(ToolError, match=message):
        await MemoryTool(memory)(args, AS_ADA)
    assert await memory.read(MemoryScope.USER, person(ADA)) == ""


async def test_refused_edits_become_tool_errors(tmp_path: Path) -> None:
    files = MemoryFiles(tmp_path, MemoryLimits(user_max_chars=16))
    tool = MemoryTool(files)
    await tool({"action": "add", "target": "user", "content": "likes tea"}, AS_ADA)

    with pytest.raises(ToolError, match="already saved"):
        await tool({"action": "add", "target": "user", "content": "likes tea"}, AS_ADA)
    with pytest.raises(ToolError, match="user memory is full"):
        await tool({"action": "add", "target": "user", "content": "likes cake"}, AS_ADA)
    with pytest.raises(ToolError, match="no entry contains 'coffee'"):
        await tool({"action": "remove", "target": "user", "old_text": "coffee"}, AS_ADA)

    assert await files.read(MemoryScope.USER, person(ADA)) == "- likes tea\n"


async def test_through_the_registry_a_refusal_is_text_for_the_model(memory: MemoryFiles) -> None:
    registry = ToolRegistry([MemoryTool(memory)])
    args = {"action": "remove", "target": "user", "old_text": "nothing"}

    result = await registry.call(call("c1", "memory", args), AS_ADA)

    assert result == "error: no entry contains 'nothing'"


def test_the_schema_names_actions_and_targets(memory: MemoryFiles) -> None:
    [spec] = ToolRegistry([MemoryTool(memory)]).specs()
    function = spec["function"]
    parameters = function["parameters"]

    assert function["name"] == "memory"
    assert parameters["required"] == ["action", "target"]
    assert parameters["properties"]["action"]["enum"] == ["add", "replace", "remove"]
    assert parameters["properties"]["target"]["enum"] == ["user", "memory"]
