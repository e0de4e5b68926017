"""The sync sender against a provider that fails as told: per-person order, one person's
trouble never holding another's syncs, `retry_after` honoured, dead only past the max age,
memory-file edits and session ends going through the same queue."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from agent_core.memory import MemoryFiles, MemoryScope, person
from agent_core.memory_providers import (
    MemoryHealth,
    MemoryProvider,
    MemoryState,
    MemoryUnavailable,
    SyncedTurn,
)
from gateway.backoff import Backoff
from gateway.contracts.history import ChatMessage, Role, SessionInfo
from gateway.contracts.ids import SessionId, SessionKey, TurnId, UserId
from gateway.contracts.messages import utcnow
from gateway.memory_sync import MemoryWrites, SyncQueue, SyncSender
from gateway.store import Store
from gateway.store import memory_sync as sql

ALICE, BOB = UserId("u_alice"), UserId("u_bob")


class Recorder(MemoryProvider):
    """Takes syncs, refusing those of the people in `down` (with `retry_after`)."""

    name = "recorder"

    def __init__(self) -> None:
        self.turns: list[tuple[UserId, str, bool]] = []
        self.events: list[tuple[str, UserId, str]] = []
        self.down: set[UserId] = set()
        self.retry_after: float | None = None

    async def prefetch(self, person: UserId, query: str, *, session_key: str) -> str:
        return ""

    async def sync_turn(self, turn: SyncedTurn) -> None:
        if turn.person in self.down:
            raise MemoryUnavailable("down for this test", self.retry_after)
        self.turns.append((turn.person, turn.messages[0].content, turn.resent))

    async def on_memory_write(self, person: UserId, target: str, action: str, content: str) -> None:
        self.events.append(("write", person, f"{target}:{action}:{content}"))

    async def on_session_end(self, person: UserId, session_key: str, session_id: int) -> None:
        self.events.append(("end", person, session_key))


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with Store.open(f"sqlite+aiosqlite:///{tmp_path / 'h.db'}") as opened:
        yield opened


def session(user: UserId | None, key: str = "api:default:s") -> SessionInfo:
    now = utcnow()
    return SessionInfo(
        id=SessionId(1),
        key=SessionKey(key),
        epoch=0,
        platform="api",
        user_id=user,
        busy_mode=None,
        user_snapshot="",
        memory_snapshot="",
        created_at=now,
        updated_at=now,
        message_count=0,
    )


async def say(store: Store, user: UserId | None, text: str) -> bool:
    exchange = [ChatMessage(Role.USER, text), ChatMessage(Role.ASSISTANT, f"re: {text}")]
    async with store.write() as conn:
        return await SyncQueue().turn(conn, session(user), TurnId(1), exchange)


def sender(store: Store, provider: Recorder, *, max_age: float = 3600.0) -> SyncSender:
    return SyncSender(
        store,
        provider,
        MemoryHealth(provider.name),
        max_age=max_age,
        backoff=Backoff(initial=0.01, maximum=0.01),
    )


async def test_turns_of_a_person_go_in_order_and_a_down_person_holds_only_their_own(
    store: Store,
) -> None:
    provider = Recorder()
    for text in ("a1", "a2"):
        await say(store, ALICE, text)
    await say(store, BOB, "b1")
    await say(store, ALICE, "a3")
    assert not await say(store, None, "a group's words")  # nobody's: never queued

    provider.down = {ALICE}
    provider.retry_after = 60
    send = sender(store, provider)
    assert await send.pass_once() == 1
    assert provider.turns == [(BOB, "b1", False)]
    async with store.read() as conn:
        (head, *rest) = await sql.queued(conn, ALICE)
    assert head.next_attempt_at >= utcnow() + timedelta(seconds=55)  # Retry-After honoured
    assert len(rest) == 2

    provider.down = set()
    async with store.write() as conn:
        await sql.retry(conn, head.id, "x", utcnow())  # due now (instead of in a minute)
    assert await send.pass_once() == 3
    assert provider.turns[1:] == [(ALICE, "a1", True), (ALICE, "a2", False), (ALICE, "a3", False)]
    assert send.health.state is MemoryState.OK


async def test_a_sync_is_given_up_only_past_the_max_age(store: Store) -> None:
    provider = Recorder()
    provider.down = {ALICE}
    await say(store, ALICE, "old")
    send = sender(store, provider, max_age=3600)
    await send.pass_once()
    async with store.read() as conn:
        counts = await sql.counts(conn)
    assert (counts.queued, counts.dead) == (1, 0)

    await say(store, ALICE, "new")
    send.max_age = 0.0  # everything is too old now
    async with store.write() as conn:
        for row in await sql.queued(conn):
            await sql.retry(conn, row.id, "x", utcnow())
    await send.pass_once()
    provider.down = set()
    await send.pass_once()
    async with store.read() as conn:
        counts = await sql.counts(conn)
        dead = await sql.dead(conn)
    assert counts.dead >= 1
    assert dead[-1].payload["messages"][0]["content"] == "old"
    assert dead[-1].last_error == "down for this test"


async def test_memory_file_edits_and_session_ends_are_sent_in_order_with_turns(
    store: Store, tmp_path: Path
) -> None:
    provider = Recorder()
    queue = SyncQueue()
    files = MemoryFiles(tmp_path / "state", on_edit=MemoryWrites(store, queue))
    await say(store, ALICE, "hello there")
    await files.add(MemoryScope.USER, person(ALICE), "Likes jazz")
    await files.add(MemoryScope.USER, files.owner("test:bot:g1", None), "A group's note")
    async with store.write() as conn:
        assert await queue.session_end(conn, session(ALICE))
    await sender(store, provider).pass_once()
    assert provider.turns == [(ALICE, "hello there", False)]
    assert provider.events == [
        ("write", ALICE, "user:add:Likes jazz"),
        ("end", ALICE, "api:default:s"),
    ]
