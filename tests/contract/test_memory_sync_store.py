"""The memory sync queue's SQL on SQLite and PostgreSQL: heads per person in order, retry
times, dead rows, counts, and linked identities taking over a person's rows."""

from __future__ import annotations

from datetime import timedelta

from gateway.contracts.ids import SessionId, UserId
from gateway.contracts.messages import utcnow
from gateway.store import Store
from gateway.store import memory_sync as sql
from gateway.store.memory_sync import SyncKind


async def _queue(store: Store, person: str, text: str) -> int:
    async with store.write() as conn:
        return await sql.enqueue(
            conn,
            UserId(person),
            SyncKind.TURN,
            {"messages": [{"speaker": "person", "content": text}]},
            session_key=f"api:default:{person}",
            session_id=SessionId(1),
        )


async def test_only_each_persons_oldest_live_sync_is_due(store: Store) -> None:
    a1 = await _queue(store, "u_a", "one")
    a2 = await _queue(store, "u_a", "two")
    b1 = await _queue(store, "u_b", "uno")
    now = utcnow() + timedelta(seconds=1)
    async with store.read() as conn:
        heads = await sql.heads(conn, now)
    assert [h.id for h in heads] == [a1, b1]
    assert heads[0].payload == {"messages": [{"speaker": "person", "content": "one"}]}
    assert heads[0].kind is SyncKind.TURN

    later = utcnow() + timedelta(minutes=5)
    async with store.write() as conn:
        await sql.sent(conn, a1)
        await sql.retry(conn, b1, "Honcho is unreachable", later)
    async with store.read() as conn:
        heads = await sql.heads(conn, now)
        due = await sql.next_due(conn)
    assert [h.id for h in heads] == [a2]  # b waits for its backoff, and holds only itself
    assert due is not None
    assert due <= now

    async with store.write() as conn:
        await sql.sent(conn, a2)
    async with store.read() as conn:
        assert await sql.next_due(conn) == later
        (b,) = await sql.queued(conn)
    assert (b.id, b.attempts, b.last_error) == (b1, 1, "Honcho is unreachable")


async def test_a_dead_sync_is_kept_and_lets_the_next_one_go(store: Store) -> None:
    first = await _queue(store, "u_a", "one")
    second = await _queue(store, "u_a", "two")
    async with store.write() as conn:
        await sql.give_up(conn, first, "too old")
    async with store.read() as conn:
        heads = await sql.heads(conn, utcnow() + timedelta(seconds=1))
        counts = await sql.counts(conn)
        (dead,) = await sql.dead(conn)
    assert [h.id for h in heads] == [second]
    assert (counts.queued, counts.dead) == (1, 1)
    assert counts.oldest_queued is not None
    assert dead.id == first
    assert dead.dead_at is not None
    assert dead.last_error == "too old"


async def test_linking_identities_gives_the_kept_user_the_merged_ones_syncs(
    store: Store,
) -> None:
    alice = await store.resolve_user("telegram", "1")
    other = await store.resolve_user("slack", "U1")
    await _queue(store, alice, "on telegram")
    await _queue(store, other, "on slack")
    kept, merged = await store.link_identities(("telegram", "1"), ("slack", "U1"))
    assert (kept, merged) == (alice, other)
    async with store.read() as conn:
        rows = await sql.queued(conn, alice)
        theirs = await sql.queued(conn, other)
    assert [r.payload["messages"][0]["content"] for r in rows] == ["on telegram", "on slack"]
    assert theirs == []


def test_the_module_implements_its_protocol() -> None:
    from gateway.store import abc

    queue: abc.MemorySyncQueue = sql
    members = {n for n in vars(abc.MemorySyncQueue) if not n.startswith("_")}
    assert [n for n in members if not hasattr(queue, n)] == []
