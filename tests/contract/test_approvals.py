"""The SQL of tool approvals, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gateway.contracts.messages import utcnow
from gateway.store import Store
from gateway.store import approvals as sql
from gateway.store.approvals import ApprovalStatus

pytestmark = pytest.mark.timeout(60)


def _values(call_key: str = "k1", session_key: str = "test:acct:c1") -> dict[str, object]:
    now = utcnow()
    return {
        "session_key": session_key,
        "turn_id": 7,
        "call_key": call_key,
        "tool": "t__echo",
        "arguments": '{"text": "hi"}',
        "requester": "test:alice",
        "created_at": now,
        "expires_at": now + timedelta(minutes=10),
    }


async def test_an_approval_is_asked_decided_and_used(store: Store) -> None:
    async with store.write() as conn:
        first = await sql.insert_approval(conn, _values())
        other = await sql.insert_approval(conn, _values("k2", "test:acct:c2"))
    async with store.read() as conn:
        [pending] = await sql.pending_approvals(conn, "test:acct:c1")
        found = await sql.open_approval(conn, "k1")
    assert pending.id == first != other
    assert found is not None
    assert (found.status, found.asked, found.turn_id) == (ApprovalStatus.PENDING, 1, 7)

    later = utcnow() + timedelta(minutes=20)
    async with store.write() as conn:
        await sql.ask_again(conn, first, turn_id=9, expires_at=later)
        assert await sql.decide_approval(
            conn, first, ApprovalStatus.APPROVED, by="test:alice", now=utcnow()
        )
        assert not await sql.decide_approval(
            conn, first, ApprovalStatus.DENIED, by="test:op", now=utcnow()
        ), "a decided approval stays decided"
    async with store.read() as conn:
        row = await sql.get_approval(conn, first)
        assert await sql.pending_approvals(conn, "test:acct:c1") == []
    assert row is not None
    assert (row.status, row.asked, row.turn_id, row.decided_by) == (
        ApprovalStatus.APPROVED,
        2,
        9,
        "test:alice",
    )
    assert row.expires_at == later

    async with store.write() as conn:
        await sql.close_approval(conn, first, ApprovalStatus.USED, utcnow())
    async with store.read() as conn:
        used = await sql.get_approval(conn, first)
        assert await sql.open_approval(conn, "k1") is None
        assert await sql.get_approval(conn, 999) is None
    assert used is not None
    assert used.status is ApprovalStatus.USED
    assert used.decided_by == "test:alice"


async def test_a_cancelled_question_records_when(store: Store) -> None:
    async with store.write() as conn:
        approval = await sql.insert_approval(conn, _values())
        await sql.close_approval(conn, approval, ApprovalStatus.CANCELLED, utcnow())
    async with store.read() as conn:
        row = await sql.get_approval(conn, approval)
    assert row is not None
    assert row.status is ApprovalStatus.CANCELLED
    assert row.decided_at is not None
    assert row.decided_by is None


async def test_recent_approvals_are_every_session_s_newest_first(store: Store) -> None:
    async with store.write() as conn:
        first = await sql.insert_approval(conn, _values("k1", "test:acct:c1"))
        second = await sql.insert_approval(conn, _values("k2", "test:acct:c2"))
        third = await sql.insert_approval(conn, _values("k3", "test:acct:c1"))
        await sql.decide_approval(conn, first, ApprovalStatus.DENIED, by="test:op", now=utcnow())
    async with store.read() as conn:
        rows = await sql.recent_approvals(conn)
        latest = await sql.recent_approvals(conn, limit=2)
    assert [r.id for r in rows] == [third, second, first]
    assert (rows[-1].status, rows[-1].decided_by) == (ApprovalStatus.DENIED, "test:op")
    assert [r.id for r in latest] == [third, second]
