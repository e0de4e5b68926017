"""The lanes contract (`gateway.store.abc.Lanes`), run over the one-process lanes and the SQL
lanes on every store; then what only SQL lanes do: take over a dead owner's work."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from sqlalchemy import insert, select

from gateway.cluster.lanes import Lanes, SoloLanes
from gateway.contracts.errors import LeaseLost
from gateway.contracts.history import ChatMessage, Role
from gateway.contracts.ids import SessionKey, TurnId
from gateway.contracts.messages import utcnow
from gateway.store import Store
from gateway.store import inbox as inbox_sql
from gateway.store.inbox import Outcome
from gateway.store.instances import Membership
from gateway.store.lanes import SqlLanes
from gateway.store.store import record_start
from gateway.store.tables import inbox, sessions, turns
from tests.fakes.clock import FakeClock

pytestmark = pytest.mark.timeout(60)

TTL = 10.0
KEY = SessionKey("test:default:chat-1")
OWNER = "herald-a"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(utcnow())


def later(clock: FakeClock, seconds: float) -> None:
    clock.set(clock.now() + timedelta(seconds=seconds))


@pytest.fixture(params=["solo", "sql"])
async def lanes(
    request: pytest.FixtureRequest, store: Store, clock: FakeClock
) -> AsyncIterator[Lanes]:
    """Each implementation of `Lanes`, held by a registered live instance `OWNER`."""
    if request.param == "solo":
        yield SoloLanes()
        return
    await _instance(store, clock, OWNER)
    yield SqlLanes(store, OWNER, TTL, now=clock.now)


# the contract ---------------------------------------------------------------------------------


async def test_clustered_is_a_property_of_the_lanes(lanes: Lanes) -> None:
    assert lanes.clustered is isinstance(lanes, SqlLanes)


async def test_a_free_lane_is_granted_and_its_claim_holds(lanes: Lanes, store: Store) -> None:
    claim = await lanes.claim(KEY)
    assert claim is not None
    assert claim.key == KEY
    async with store.write() as conn:
        await lanes.check(conn, claim, None)
        state = await lanes.state(conn, KEY)
    assert state.owner in (None, OWNER), "no other instance holds it"
    assert not state.running
    assert await lanes.cancel_requested(claim) is None


async def test_a_released_lane_is_granted_again(lanes: Lanes, store: Store) -> None:
    first = await lanes.claim(KEY)
    assert first is not None
    await lanes.release(first)
    second = await lanes.claim(KEY)
    assert second is not None
    async with store.write() as conn:
        await lanes.check(conn, second, None)


async def test_an_unclaimed_lane_has_no_owner_and_runs_nothing(lanes: Lanes, store: Store) -> None:
    async with store.read() as conn:
        state = await lanes.state(conn, SessionKey("test:default:nobody"))
    assert (state.owner, state.running, state.turn_id) == (None, False, None)


async def test_nothing_is_orphaned_on_an_empty_store(lanes: Lanes) -> None:
    assert await lanes.orphans() == []
    assert await lanes.orphans(started=True) == []


# SqlLanes: takeover of a dead owner's work ----------------------------------------------------


async def _instance(store: Store, clock: FakeClock, name: str) -> Membership:
    member = Membership(store, name, TTL, now=clock.now)
    member.host = f"host-{name}"
    await member.register()
    return member


async def _running_turn(store: Store, lanes: SqlLanes, claim_token: int) -> TurnId:
    """A session with a turn running on `lanes`' owner, and its message taken."""
    now = utcnow()
    async with store.write() as conn:
        session_id = (
            await conn.execute(
                insert(sessions)
                .values(key=KEY, epoch=0, platform="test", created_at=now, updated_at=now)
                .returning(sessions.c.id)
            )
        ).scalar_one()
        turn_id, _ = await record_start(conn, session_id, [ChatMessage(Role.USER, "hi")])
        await conn.execute(
            insert(inbox).values(
                platform="test",
                account="default",
                platform_message_id="m1",
                session_key=KEY,
                chat_id="chat-1",
                sender_id="u1",
                text="hi",
                received_at=now,
                accepted_at=now,
                status="running",
                turn_id=turn_id,
            )
        )
    return turn_id


async def test_a_lane_has_one_owner_and_a_dead_owners_work_is_taken_over(
    store: Store, clock: FakeClock
) -> None:
    await _instance(store, clock, "a")
    b_member = await _instance(store, clock, "b")
    a = SqlLanes(store, "a", TTL, now=clock.now)
    b = SqlLanes(store, "b", TTL, now=clock.now)
    claim = await a.claim(KEY)
    assert claim is not None
    turn_id = await _running_turn(store, a, claim.token)
    async with store.write() as conn:
        await a.check(conn, claim, turn_id)
    assert await b.claim(KEY) is None
    async with store.read() as conn:
        state = await b.state(conn, KEY)
    assert (state.owner, state.running) == ("a", True)
    assert KEY not in await b.orphans()

    # a stops beating; b keeps beating and takes the session over.
    later(clock, TTL / 2)
    assert await b_member.beat([])
    later(clock, TTL / 2 + 1)
    assert KEY in await b.orphans()
    taken = await b.claim(KEY)
    assert taken is not None
    assert taken.token == claim.token + 1
    async with store.read() as conn:
        assert await conn.scalar(select(turns.c.status).where(turns.c.id == turn_id)) == (
            "interrupted"
        )
        assert await conn.scalar(select(inbox.c.status)) == "pending"
        assert (await b.state(conn, KEY)).owner == "b"
    # a wakes: whatever it tries to store for the session is refused.
    with pytest.raises(LeaseLost):
        async with store.write() as conn:
            await a.check(conn, claim, None)


async def test_a_released_lane_is_free_and_waiting_messages_make_it_an_orphan(
    store: Store, clock: FakeClock
) -> None:
    await _instance(store, clock, "a")
    a = SqlLanes(store, "a", TTL, now=clock.now)
    b = SqlLanes(store, "b", TTL, now=clock.now)
    claim = await a.claim(KEY)
    assert claim is not None
    await _running_turn(store, a, claim.token)
    assert KEY not in await b.orphans(), "held by a live instance"
    await a.release(claim)
    assert KEY in await b.orphans(), "its message waits and nobody holds the lane"
    assert await b.claim(KEY) is not None


async def test_a_stopped_instance_s_lanes_are_taken_over_at_once(
    store: Store, clock: FakeClock
) -> None:
    a_member = await _instance(store, clock, "a")
    await _instance(store, clock, "b")
    a = SqlLanes(store, "a", TTL, now=clock.now)
    b = SqlLanes(store, "b", TTL, now=clock.now)
    assert await a.claim(KEY) is not None
    await a_member.leave()
    assert await b.claim(KEY) is not None


async def test_a_released_lane_keeps_its_token_so_an_old_claim_never_passes_again(
    store: Store, clock: FakeClock
) -> None:
    await _instance(store, clock, "a")
    a = SqlLanes(store, "a", TTL, now=clock.now)
    first = await a.claim(KEY)
    assert first is not None
    await a.release(first)
    second = await a.claim(KEY)
    assert second is not None
    assert second.token == first.token + 1
    with pytest.raises(LeaseLost):
        async with store.write() as conn:
            await a.check(conn, first, None)
    async with store.write() as conn:
        await a.check(conn, second, None)
    await a.release(second)
    assert KEY not in await a.orphans(), "a free lane with nothing waiting is nobody's work"


async def _command(store: Store, status: str, claimed_by: str | None) -> None:
    now = utcnow()
    async with store.write() as conn:
        await conn.execute(
            insert(inbox).values(
                platform="test",
                account="default",
                platform_message_id=f"cmd-{claimed_by}",
                session_key=KEY,
                chat_id="chat-1",
                sender_id="u1",
                text="/new",
                kind="command",
                received_at=now,
                accepted_at=now,
                status=status,
                claimed_by=claimed_by,
            )
        )


async def test_a_command_running_on_a_live_instance_is_not_given_back_by_a_claim(
    store: Store, clock: FakeClock
) -> None:
    await _instance(store, clock, "a")
    b = SqlLanes(store, "b", TTL, now=clock.now)
    await _command(store, "running", "a")
    assert KEY not in await b.orphans(), "a runs it"
    claim = await b.claim(KEY)  # b claims the lane for a message of its own
    assert claim is not None
    async with store.read() as conn:
        assert await conn.scalar(select(inbox.c.status)) == "running", "never run twice"


async def test_a_command_left_running_by_a_gone_instance_is_given_back(
    store: Store, clock: FakeClock
) -> None:
    a_member = await _instance(store, clock, "a")
    b = SqlLanes(store, "b", TTL, now=clock.now)
    await _command(store, "running", "a")
    await a_member.leave()
    assert KEY in await b.orphans()
    assert await b.claim(KEY) is not None
    async with store.read() as conn:
        row = (await conn.execute(select(inbox.c.status, inbox.c.claimed_by))).one()
    assert tuple(row) == ("pending", None)


async def test_a_batch_settled_by_stop_after_it_was_read_is_not_taken(store: Store) -> None:
    """`take` moves only rows still pending: a /stop between reading a batch and starting
    its turn wins, and the turn is not started (the caller rolls back and reads again)."""
    await _command(store, "pending", None)
    now = utcnow()
    async with store.write() as conn:
        ids = [
            (
                await conn.execute(
                    insert(inbox)
                    .values(
                        platform="test",
                        account="default",
                        platform_message_id=f"m{i}",
                        session_key=KEY,
                        chat_id="chat-1",
                        sender_id="u1",
                        text=f"message {i}",
                        received_at=now,
                        accepted_at=now,
                        status="pending",
                    )
                    .returning(inbox.c.id)
                )
            ).scalar_one()
            for i in range(2)
        ]
    async with store.write() as conn:
        assert await inbox_sql.settle(conn, ids[:1], Outcome.DROPPED, only_pending=True) == 1
    async with store.write() as conn:
        session_id = (
            await conn.execute(
                insert(sessions)
                .values(key=KEY, epoch=0, platform="test", created_at=now, updated_at=now)
                .returning(sessions.c.id)
            )
        ).scalar_one()
        turn_id, _ = await record_start(conn, session_id, [])
        assert await inbox_sql.take(conn, ids, turn_id) == 1
