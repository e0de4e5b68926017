"""Approval in the chat: a tool call that needs the person's yes waits for /approve."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.store import Store
from gateway.store import approvals as sql
from gateway.store.approvals import ApprovalRow, ApprovalStatus
from tests.fakes.platform import inbound
from tests.integration.mcp_rig import McpRig, mcp_rig, stdio_server, until
from tests.unit.agent.fakes import ScriptedProvider, answer, call, use_tools

pytestmark = pytest.mark.timeout(60)

GROUP = "g1"


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """SQLite here; the approval rows' SQL runs on both backends in the store tests."""
    return f"sqlite+aiosqlite:///{tmp_path / 'herald.db'}"


async def approval_rows(rig: McpRig) -> list[ApprovalRow]:
    async with rig.store.read() as conn:
        return await sql.pending_approvals(conn, f"test:acct:{GROUP}") + [
            r
            for i in range(1, 10)
            if (r := await sql.get_approval(conn, i)) is not None
            and r.status is not ApprovalStatus.PENDING
        ]


async def test_the_asker_approves_and_another_person_in_the_group_cannot(
    store: Store, tmp_path: Path
) -> None:
    llm = ScriptedProvider(
        use_tools(call("c1", "t__echo", {"text": "hi", "api_key": "sk-live-1234567890"})),
        answer("sent it"),
    )
    servers = {"t": stdio_server(approval="always", tools={"add": {"approval": "never"}})}
    async with mcp_rig(store, tmp_path, llm, servers) as rig:
        await rig.manager.accept(inbound("echo hi", chat=GROUP, sender="alice", direct=False))
        question = await rig.said(GROUP, "Approval needed")
        assert "t__echo" in question
        assert "text: hi" in question
        assert "api_key: ***" in question
        assert "sk-live" not in question
        await rig.manager.accept(inbound("/approve", chat=GROUP, sender="bob", direct=False))
        refusal = await rig.said(GROUP, "Only the person who asked")
        assert "test:alice" in refusal
        await rig.manager.accept(inbound("/approve", chat=GROUP, sender="alice", direct=False))
        await rig.said(GROUP, "✅ Approved")
        await rig.said(GROUP, "sent it")
        [row] = await approval_rows(rig)
    assert rig.tool_results() == ["[approved by test:alice]\necho: hi"]
    assert row.status is ApprovalStatus.USED
    assert row.decided_by == "test:alice"
    assert row.requester == "test:alice"
    assert row.turn_id is not None
    assert json.loads(row.arguments) == {"text": "hi", "api_key": "***"}


async def test_an_operator_in_the_chat_may_decide_for_the_asker(
    store: Store, tmp_path: Path
) -> None:
    llm = ScriptedProvider(use_tools(call("c1", "t__echo", {"text": "hi"})), answer("sent it"))
    servers = {"t": stdio_server(approval="always")}
    async with mcp_rig(store, tmp_path, llm, servers, operators=("test:carol",)) as rig:
        await rig.manager.accept(inbound("echo hi", chat=GROUP, sender="alice", direct=False))
        await rig.said(GROUP, "Approval needed")
        await rig.manager.accept(inbound("/approve", chat=GROUP, sender="carol", direct=False))
        await rig.said(GROUP, "✅ Approved")
        await rig.said(GROUP, "sent it")
        [row] = await approval_rows(rig)
    assert rig.tool_results() == ["[approved by test:carol]\necho: hi"]
    assert (row.requester, row.decided_by) == ("test:alice", "test:carol")


async def test_a_tool_whose_own_setting_says_never_runs_at_once(
    store: Store, tmp_path: Path
) -> None:
    llm = ScriptedProvider(use_tools(call("c1", "t__add", {"a": 2, "b": 3})), answer("five"))
    servers = {"t": stdio_server(approval="always", tools={"add": {"approval": "never"}})}
    async with mcp_rig(store, tmp_path, llm, servers) as rig:
        await rig.manager.accept(inbound("add", chat="c1"))
        await rig.said("c1", "five")
    assert rig.tool_results() == ["5"]


async def test_a_denied_call_does_not_run_and_the_model_is_told(
    store: Store, tmp_path: Path
) -> None:
    llm = ScriptedProvider(use_tools(call("c1", "t__pid")), answer("ok, not done"))
    servers = {"t": stdio_server(tools={"pid": {"approval": "always"}})}
    async with mcp_rig(store, tmp_path, llm, servers) as rig:
        await rig.manager.accept(inbound("pid", chat="c1"))
        question = await rig.said("c1", "Approval needed")
        number = question.split("#", 1)[1].split()[0]
        await rig.manager.accept(inbound(f"/deny {number}", chat="c1"))
        await rig.said("c1", "❌ Denied")
        await rig.said("c1", "ok, not done")
    [result] = rig.tool_results()
    assert result.startswith("error: the person declined this call of t__pid")


async def test_no_answer_in_time_means_no(store: Store, tmp_path: Path) -> None:
    llm = ScriptedProvider(use_tools(call("c1", "t__pid")), answer("too late"))
    servers = {"t": stdio_server(approval="always")}
    async with mcp_rig(store, tmp_path, llm, servers, approval_timeout=0.5) as rig:
        await rig.manager.accept(inbound("pid", chat="c1"))
        await rig.said("c1", "Approval needed")
        await rig.said("c1", "timed out")
        await rig.said("c1", "too late")
        await rig.manager.accept(inbound("/approve", chat="c1"))
        await rig.said("c1", "Nothing is waiting for approval here")
    assert "nobody approved this call of t__pid in time" in rig.tool_results()[0]


async def test_stop_while_waiting_cancels_the_question(store: Store, tmp_path: Path) -> None:
    llm = ScriptedProvider(use_tools(call("c1", "t__pid")))
    servers = {"t": stdio_server(approval="always")}
    async with mcp_rig(store, tmp_path, llm, servers) as rig:
        await rig.manager.accept(inbound("pid", chat="c1"))
        await rig.said("c1", "Approval needed")
        await rig.manager.accept(inbound("/stop", chat="c1"))
        await rig.said("c1", "Stopped")
        await until(lambda: not rig.manager.ctx.lanes)

        async def cancelled() -> bool:
            async with rig.store.read() as conn:
                row = await sql.get_approval(conn, 1)
            return row is not None and row.status is ApprovalStatus.CANCELLED

        await until(cancelled)
        await rig.manager.accept(inbound("/approve", chat="c1"))
        await rig.said("c1", "Nothing is waiting")
    assert rig.tool_results() == []


async def test_other_chats_are_answered_while_one_waits(store: Store, tmp_path: Path) -> None:
    llm = ScriptedProvider(use_tools(call("c1", "t__pid")), answer("other chat answered"))
    servers = {"t": stdio_server(approval="always")}
    async with mcp_rig(store, tmp_path, llm, servers) as rig:
        await rig.manager.accept(inbound("pid", chat="c1"))
        await rig.said("c1", "Approval needed")
        await rig.manager.accept(inbound("hello", chat="c2"))
        await rig.said("c2", "other chat answered")
        llm.add(answer("done"))
        await rig.manager.accept(inbound("/approve", chat="c1"))
        await rig.said("c1", "done")
