"""Outbox delivery through the real store (SQLite and PostgreSQL) and the running worker.

Chunks reach the outbox either through a turn (the rig's session manager answering an
inbound message) or directly through `Outbox.enqueue`. A `TimedAdapter` records when each
send or edit happened and how it ended, so tests can check ordering and lower bounds on
spacing; no test relies on the worker being fast.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from adapters.loopback.config import LoopbackConfig
from agent_core.llm import Completion, TokenCallback, Usage
from gateway.chunking import markdown_to_plain, text_length
from gateway.config import DeliveryConfig
from gateway.contracts.errors import PermanentSendError
from gateway.contracts.history import ChatMessage, Role
from gateway.contracts.ids import AccountId, ChatId, PlatformMessageId, SessionKey, ThreadId
from gateway.contracts.messages import (
    DeliveryReceipt,
    OutboundMessage,
    SendLimits,
    TextFormat,
    utcnow,
)
from gateway.store import Store
from gateway.store.outbox import Chunk, Outbox, OutboxRow, OutboxStatus, Target, enqueue
from gateway.store.tables import outbox as outbox_table
from tests.fakes.platform import Delivered, GatedLLM, RecordingAdapter, inbound
from tests.integration import rig as rig_module
from tests.integration.rig import Rig, running_rig

pytestmark = pytest.mark.timeout(60)

FAST = DeliveryConfig(backoff_initial=0.01, backoff_max=0.05)
TOLERANCE = 0.1
"""Slack for lower bounds measured from the adapter's side: the worker takes its `now`
just before claiming the row, a few milliseconds before the platform is called."""


@dataclass(frozen=True, slots=True)
class Call:
    """One send, edit or typing call as the platform saw it."""

    at: float
    """time.monotonic() when the call arrived."""
    chat: str
    key: str
    text: str
    kind: str
    """send, edit or typing."""
    outcome: str
    """ok, or the name of the exception raised."""
    edit_of: str | None = None
    message_id: str | None = None


class TimedAdapter(RecordingAdapter):
    """A RecordingAdapter that timestamps every call; texts containing `poison` are refused
    permanently (only those chunks: the chat stays usable), and sends wait for `hold` to be
    set when a test holds them."""

    def __init__(self, limits: SendLimits | None = None, *, poison: str | None = None) -> None:
        super().__init__(limits=limits)
        self.calls: list[Call] = []
        self.poison = poison
        self.hold: asyncio.Event | None = None
        self.held = asyncio.Event()

    async def send(self, message: OutboundMessage) -> DeliveryReceipt:
        return await self._timed("send", message, None)

    async def edit(self, target: PlatformMessageId, message: OutboundMessage) -> DeliveryReceipt:
        return await self._timed("edit", message, target)

    async def typing(self, chat_id: ChatId, thread_id: ThreadId | None) -> None:
        self.calls.append(Call(time.monotonic(), chat_id, "", "", "typing", "ok"))
        await super().typing(chat_id, thread_id)

    async def _timed(
        self, kind: str, message: OutboundMessage, target: PlatformMessageId | None
    ) -> DeliveryReceipt:
        at = time.monotonic()
        try:
            if self.hold is not None:
                self.held.set()
                await self.hold.wait()
            if self.poison is not None and self.poison in message.text:
                raise PermanentSendError("Bad Request: message text is not allowed")
            if target is None:
                receipt = await super().send(message)
            else:
                receipt = await super().edit(target, message)
        except Exception as err:
            self.calls.append(
                Call(
                    at,
                    message.chat_id,
                    message.idempotency_key,
                    message.text,
                    kind,
                    type(err).__name__,
                    target,
                )
            )
            raise
        self.calls.append(
            Call(
                at,
                message.chat_id,
                message.idempotency_key,
                message.text,
                kind,
                "ok",
                target,
                receipt.platform_message_id,
            )
        )
        return receipt

    def calls_for(self, key: str) -> list[Call]:
        """The sends and edits of one chunk."""
        return [c for c in self.calls if c.key == key]

    def ok(self, key: str) -> Call:
        """The successful call of a chunk (exactly one)."""
        [call] = [c for c in self.calls_for(key) if c.outcome == "ok"]
        return call

    async def wait_calls(
        self, predicate: Callable[[list[Call]], bool], timeout: float = 10.0
    ) -> None:
        async with asyncio.timeout(timeout):
            while not predicate(self.calls):
                await asyncio.sleep(0.005)


class StreamingLLM(GatedLLM):
    """Answers `answer to <text>` and streams it word by word, a word every 10 ms.

    `before_return`, when set, is awaited after the last word, before the answer is returned.
    """

    before_return: Callable[[], Awaitable[None]] | None = None

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[Mapping[str, Any]] = (),
        on_token: TokenCallback | None = None,
    ) -> Completion:
        last_user = next((m for m in reversed(messages) if m.role is Role.USER), None)
        text = "" if last_user is None else last_user.content
        answer = f"answer to {text}"
        async with self.changed:
            self.calls.append(list(messages))
            self.started.append(text)
            self.changed.notify_all()
        if on_token is not None:
            for word in answer.split(" "):
                await on_token(word + " ")
                await asyncio.sleep(0.01)
        if self.before_return is not None:
            await self.before_return()
        return Completion(answer, usage=Usage(10, 2))


def sends_to(chat: str, calls: list[Call]) -> list[Call]:
    """Sends and edits to a chat (typing calls left out)."""
    return [c for c in calls if c.chat == chat and c.kind != "typing"]


def target(chat: str) -> Target:
    return Target("test", AccountId("acct"), ChatId(chat))


async def put(rig: Rig, *chunks: Chunk) -> list[int]:
    """Write chunks directly and tell the worker."""
    ids = await rig.outbox.enqueue(chunks)
    assert len(ids) == len(chunks)
    rig.delivery.wake()
    return ids


async def wait_row(
    outbox: Outbox,
    row_id: int,
    predicate: Callable[[OutboxRow], bool],
    timeout: float = 10.0,
) -> OutboxRow:
    async with asyncio.timeout(timeout):
        while True:
            row = await outbox.get(row_id)
            assert row is not None
            if predicate(row):
                return row
            await asyncio.sleep(0.01)


def to(chat: str) -> Callable[[list[Delivered]], list[Delivered]]:
    return lambda delivered: [d for d in delivered if d.chat_id == chat]


def words(chunks: Sequence[str]) -> list[str]:
    """The words of chunks, without fence lines (chunking adds closing/reopening ones)."""
    return [
        w
        for c in chunks
        for line in c.splitlines()
        if not line.lstrip().startswith("```")
        for w in line.split()
    ]


# chunking --------------------------------------------------------------------------------------


async def test_a_long_answer_is_split_within_max_chunk_and_delivered_in_order(
    store: Store, tmp_path: Path
) -> None:
    adapter = TimedAdapter(SendLimits(max_chunk=80, min_edit_interval=0.0))
    code = "\n".join(f"print('line {i} of the example')" for i in range(8))
    question = (
        "Please explain this. " * 6 + f"\n\n```python\n{code}\n```\n\n" + "That is all. " * 6
    ).strip()
    answer = f"answer to {question}"
    async with running_rig(store, tmp_path, adapter=adapter, gated=False) as rig:
        await rig.manager.accept(inbound(question, chat="c1"))
        await rig.settled("test:acct:c1", 1)
        rows = sorted(await rig.outbox.list(), key=lambda r: r.id)
        assert len(rows) >= 4
        delivered = await adapter.wait_for(lambda d: len(to("c1")(d)) >= len(rows))
    chunks = [d.text for d in to("c1")(delivered)]
    assert [d.key for d in to("c1")(delivered)] == [r.idempotency_key for r in rows]
    assert [r.chunk_index for r in rows] == list(range(len(rows)))
    assert all(len(c) <= 80 for c in chunks), [len(c) for c in chunks]
    assert words(chunks) == words([answer])
    for c in chunks:
        fences = [line for line in c.splitlines() if line.lstrip().startswith("```")]
        assert len(fences) % 2 == 0, f"an unbalanced code fence in {c!r}"
    # In order: each chunk went out after the previous one was accepted.
    oks = [adapter.ok(r.idempotency_key) for r in rows]
    assert [c.at for c in oks] == sorted(c.at for c in oks)


async def test_chunks_are_measured_in_utf16_when_the_platform_counts_so(
    store: Store, tmp_path: Path
) -> None:
    adapter = TimedAdapter(SendLimits(max_chunk=40, count_utf16=True, min_edit_interval=0.0))
    question = " ".join(["smile 😀😀 grin 😁"] * 12)
    answer = f"answer to {question}"
    assert text_length(answer, utf16=True) > len(answer)
    async with running_rig(store, tmp_path, adapter=adapter, gated=False) as rig:
        await rig.manager.accept(inbound(question, chat="c1"))
        await rig.settled("test:acct:c1", 1)
        rows = await rig.outbox.list()
        delivered = await adapter.wait_for(lambda d: len(d) >= len(rows))
    chunks = [d.text for d in delivered]
    assert all(text_length(c, utf16=True) <= 40 for c in chunks)
    assert words(chunks) == answer.split()


# rate limits -----------------------------------------------------------------------------------


async def test_retry_after_on_one_chat_does_not_delay_another(store: Store, tmp_path: Path) -> None:
    retry_after = 3.0
    adapter = TimedAdapter()
    adapter.rate_limit("a", retry_after)
    async with running_rig(store, tmp_path, adapter=adapter, gated=False) as rig:
        await rig.manager.accept(inbound("hello from a", chat="a"))
        await adapter.wait_calls(lambda calls: any(sends_to("a", calls)))
        [limited] = sends_to("a", adapter.calls)
        assert limited.outcome == "RateLimited"

        await rig.manager.accept(inbound("one from b", chat="b"))
        await rig.manager.accept(inbound("two from b", chat="b"))
        delivered = await adapter.wait_for(lambda d: len(to("b")(d)) >= 2)
        # B got both answers while A was still waiting out its retry_after.
        assert to("a")(delivered) == []
        assert [d.text for d in to("b")(delivered)] == [
            "answer to one from b",
            "answer to two from b",
        ]
        b_done = max(adapter.ok(d.key).at for d in to("b")(delivered))
        assert b_done < limited.at + retry_after

        delivered = await adapter.wait_for(lambda d: len(to("a")(d)) >= 1)
        [a_reply] = to("a")(delivered)
        assert a_reply.text == "answer to hello from a"
        a_ok = adapter.ok(a_reply.key)
        assert a_ok.at >= limited.at + retry_after - TOLERANCE
        assert len(adapter.calls_for(a_reply.key)) == 2
        [row] = [r for r in await rig.outbox.list() if r.idempotency_key == a_reply.key]
        row = await wait_row(rig.outbox, row.id, lambda r: r.status is OutboxStatus.SENT)
        assert row.attempts == 1, "a rate-limited try does not count as a failed attempt"
        assert row.last_error is None


async def test_a_rate_limited_first_chunk_is_not_overtaken(store: Store, tmp_path: Path) -> None:
    adapter = TimedAdapter()
    adapter.rate_limit("a", 0.5, times=2)
    async with running_rig(store, tmp_path, adapter=adapter, gated=False) as rig:
        keys = ["order:0", "order:1", "order:2"]
        ids = await put(rig, *(Chunk(k, target("a"), f"part {i}") for i, k in enumerate(keys)))
        delivered = await adapter.wait_for(lambda d: len(to("a")(d)) >= 3)
        assert [d.key for d in delivered] == keys
        assert [(c.key, c.outcome) for c in adapter.calls] == [
            ("order:0", "RateLimited"),
            ("order:0", "RateLimited"),
            ("order:0", "ok"),
            ("order:1", "ok"),
            ("order:2", "ok"),
        ]
        first = await rig.outbox.get(ids[0])
        assert first is not None
        assert first.attempts == 1


async def test_min_send_interval_spaces_the_sends_to_one_chat(store: Store, tmp_path: Path) -> None:
    interval = 0.3
    adapter = TimedAdapter(
        SendLimits(max_chunk=200, min_edit_interval=0.0, min_send_interval=interval)
    )
    async with running_rig(store, tmp_path, adapter=adapter, gated=False) as rig:
        await put(rig, *(Chunk(f"burst:{i}", target("a"), f"part {i}") for i in range(3)))
        await adapter.wait_for(lambda d: len(d) >= 3)
        times = [adapter.ok(f"burst:{i}").at for i in range(3)]
        assert all(b - a >= interval - 0.01 for a, b in itertools.pairwise(times)), times


async def test_min_send_interval_holds_across_separate_batches(
    store: Store, tmp_path: Path
) -> None:
    """A chunk written after the chat's previous batch went out still waits its turn."""
    interval = 0.5
    adapter = TimedAdapter(
        SendLimits(max_chunk=200, min_edit_interval=0.0, min_send_interval=interval)
    )
    async with running_rig(store, tmp_path, adapter=adapter, gated=False) as rig:
        await put(rig, Chunk("first", target("a"), "first"))
        await adapter.wait_for(lambda d: len(d) >= 1)
        async with asyncio.timeout(10):
            while rig.delivery.busy_chats:
                await asyncio.sleep(0.005)
        await put(rig, Chunk("second", target("a"), "second"))
        await adapter.wait_for(lambda d: len(d) >= 2)
        gap = adapter.ok("second").at - adapter.ok("first").at
        assert gap >= interval - 0.01, f"two sends to one chat {gap:.3f}s apart"


# transient and permanent errors -----------------------------------------------------------------


async def test_transient_failures_are_retried_with_backoff_then_delivered(
    store: Store, tmp_path: Path
) -> None:
    initial = 0.2
    adapter = TimedAdapter()
    adapter.fail("a", times=2)
    config = DeliveryConfig(backoff_initial=initial, backoff_max=5.0, max_attempts=5)
    async with running_rig(store, tmp_path, adapter=adapter, delivery=config, gated=False) as rig:
        [row_id] = await put(rig, Chunk("flaky", target("a"), "eventually"))
        await adapter.wait_for(lambda d: len(d) >= 1)
        row = await wait_row(rig.outbox, row_id, lambda r: r.status is OutboxStatus.SENT)
    calls = adapter.calls_for("flaky")
    assert [c.outcome for c in calls] == ["NotReady", "NotReady", "ok"]
    assert (row.attempts, row.last_error) == (3, None)
    # Jittered exponential backoff: at least half of initial * 2**n before retry n + 1.
    gaps = [b.at - a.at for a, b in itertools.pairwise(calls)]
    assert gaps[0] >= 0.5 * initial - TOLERANCE / 2, gaps
    assert gaps[1] >= 0.5 * initial * 2 - TOLERANCE / 2, gaps


async def test_too_many_transient_failures_make_a_dead_letter(store: Store, tmp_path: Path) -> None:
    adapter = TimedAdapter()
    adapter.fail("a", times=3)
    config = DeliveryConfig(backoff_initial=0.01, backoff_max=0.05, max_attempts=3)
    async with running_rig(store, tmp_path, adapter=adapter, delivery=config, gated=False) as rig:
        doomed, after = await put(
            rig, Chunk("doomed", target("a"), "never"), Chunk("after", target("a"), "later")
        )
        await adapter.wait_for(lambda d: len(d) >= 1)
        row = await wait_row(rig.outbox, doomed, lambda r: r.status is OutboxStatus.DEAD)
        assert row.attempts == 3
        assert row.last_error is not None
        assert "gave up after 3 tries" in row.last_error
        assert "502 bad gateway" in row.last_error
        assert [d.key for d in adapter.delivered] == ["after"]
        assert [c.outcome for c in adapter.calls_for("doomed")] == ["NotReady"] * 3
        assert [r.id for r in await rig.outbox.list(status=OutboxStatus.DEAD)] == [doomed]
        assert (
            await wait_row(rig.outbox, after, lambda r: r.status is OutboxStatus.SENT)
        ).attempts == 1


async def test_a_permanent_error_is_dead_at_once_and_nothing_else_waits(
    store: Store, tmp_path: Path
) -> None:
    adapter = TimedAdapter(poison="POISON")
    adapter.block("blocked")
    async with running_rig(store, tmp_path, adapter=adapter, delivery=FAST, gated=False) as rig:
        blocked, poison, after, other = await put(
            rig,
            Chunk("blocked:0", target("blocked"), "hello"),
            Chunk("a:0", target("a"), "POISON in here"),
            Chunk("a:1", target("a"), "the next chunk of a"),
            Chunk("b:0", target("b"), "hello b"),
        )
        await adapter.wait_for(lambda d: {x.key for x in d} >= {"a:1", "b:0"})
        dead_blocked = await wait_row(rig.outbox, blocked, lambda r: r.status is OutboxStatus.DEAD)
        dead_poison = await wait_row(rig.outbox, poison, lambda r: r.status is OutboxStatus.DEAD)
        assert dead_blocked.attempts == 1
        assert dead_blocked.last_error == "Forbidden: bot was blocked by the user"
        assert dead_poison.attempts == 1
        assert dead_poison.last_error == "Bad Request: message text is not allowed"
        assert len(adapter.calls_for("blocked:0")) == 1
        assert len(adapter.calls_for("a:0")) == 1
        for row_id in (after, other):
            row = await wait_row(rig.outbox, row_id, lambda r: r.status is OutboxStatus.SENT)
            assert row.attempts == 1
        assert adapter.texts("a") == ["the next chunk of a"]
        assert adapter.texts("blocked") == []


async def test_rejected_markup_is_resent_as_plain_text(store: Store, tmp_path: Path) -> None:
    adapter = TimedAdapter()
    adapter.reject_markup("**")
    question = "**bold** words, `code` and [the docs](https://example.com/docs)"
    answer = f"answer to {question}"
    async with running_rig(store, tmp_path, adapter=adapter, gated=False) as rig:
        await rig.manager.accept(inbound(question, chat="c1"))
        [reply] = await adapter.wait_for(lambda d: len(d) >= 1)
        [row] = await rig.outbox.list()
        row = await wait_row(rig.outbox, row.id, lambda r: r.status is OutboxStatus.SENT)
    assert reply.format is TextFormat.PLAIN
    assert reply.text == markdown_to_plain(answer)
    assert "**" not in reply.text
    assert "https://example.com/docs" in reply.text
    assert "bold" in reply.text
    assert "code" in reply.text
    assert [c.outcome for c in adapter.calls_for(reply.key)] == ["MarkupRejected", "ok"]
    assert (row.format, row.attempts) == (TextFormat.PLAIN, 1)


# freshness and recovery ------------------------------------------------------------------------


async def test_a_stale_chunk_becomes_dead_and_is_never_sent(store: Store, tmp_path: Path) -> None:
    config = DeliveryConfig(backoff_initial=0.01, backoff_max=0.05, max_age=60)
    adapter = TimedAdapter()
    async with running_rig(store, tmp_path, adapter=adapter, delivery=config, gated=False) as rig:
        async with store.write() as conn:
            [old] = await enqueue(conn, [Chunk("old", target("a"), "yesterday's news")])
            await conn.execute(
                update(outbox_table)
                .where(outbox_table.c.id == old)
                .values(created_at=utcnow() - timedelta(seconds=120))
            )
        await put(rig, Chunk("fresh", target("a"), "today's news"))
        await adapter.wait_for(lambda d: len(d) >= 1)
        row = await wait_row(rig.outbox, old, lambda r: r.status is OutboxStatus.DEAD)
    assert row.last_error is not None
    assert "too old" in row.last_error
    assert adapter.calls_for("old") == []
    assert [d.key for d in adapter.delivered] == ["fresh"]


async def test_a_chunk_that_waits_past_max_age_is_dead_not_sent_late(
    store: Store, tmp_path: Path
) -> None:
    config = DeliveryConfig(backoff_initial=0.01, backoff_max=0.05, max_age=1.0)
    adapter = TimedAdapter()
    adapter.rate_limit("a", 2.0)
    async with running_rig(store, tmp_path, adapter=adapter, delivery=config, gated=False) as rig:
        [row_id] = await put(rig, Chunk("late", target("a"), "too late"))
        row = await wait_row(rig.outbox, row_id, lambda r: r.status is OutboxStatus.DEAD)
    assert row.last_error is not None
    assert "too old" in row.last_error
    assert adapter.delivered == []
    assert all(c.outcome == "RateLimited" for c in adapter.calls)


async def test_a_recovered_resend_is_marked_recovered(store: Store, tmp_path: Path) -> None:
    box = Outbox(store)
    [unknown] = await box.enqueue([Chunk("unknown", target("a"), "did it arrive?")])
    assert await box.claim(unknown)  # the process stopped while this was being sent
    adapter = TimedAdapter()
    async with running_rig(store, tmp_path, adapter=adapter, delivery=FAST, gated=False) as rig:
        await put(rig, Chunk("new", target("a"), "a new chunk"))
        delivered = await adapter.wait_for(lambda d: len(d) >= 2)
        row = await wait_row(rig.outbox, unknown, lambda r: r.status is OutboxStatus.SENT)
    assert [(d.key, d.recovered) for d in delivered] == [("unknown", True), ("new", False)]
    assert row.recovered
    assert row.attempts == 2


async def test_a_resend_cut_off_again_is_resent_once_more_marked_recovered(
    store: Store, tmp_path: Path
) -> None:
    """Two stops in a row during the same send: one more resend, marked recovered."""
    config = DeliveryConfig(backoff_initial=0.01, backoff_max=0.05, max_attempts=8)
    box = Outbox(store)
    [unknown] = await box.enqueue([Chunk("twice", target("a"), "did it arrive?")])
    assert await box.claim(unknown)
    await box.recover(max_age=config.max_age, max_attempts=config.max_attempts)  # first restart
    assert await box.claim(unknown)  # resent, and the process stopped again
    adapter = TimedAdapter()
    async with running_rig(store, tmp_path, adapter=adapter, delivery=config, gated=False) as rig:
        await adapter.wait_for(lambda d: any(x.key == "twice" for x in d))
        async with asyncio.timeout(10):
            while (row := await rig.outbox.get(unknown)) and row.status is not OutboxStatus.SENT:
                await asyncio.sleep(0.01)
    assert [d.recovered for d in adapter.delivered if d.key == "twice"] == [True]


# flush -----------------------------------------------------------------------------------------


async def test_flush_is_true_once_everything_is_delivered(store: Store, tmp_path: Path) -> None:
    adapter = TimedAdapter()
    async with running_rig(store, tmp_path, adapter=adapter, delivery=FAST, gated=False) as rig:
        ids = await rig.outbox.enqueue(
            [Chunk(f"f:{i}", target("a" if i % 2 else "b"), f"chunk {i}") for i in range(6)]
        )
        assert await rig.delivery.flush(20)
        rows = [await rig.outbox.get(i) for i in ids]
    assert [r.status if r else None for r in rows] == [OutboxStatus.SENT] * 6
    assert len(adapter.delivered) == 6


async def test_flush_is_not_true_while_a_chunk_waits_for_its_retry(
    store: Store, tmp_path: Path
) -> None:
    """A rate-limited chunk has not gone out: flush() must not report that everything did
    (the supervisor then logs nothing about chunks left for after the restart)."""
    adapter = TimedAdapter()
    adapter.rate_limit("a", 30.0)
    async with running_rig(store, tmp_path, adapter=adapter, delivery=FAST, gated=False) as rig:
        [row_id] = await put(rig, Chunk("waiting", target("a"), "later"))
        await adapter.wait_calls(lambda calls: len(calls) >= 1)
        await wait_row(rig.outbox, row_id, lambda r: r.status is OutboxStatus.PENDING)
        everything_went_out = await rig.delivery.flush(0.5)
        row = await rig.outbox.get(row_id)
    assert row is not None
    assert row.status is OutboxStatus.PENDING
    assert adapter.delivered == []
    assert not everything_went_out, "flush() said True with a chunk still pending"


async def test_flush_is_not_true_while_a_send_is_in_flight(store: Store, tmp_path: Path) -> None:
    """flush() may only say True once the chunk being sent has been accepted: while the
    platform holds the send, a flush of any length ends False; once it answers, True."""
    adapter = TimedAdapter()
    adapter.hold = asyncio.Event()
    async with running_rig(store, tmp_path, adapter=adapter, delivery=FAST, gated=False) as rig:
        [row_id] = await rig.outbox.enqueue([Chunk("inflight", target("a"), "in flight")])
        rig.delivery.wake()
        async with asyncio.timeout(10):
            await adapter.held.wait()
        assert not await rig.delivery.flush(0.3), "flush() said True with a send in flight"
        row = await rig.outbox.get(row_id)
        assert row is not None
        assert row.status is OutboxStatus.SENDING
        adapter.hold.set()
        assert await rig.delivery.flush(20), "flush gave up although the chunk went out"
        row = await rig.outbox.get(row_id)
        assert row is not None
        assert row.status is OutboxStatus.SENT


# live feedback: typing and streaming by edits --------------------------------------------------


async def test_typing_indicator_while_a_turn_runs(store: Store, tmp_path: Path) -> None:
    adapter = TimedAdapter()
    async with running_rig(store, tmp_path, adapter=adapter) as rig:
        await rig.manager.accept(inbound("think hard", chat="c1"))
        await rig.llm.wait_started("think hard")
        await adapter.wait_calls(lambda calls: any(c.kind == "typing" for c in calls))
        assert rig.manager.running(rig_key("c1")), "the indicator shows while the turn runs"
        assert adapter.typing_calls[0] == "c1"
        assert adapter.delivered == []
        rig.llm.release("think hard")
        [reply] = await adapter.wait_for(lambda d: len(d) >= 1)
    typing = [c for c in adapter.calls if c.kind == "typing"]
    assert typing[0].at < adapter.ok(reply.key).at


def rig_key(chat: str) -> SessionKey:
    return SessionKey(f"test:acct:{chat}")


def streaming_section() -> LoopbackConfig:
    return LoopbackConfig(url="http://127.0.0.1:1", token="t", account="acct", allowed_users=("*",))


async def stream_one(
    store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    question: str,
    limits: SendLimits,
    *,
    end_after_full_preview: bool = False,
) -> tuple[TimedAdapter, list[OutboxRow]]:
    """Run one streamed turn to completion; the adapter and the turn's reply rows.

    With `end_after_full_preview`, the model returns only once a preview edit shows its
    whole answer, so the reply's final edit follows a preview edit closely.
    """
    monkeypatch.setattr(rig_module, "GatedLLM", StreamingLLM)
    adapter = TimedAdapter(limits)
    answer = f"answer to {question}"

    async def full_preview() -> None:
        await adapter.wait_calls(
            lambda calls: any(
                c.key.startswith("preview:") and c.text.startswith(answer) for c in calls
            )
        )

    async with running_rig(
        store, tmp_path, adapter=adapter, section=streaming_section(), gated=False
    ) as rig:
        assert isinstance(rig.llm, StreamingLLM)
        if end_after_full_preview:
            rig.llm.before_return = full_preview
        await rig.manager.accept(inbound(question, chat="c1"))
        await rig.settled("test:acct:c1", 1)
        rows = sorted(await rig.outbox.list(), key=lambda r: r.id)
        assert rows
        await adapter.wait_for(lambda d: {x.key for x in d} >= {r.idempotency_key for r in rows})
        assert await rig.delivery.flush(10)
    return adapter, rows


QUESTION = " ".join(f"w{i}" for i in range(40))


async def test_streaming_edits_the_preview_into_the_final_text(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    interval = 0.15
    adapter, rows = await stream_one(
        store,
        tmp_path,
        monkeypatch,
        QUESTION,
        SendLimits(max_chunk=400, min_edit_interval=interval),
    )
    final = f"answer to {QUESTION}"
    [row] = rows
    assert row.text == final
    previews = [c for c in adapter.calls if c.key.startswith("preview:")]
    assert len(previews) >= 2, "the preview was edited while the model streamed"
    assert previews[0].kind == "send"
    preview_id = previews[0].message_id
    assert preview_id is not None
    assert all(c.kind == "edit" and c.edit_of == preview_id for c in previews[1:])
    assert all(c.outcome == "ok" and c.text != final for c in previews)
    # The reply's first (only) chunk replaced the preview: no second message.
    assert row.edit_of == preview_id
    last = adapter.ok(row.idempotency_key)
    assert (last.kind, last.edit_of, last.text) == ("edit", preview_id, final)
    assert adapter.texts("c1") == [final]
    assert [d.text for d in adapter.delivered].count(final) == 1
    assert not [d for d in adapter.delivered if d.text == final and d.edit_of is None]
    # Preview edits keep the bounded rate.
    times = [c.at for c in previews]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(g >= interval - 0.01 for g in gaps), gaps


async def test_the_final_edit_keeps_the_edit_interval(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reply's edit of the preview is an edit of that message too: not sooner than
    min_edit_interval after the preview's last edit."""
    interval = 0.4
    adapter, rows = await stream_one(
        store,
        tmp_path,
        monkeypatch,
        QUESTION,
        SendLimits(max_chunk=400, min_edit_interval=interval),
        end_after_full_preview=True,
    )
    previews = [c for c in adapter.calls if c.key.startswith("preview:")]
    assert previews[-1].text.startswith(f"answer to {QUESTION}")
    final_edit = adapter.ok(rows[0].idempotency_key)
    assert final_edit.kind == "edit"
    gap = final_edit.at - previews[-1].at
    assert gap >= interval - 0.01, f"final edit {gap:.3f}s after the last preview edit"


async def test_a_long_streamed_answer_replaces_the_preview_then_sends_the_rest(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    question = " ".join(f"word{i}" for i in range(60))
    adapter, rows = await stream_one(
        store, tmp_path, monkeypatch, question, SendLimits(max_chunk=100, min_edit_interval=0.05)
    )
    assert len(rows) >= 3
    preview_id = next(c.message_id for c in adapter.calls if c.key.startswith("preview:"))
    assert rows[0].edit_of == preview_id
    assert all(r.edit_of is None for r in rows[1:])
    shown = adapter.texts("c1")
    assert shown == [r.text for r in rows], "each chunk shown once, the first in the preview"
    assert words(shown) == f"answer to {question}".split()
    for r in rows:
        assert len([d for d in adapter.delivered if d.key == r.idempotency_key]) == 1
