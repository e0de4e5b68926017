"""The outbox's contract, through the `Outbox` API on SQLite and on PostgreSQL (`store`)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.contracts.history import ChatMessage, Role
from gateway.contracts.ids import (
    AccountId,
    ChatId,
    PlatformMessageId,
    SessionId,
    SessionKey,
    TurnId,
)
from gateway.contracts.messages import Attachment, SendLimits, TextFormat, utcnow
from gateway.store import Store
from gateway.store.instances import Membership
from gateway.store.outbox import (
    Chunk,
    Outbox,
    OutboxKind,
    OutboxRow,
    OutboxStatus,
    SettledReport,
    Target,
    enqueue,
    reply_chunks,
)
from gateway.store.tables import outbox as outbox_table
from tests.turns import start_turn

pytestmark = pytest.mark.timeout(60)

A = Target("test", AccountId("acct"), ChatId("a"))
B = Target("test", AccountId("acct"), ChatId("b"))
OTHER = Target("other", AccountId("acct"), ChatId("z"))
LATER = timedelta(hours=1)


def chunk(key: str, target: Target = A, text: str = "hello") -> Chunk:
    return Chunk(key, target, text)


async def no_snapshot(*_: object) -> tuple[str, str]:
    return "", ""


async def a_turn(store: Store) -> tuple[SessionId, TurnId]:
    """A real session and turn, for chunks that reference them."""
    session = await store.open_session(
        SessionKey("test:acct:a"), platform="test", user_id=None, snapshot=no_snapshot
    )
    turn_id, _ = await start_turn(store, session.id, ChatMessage(Role.USER, "hi"))
    return session.id, turn_id


async def get(box: Outbox, row_id: int) -> OutboxRow:
    row = await box.get(row_id)
    assert row is not None
    return row


async def make_sending(box: Outbox, key: str, target: Target = A) -> int:
    """A row claimed for sending whose outcome nobody recorded (as after a crash)."""
    [row_id] = await box.enqueue([chunk(key, target)])
    assert await box.claim(row_id)
    return row_id


async def age(store: Store, row_id: int, by: timedelta) -> None:
    """Make a row look `by` older than it is."""
    async with store.write() as conn:
        await conn.execute(
            update(outbox_table).where(outbox_table.c.id == row_id).values(created_at=utcnow() - by)
        )


def soon() -> datetime:
    return utcnow() + timedelta(seconds=1)


# enqueue -------------------------------------------------------------------------------------


async def test_enqueue_writes_pending_rows(store: Store) -> None:
    box = Outbox(store)
    before = utcnow()
    ids = await box.enqueue([chunk("k1", text="one"), chunk("k2", B, "two")])
    assert len(ids) == 2
    first, second = await get(box, ids[0]), await get(box, ids[1])
    assert (first.idempotency_key, first.target, first.text) == ("k1", A, "one")
    assert (second.idempotency_key, second.target, second.text) == ("k2", B, "two")
    assert first.status is OutboxStatus.PENDING
    assert first.attempts == 0
    assert not first.recovered
    assert first.kind is OutboxKind.NOTICE
    assert first.format is TextFormat.MARKDOWN
    assert first.created_at >= before - timedelta(seconds=1)
    assert first.created_at.tzinfo is not None
    assert first.next_attempt_at <= utcnow()
    assert await box.get(max(ids) + 1000) is None


async def test_enqueue_is_idempotent_by_key(store: Store) -> None:
    box = Outbox(store)
    [row_id] = await box.enqueue([chunk("same", text="first")])
    again = await box.enqueue([chunk("same", text="second"), chunk("new")])
    assert len(again) == 1
    assert again[0] != row_id
    row = await get(box, row_id)
    assert row.text == "first"
    assert await box.counts() == {"pending": 2}


async def test_enqueue_keeps_an_existing_key_whatever_its_status(store: Store) -> None:
    box = Outbox(store)
    [row_id] = await box.enqueue([chunk("k")])
    assert await box.claim(row_id)
    await box.sent(row_id, "m1", utcnow())
    assert await box.enqueue([chunk("k", text="a replay")]) == []
    row = await get(box, row_id)
    assert (row.status, row.text) == (OutboxStatus.SENT, "hello")


async def test_enqueue_in_the_callers_transaction_rolls_back_with_it(store: Store) -> None:
    box = Outbox(store)

    async def failing_turn() -> None:
        async with store.write() as conn:
            await enqueue(conn, [chunk("k")])
            raise RuntimeError("the turn failed to commit")

    with pytest.raises(RuntimeError):
        await failing_turn()
    assert await box.list() == []


# claim, sent, retry_at, dead -----------------------------------------------------------------


async def test_claim_then_sent(store: Store) -> None:
    box = Outbox(store)
    [row_id] = await box.enqueue([chunk("k")])
    assert await box.claim(row_id)
    row = await get(box, row_id)
    assert (row.status, row.attempts) == (OutboxStatus.SENDING, 1)
    assert not await box.claim(row_id), "a sending row cannot be claimed twice"
    at = utcnow()
    await box.sent(row_id, "pm-7", at)
    row = await get(box, row_id)
    assert row.status is OutboxStatus.SENT
    assert row.platform_message_id == PlatformMessageId("pm-7")
    assert row.sent_at is not None
    assert abs((row.sent_at - at).total_seconds()) < 0.001
    assert row.last_error is None
    assert not await box.claim(row_id), "a sent row cannot be claimed"


async def test_retry_at_makes_a_row_pending_later_and_counts_the_try(store: Store) -> None:
    box = Outbox(store)
    [row_id] = await box.enqueue([chunk("k")])
    assert await box.claim(row_id)
    when = utcnow() + LATER
    await box.retry_at(row_id, when, "NotReady: 502")
    row = await get(box, row_id)
    assert row.status is OutboxStatus.PENDING
    assert row.attempts == 1
    assert row.last_error == "NotReady: 502"
    assert abs((row.next_attempt_at - when).total_seconds()) < 0.001
    assert await box.due_chats(utcnow(), platforms=["test"], limit=10) == []
    assert await box.due_chats(when, platforms=["test"], limit=10) == [A.chat]
    # A later try that succeeds clears the error.
    assert await box.claim(row_id)
    await box.sent(row_id, "m", utcnow())
    row = await get(box, row_id)
    assert (row.attempts, row.last_error) == (2, None)


async def test_retry_at_without_attempt_does_not_count_the_try(store: Store) -> None:
    box = Outbox(store)
    [row_id] = await box.enqueue([chunk("k")])
    for _ in range(3):
        assert await box.claim(row_id)
        await box.retry_at(row_id, utcnow(), "rate limited", attempt=False)
    row = await get(box, row_id)
    assert (row.status, row.attempts) == (OutboxStatus.PENDING, 0)


async def test_dead(store: Store) -> None:
    box = Outbox(store)
    [row_id, other] = await box.enqueue([chunk("k"), chunk("k2")])
    assert await box.claim(row_id)
    await box.dead(row_id, "Forbidden: bot was blocked by the user")
    row = await get(box, row_id)
    assert row.status is OutboxStatus.DEAD
    assert row.last_error == "Forbidden: bot was blocked by the user"
    assert not await box.claim(row_id), "a dead letter is never sent automatically"
    assert [r.id for r in await box.list(status=OutboxStatus.DEAD)] == [row_id]
    assert [r.id for r in await box.list(status=OutboxStatus.PENDING)] == [other]
    assert await box.counts() == {"dead": 1, "pending": 1}


async def test_as_plain_and_without_edit(store: Store) -> None:
    box = Outbox(store)
    [row_id] = await box.enqueue(
        [Chunk("k", A, "**bold**", edit_of=PlatformMessageId("preview-1"))]
    )
    assert await box.claim(row_id)
    await box.as_plain(row_id, "bold")
    row = await get(box, row_id)
    assert (row.status, row.format, row.text, row.attempts) == (
        OutboxStatus.PENDING,
        TextFormat.PLAIN,
        "bold",
        0,
    )
    assert row.edit_of == PlatformMessageId("preview-1")
    assert await box.claim(row_id)
    await box.without_edit(row_id, "message to edit is gone")
    row = await get(box, row_id)
    assert (row.status, row.edit_of, row.last_error) == (
        OutboxStatus.PENDING,
        None,
        "message to edit is gone",
    )


# retry (of dead letters) ---------------------------------------------------------------------


async def test_retry_of_a_dead_letter_makes_it_pending_and_fresh(store: Store) -> None:
    box = Outbox(store)
    [row_id] = await box.enqueue([chunk("k")])
    await age(store, row_id, timedelta(days=2))
    for _ in range(2):
        assert await box.claim(row_id)
        await box.retry_at(row_id, utcnow() + LATER, "NotReady")
    assert await box.claim(row_id)
    await box.dead(row_id, "gave up after 3 tries")
    before = utcnow()
    row = await box.retry(row_id)
    assert row.id == row_id
    assert row.status is OutboxStatus.PENDING
    assert row.attempts == 0
    assert row.last_error is None
    assert row.created_at >= before - timedelta(seconds=1), "a retried letter has a fresh age"
    assert row.next_attempt_at <= utcnow()
    assert await box.due_chats(utcnow(), platforms=["test"], limit=10) == [A.chat]
    assert await get(box, row_id) == row


async def test_retry_of_anything_but_a_dead_letter_is_a_lookup_error(store: Store) -> None:
    box = Outbox(store)
    [pending, sending, sent] = await box.enqueue([chunk("p"), chunk("s"), chunk("t")])
    assert await box.claim(sending)
    assert await box.claim(sent)
    await box.sent(sent, "m", utcnow())
    for row_id in (pending, sending, sent, sent + 1000):
        with pytest.raises(LookupError, match=f"no dead letter with id {row_id}"):
            await box.retry(row_id)
    assert (await get(box, pending)).status is OutboxStatus.PENDING
    assert (await get(box, sending)).status is OutboxStatus.SENDING
    assert (await get(box, sent)).status is OutboxStatus.SENT


# settled reports: announced to the listeners, never written into cron's tables -----------------


class Heard:
    """A listener that records what it was told and checks it runs inside the transaction."""

    def __init__(self) -> None:
        self.reports: list[SettledReport] = []

    async def __call__(self, conn: AsyncConnection, report: SettledReport) -> None:
        assert conn.in_transaction()
        self.reports.append(report)


def report_chunk(key: str, run_id: int, target: Target = A) -> Chunk:
    return Chunk(key, target, "the report", kind=OutboxKind.REPORT, job_run_id=run_id)


async def test_a_report_is_announced_once_when_its_last_chunk_is_sent(store: Store) -> None:
    heard = Heard()
    box = Outbox(store, listeners=[heard])
    first, second = await box.enqueue([report_chunk("r1", 7), report_chunk("r2", 7, B)])
    [plain] = await box.enqueue([chunk("not a report")])
    for row_id in (first, plain):
        assert await box.claim(row_id)
        await box.sent(row_id, "m", utcnow())
    assert heard.reports == [], "one chunk of the report is still unsent"
    assert await box.claim(second)
    await box.sent(second, "m2", utcnow())
    assert heard.reports == [SettledReport(7)]


async def test_a_dead_chunk_settles_its_report_as_failed_with_the_reason(store: Store) -> None:
    heard = Heard()
    box = Outbox(store)
    box.subscribe(heard)
    [row_id] = await box.enqueue([report_chunk("r1", 8)])
    assert await box.claim(row_id)
    await box.dead(row_id, "chat not found")
    assert heard.reports == [SettledReport(8, ("test:a: chat not found",))]


async def test_a_listener_that_raises_rolls_the_settling_back(store: Store) -> None:
    async def broken(conn: AsyncConnection, report: SettledReport) -> None:
        raise RuntimeError("listener failed")

    box = Outbox(store, listeners=[broken])
    [row_id] = await box.enqueue([report_chunk("r1", 9)])
    assert await box.claim(row_id)
    with pytest.raises(RuntimeError, match="listener failed"):
        await box.sent(row_id, "m", utcnow())
    assert (await get(box, row_id)).status is OutboxStatus.SENDING


async def test_recovery_announces_the_reports_its_dead_chunks_settle(store: Store) -> None:
    heard = Heard()
    box = Outbox(store, listeners=[heard])
    [stale] = await box.enqueue([report_chunk("r1", 10)])
    [fresh] = await box.enqueue([report_chunk("r2", 11)])
    for row_id in (stale, fresh):
        assert await box.claim(row_id)
    await age(store, stale, timedelta(hours=2))
    assert await box.recover(max_age=3600, max_attempts=5) == (1, 1)
    assert [r.run_id for r in heard.reports] == [10], "the resent one is not settled yet"
    assert heard.reports[0].failures[0].startswith("test:a: the outcome of the last send")


# recover -------------------------------------------------------------------------------------


async def test_recover_resends_an_unknown_outcome_once_marked_recovered(store: Store) -> None:
    box = Outbox(store)
    row_id = await make_sending(box, "k")
    [untouched] = await box.enqueue([chunk("other")])
    assert await box.recover(max_age=3600, max_attempts=8) == (1, 0)
    row = await get(box, row_id)
    assert row.status is OutboxStatus.PENDING
    assert row.recovered
    assert row.attempts == 1
    assert row.next_attempt_at <= utcnow()
    assert row.message().recovered, "the adapter is told that this is a resend"
    assert not (await get(box, untouched)).recovered
    # Nothing is left to recover.
    assert await box.recover(max_age=3600, max_attempts=8) == (0, 0)


async def test_each_unknown_outcome_is_resolved_by_one_recovered_resend(store: Store) -> None:
    """A resend cut off by another stop is resent once more (a reply must not be lost to two
    crashes in a row); tries and freshness bound how often."""
    box = Outbox(store)
    row_id = await make_sending(box, "k")
    assert await box.recover(max_age=3600, max_attempts=8) == (1, 0)
    assert await box.claim(row_id)  # resent, and the process stopped again
    assert await box.recover(max_age=3600, max_attempts=8) == (1, 0)
    row = await get(box, row_id)
    assert row.status is OutboxStatus.PENDING
    assert row.recovered
    assert row.attempts == 2


async def test_recover_of_a_row_out_of_tries_makes_it_dead(store: Store) -> None:
    box = Outbox(store)
    row_id = await make_sending(box, "k")
    for _ in range(2):
        await box.retry_at(row_id, utcnow(), "NotReady")
        assert await box.claim(row_id)
    fresh = await make_sending(box, "fresh")
    assert (await get(box, row_id)).attempts == 3
    assert await box.recover(max_age=3600, max_attempts=3) == (1, 1)
    row = await get(box, row_id)
    assert row.status is OutboxStatus.DEAD
    assert row.last_error is not None
    assert "unknown" in row.last_error
    assert (await get(box, fresh)).status is OutboxStatus.PENDING


async def test_recover_of_a_stale_row_makes_it_dead(store: Store) -> None:
    box = Outbox(store)
    stale = await make_sending(box, "old")
    fresh = await make_sending(box, "new")
    await age(store, stale, timedelta(seconds=120))
    assert await box.recover(max_age=60, max_attempts=8) == (1, 1)
    assert (await get(box, stale)).status is OutboxStatus.DEAD
    fresh_row = await get(box, fresh)
    assert (fresh_row.status, fresh_row.recovered) == (OutboxStatus.PENDING, True)


async def test_recover_leaves_pending_sent_and_dead_rows_alone(store: Store) -> None:
    box = Outbox(store)
    [pending, sent, dead] = await box.enqueue([chunk("p"), chunk("s"), chunk("d")])
    assert await box.claim(sent)
    await box.sent(sent, "m", utcnow())
    await box.dead(dead, "blocked")
    await age(store, pending, timedelta(days=1))
    assert await box.recover(max_age=60, max_attempts=8) == (0, 0)
    assert [(await get(box, i)).status for i in (pending, sent, dead)] == [
        OutboxStatus.PENDING,
        OutboxStatus.SENT,
        OutboxStatus.DEAD,
    ]
    assert not any([(await get(box, i)).recovered for i in (pending, sent, dead)])


# due_chats, next_due_at, head ----------------------------------------------------------------


async def test_due_chats_oldest_first(store: Store) -> None:
    box = Outbox(store)
    await box.enqueue([chunk("b1", B), chunk("a1", A), chunk("b2", B), chunk("z", OTHER)])
    assert await box.due_chats(soon(), platforms=["test"], limit=10) == [B.chat, A.chat]
    assert await box.due_chats(soon(), platforms=["test"], limit=1) == [B.chat]
    assert await box.due_chats(soon(), platforms=["test", "other"], limit=10) == [
        B.chat,
        A.chat,
        OTHER.chat,
    ]
    assert await box.due_chats(soon(), platforms=["nothing"], limit=10) == []


async def test_due_chats_skips_a_chat_whose_oldest_pending_chunk_is_not_due(store: Store) -> None:
    box = Outbox(store)
    [a1, _a2] = await box.enqueue([chunk("a1", A), chunk("a2", A)])
    await box.enqueue([chunk("b1", B)])
    assert await box.claim(a1)
    await box.retry_at(a1, utcnow() + LATER, "rate limited", attempt=False)
    # a2 is due, but it must not overtake a1: chat A is not due at all.
    assert await box.due_chats(soon(), platforms=["test"], limit=10) == [B.chat]
    head = await box.head(A.chat)
    assert head is not None
    assert head.id == a1
    assert await box.due_chats(utcnow() + 2 * LATER, platforms=["test"], limit=10) == [
        A.chat,
        B.chat,
    ]


async def test_a_sent_or_dead_head_no_longer_holds_the_chat(store: Store) -> None:
    box = Outbox(store)
    [a1, a2, a3] = await box.enqueue([chunk("a1"), chunk("a2"), chunk("a3")])
    assert await box.claim(a1)
    assert await box.due_chats(soon(), platforms=["test"], limit=10) == [], (
        "a chat with a chunk being sent is left to whoever sends it"
    )
    head = await box.head(A.chat)
    assert head is not None
    assert head.id == a2, "a sending row is not the pending head"
    await box.sent(a1, "m", utcnow())
    assert await box.claim(a2)
    await box.dead(a2, "blocked")
    head = await box.head(A.chat)
    assert head is not None
    assert head.id == a3
    assert await box.claim(a3)
    await box.sent(a3, "m", utcnow())
    assert await box.head(A.chat) is None
    assert await box.due_chats(soon(), platforms=["test"], limit=10) == []


async def test_next_due_at(store: Store) -> None:
    box = Outbox(store)
    assert await box.next_due_at(platforms=["test"]) is None
    [a1] = await box.enqueue([chunk("a1")])
    assert await box.claim(a1)
    when = utcnow() + LATER
    await box.retry_at(a1, when, "rate limited")
    due = await box.next_due_at(platforms=["test"])
    assert due is not None
    assert abs((due - when).total_seconds()) < 0.001
    assert due.tzinfo is not None
    await box.enqueue([chunk("b1", B)])
    due = await box.next_due_at(platforms=["test"])
    assert due is not None
    assert due <= utcnow()
    assert await box.next_due_at(platforms=["other"]) is None


async def test_look_is_due_chats_and_the_next_due_time_after_now(store: Store) -> None:
    box = Outbox(store)
    now = utcnow()
    assert await box.look(now, platforms=["test"], limit=10) == ([], None)
    [a1] = await box.enqueue([chunk("a1")])
    assert await box.claim(a1)
    when = utcnow() + LATER
    await box.retry_at(a1, when, "rate limited")
    await box.enqueue([chunk("b1", B)])
    chats, later = await box.look(soon(), platforms=["test"], limit=10)
    assert chats == [B.chat]  # due now; A waits for its retry
    assert later is not None
    assert abs((later - when).total_seconds()) < 0.001  # not B's chunk, due already
    assert await box.look(soon(), platforms=["other"], limit=10) == ([], None)


async def test_sent_says_whether_the_chat_has_more_to_send(store: Store) -> None:
    box = Outbox(store)
    [a1, a2] = await box.enqueue([chunk("a1"), chunk("a2")])
    [b1] = await box.enqueue([chunk("b1", B)])
    assert await box.claim(a1)
    assert await box.sent(a1, "m1", utcnow()) is True  # a2 waits
    assert await box.claim(a2)
    assert await box.sent(a2, "m2", utcnow()) is False  # B's chunk is another chat's
    assert await box.claim(b1)
    assert await box.sent(b1, "m3", utcnow()) is False


# take: one chunk of a chat in flight, in order, spaced, across instances ----------------------


async def test_take_sends_a_chats_chunks_one_at_a_time_in_order(store: Store) -> None:
    box = Outbox(store)
    [a1, a2] = await box.enqueue([chunk("a1"), chunk("a2")])
    taken = await box.take(A.chat, owner="one", now=soon(), interval=0)
    assert isinstance(taken, OutboxRow)
    assert (taken.id, taken.status, taken.attempts) == (a1, OutboxStatus.SENDING, 1)
    assert await box.take(A.chat, owner="two", now=soon(), interval=0) is None, (
        "nothing newer goes out while the head is being sent, by anyone"
    )
    async with store.read() as conn:
        owner = await conn.scalar(select(outbox_table.c.claimed_by).where(outbox_table.c.id == a1))
    assert owner == "one"
    await box.sent(a1, "m1", utcnow())
    taken = await box.take(A.chat, owner="two", now=soon(), interval=0)
    assert isinstance(taken, OutboxRow)
    assert taken.id == a2
    await box.sent(a2, "m2", utcnow())
    assert await box.take(A.chat, owner="one", now=soon(), interval=0) is None


async def test_take_waits_for_the_retry_time_and_the_chats_spacing(store: Store) -> None:
    box = Outbox(store)
    [a1, a2] = await box.enqueue([chunk("a1"), chunk("a2")])
    assert await box.claim(a1)
    await box.retry_at(a1, utcnow() + LATER, "rate limited", attempt=False)
    assert await box.take(A.chat, owner="one", now=soon(), interval=0) is None
    taken = await box.take(A.chat, owner="one", now=utcnow() + 2 * LATER, interval=0)
    assert isinstance(taken, OutboxRow)
    assert taken.id == a1
    sent_at = utcnow()
    await box.sent(a1, "m1", sent_at)
    wait = await box.take(A.chat, owner="two", now=sent_at + timedelta(seconds=1), interval=3)
    assert isinstance(wait, float)
    assert 1.9 < wait <= 2.0, "spaced from the chat's last send, whoever sent it"
    assert (await get(box, a2)).status is OutboxStatus.PENDING
    taken = await box.take(A.chat, owner="two", now=sent_at + timedelta(seconds=3), interval=3)
    assert isinstance(taken, OutboxRow)
    assert taken.id == a2


@pytest.mark.postgres
async def test_take_leaves_a_chat_alone_while_another_instance_is_taking_its_head(
    pg_url: str,
) -> None:
    async with Store.open(pg_url) as store:
        box = Outbox(store)
        [a1, _a2] = await box.enqueue([chunk("a1"), chunk("a2")])
        async with store.write() as conn:
            # Another instance's `take` in progress: the head row is locked, not yet updated.
            await conn.execute(
                select(outbox_table.c.id).where(outbox_table.c.id == a1).with_for_update()
            )
            assert await box.take(A.chat, owner="two", now=soon(), interval=0) is None
        taken = await box.take(A.chat, owner="two", now=soon(), interval=0)
        assert isinstance(taken, OutboxRow)
        assert taken.id == a1


async def test_recover_in_a_cluster_takes_only_what_gone_instances_were_sending(
    store: Store,
) -> None:
    ttl = 10.0
    box = Outbox(store)
    await Membership(store, "alive", ttl).register()
    await Membership(store, "me", ttl).register()
    await Membership(store, "gone", ttl, now=lambda: utcnow() - timedelta(minutes=5)).register()
    rows = {}
    for owner, target in (("alive", A), ("gone", B), ("me", OTHER)):
        [row_id] = await box.enqueue([chunk(f"by-{owner}", target)])
        assert await box.claim(row_id, owner)
        rows[owner] = row_id

    async def recover(*, started: bool) -> tuple[int, int]:
        return await box.recover(
            owner="me", lease_ttl=ttl, max_age=3600, max_attempts=8, started=started
        )

    assert await recover(started=False) == (1, 0)
    assert (await get(box, rows["gone"])).recovered
    assert (await get(box, rows["alive"])).status is OutboxStatus.SENDING
    assert (await get(box, rows["me"])).status is OutboxStatus.SENDING, (
        "a running instance's own sends are its own business"
    )
    assert await recover(started=True) == (1, 0), "its earlier life's sends"
    assert (await get(box, rows["me"])).recovered
    assert (await get(box, rows["alive"])).status is OutboxStatus.SENDING


# reply_chunks --------------------------------------------------------------------------------


async def test_reply_chunks_keys_and_fields(store: Store) -> None:
    session_id, turn_id = await a_turn(store)
    text = " ".join(f"word{i}" for i in range(60))
    chunks = reply_chunks(
        A,
        text,
        SendLimits(max_chunk=100),
        session_id=session_id,
        turn_id=turn_id,
        reply_to=PlatformMessageId("in-1"),
        edit_of=PlatformMessageId("preview-1"),
    )
    assert len(chunks) > 2
    assert [c.key for c in chunks] == [f"s{session_id}:t{turn_id}:c{i}" for i in range(len(chunks))]
    assert [c.chunk_index for c in chunks] == list(range(len(chunks)))
    assert all(len(c.text) <= 100 for c in chunks)
    assert " ".join(c.text for c in chunks).split() == text.split()
    assert all(c.kind is OutboxKind.REPLY for c in chunks)
    assert [c.reply_to for c in chunks] == ["in-1"] + [None] * (len(chunks) - 1)
    assert [c.edit_of for c in chunks] == ["preview-1"] + [None] * (len(chunks) - 1)

    box = Outbox(store)
    ids = await box.enqueue(chunks)
    assert len(ids) == len(chunks)
    # The same turn's reply written again (a replayed commit) adds nothing.
    assert await box.enqueue(chunks) == []
    rows = sorted(await box.list(session_id=session_id), key=lambda r: r.id)
    assert [(r.chunk_index, r.turn_id, r.edit_of) for r in rows] == [
        (c.chunk_index, turn_id, c.edit_of) for c in chunks
    ]


async def test_reply_chunks_of_an_empty_answer(store: Store) -> None:
    session_id, turn_id = await a_turn(store)
    [only] = reply_chunks(A, "  ", SendLimits(), session_id=session_id, turn_id=turn_id)
    assert only.key == f"s{session_id}:t{turn_id}:c0"
    assert only.text.strip()


async def test_delivery_report_marks_the_sent_chunk(store: Store) -> None:
    box = Outbox(store)
    [first, second] = await box.enqueue([chunk("r1"), chunk("r2", B)])
    for row_id, sid in ((first, "SM1"), (second, "SM2")):
        assert await box.claim(row_id)
        await box.sent(row_id, sid, utcnow())
    assert await box.delivery_report("test", "acct", "SM1", "sent")
    assert (await get(box, first)).receipt == "sent"
    assert await box.delivery_report("test", "acct", "SM1", "delivered")
    assert await box.delivery_report(
        "test", "acct", "SM2", "undelivered", "twilio undelivered: error 30003"
    )
    done, failed = await get(box, first), await get(box, second)
    assert (done.receipt, done.status, done.last_error) == ("delivered", OutboxStatus.SENT, None)
    assert (failed.receipt, failed.status) == ("undelivered", OutboxStatus.SENT)
    assert failed.last_error == "twilio undelivered: error 30003"
    listed = {r.id: r.receipt for r in await box.list()}
    assert listed == {first: "delivered", second: "undelivered"}


async def test_a_late_report_does_not_undo_a_final_one(store: Store) -> None:
    box = Outbox(store)
    [row_id] = await box.enqueue([chunk("late")])
    await box.claim(row_id)
    await box.sent(row_id, "SM9", utcnow())
    assert await box.delivery_report("test", "acct", "SM9", "failed", "error 30005")
    assert await box.delivery_report("test", "acct", "SM9", "sent")  # overtaken on the way
    row = await get(box, row_id)
    assert (row.receipt, row.last_error) == ("failed", "error 30005")
    assert await box.delivery_report("test", "acct", "SM9", "read")  # final replaces final
    assert (await get(box, row_id)).receipt == "read"


async def test_a_report_on_an_unknown_message_changes_nothing(store: Store) -> None:
    box = Outbox(store)
    [row_id] = await box.enqueue([chunk("unknown")])
    await box.claim(row_id)
    await box.sent(row_id, "SM1", utcnow())
    assert not await box.delivery_report("test", "acct", "SM404", "failed", "x")
    assert not await box.delivery_report("test", "other-account", "SM1", "failed", "x")
    row = await get(box, row_id)
    assert (row.receipt, row.last_error) == (None, None)


async def test_a_chunk_carries_its_file(store: Store) -> None:
    """A `send_file` chunk keeps its file (path, type, size, name) and hands it to the
    adapter; a text chunk has none (SQL NULL)."""
    box = Outbox(store)
    report = Attachment(Path("/state/files/outbox/ab-report.pdf"), "application/pdf", 42, "r.pdf")
    ids = await box.enqueue([chunk("t"), Chunk("f", A, "the caption", attachment=report)])
    text, file = await get(box, ids[0]), await get(box, ids[1])
    assert text.attachment is None
    assert text.message().attachments == ()
    assert file.attachment == report
    assert file.message().attachments == (report,)
    assert file.message().text == "the caption"
    async with store.read() as conn:
        nulls = await conn.execute(
            select(outbox_table.c.idempotency_key).where(outbox_table.c.attachment.is_(None))
        )
        assert nulls.scalars().all() == ["t"]
