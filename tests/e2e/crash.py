"""What the SIGKILL crash tests share: the daemon's config, the database to use, killing during
bursts, waiting until the work settled, and the checks of what the store says afterwards."""

from __future__ import annotations

import asyncio
import random
import signal
from collections import Counter, defaultdict
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy import RowMapping, select

from gateway.store import Store
from gateway.store.tables import inbox, outbox, turns
from tests.e2e.daemon import Daemon
from tests.fakes.llm import FakeLLM, Reply, last_user_text

S = TypeVar("S")


def database_url(tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> str:
    """SQLite under tmp_path's state directory, or the PostgreSQL database of `pg_url`."""
    return (
        f"sqlite+aiosqlite:///{tmp_path / 'state' / 'herald.db'}"
        if backend == "sqlite"
        else str(request.getfixturevalue("pg_url"))
    )


def you_said(delays: random.Random) -> Callable[[dict[str, Any]], Reply]:
    """An LLM responder: `You said: <text>` after a random delay of up to 0.15 s."""

    def answer(body: dict[str, Any]) -> Reply:
        return Reply(text=f"You said: {last_user_text(body)}", delay=delays.uniform(0.0, 0.15))

    return answer


def crash_daemon(
    tmp_path: Path, database_url: str, llm: FakeLLM, platforms: dict[str, Any]
) -> Daemon:
    """A daemon with its state under tmp_path, answering by `llm` on these platforms."""
    daemon = Daemon(
        tmp_path / "state",
        {
            "database_url": database_url,
            "log_level": "INFO",
            "llm": {"base_url": llm.base_url, "api_key": "k", "memory_pass": False},
            "sessions": {"max_concurrent_turns": MAX_CONCURRENT_TURNS, "drain_timeout": 1},
            "platforms": platforms,
        },
    )
    (tmp_path / "state").mkdir()
    return daemon


MAX_CONCURRENT_TURNS = 8
"""`sessions.max_concurrent_turns` of the crash daemon: how many turns one kill can cut off."""


def max_dropped(kills: int) -> int:
    """The most messages the crash tests may see `dropped`: only a message whose turn was cut
    off three times is dropped, and one kill cuts off at most MAX_CONCURRENT_TURNS turns."""
    return kills * MAX_CONCURRENT_TURNS // 3


async def kill_during_bursts(
    daemon: Daemon,
    rng: random.Random,
    kills: int,
    burst: Callable[[int], Coroutine[Any, Any, None]],
    url: str | None = None,
) -> None:
    """`kills` rounds of: start the daemon, start `burst(round)`, SIGKILL the daemon at a
    random moment while the burst runs on, wait for the burst. Then start it once more.

    With the database's `url`, each kill waits (after its random delay) until the store holds
    work in flight (a message not done, a chunk not sent) and is sent at once after that
    look: every kill is sent into work, not to an idle daemon. (A look after the kill is no
    proof either way: a loaded machine may let the process finish its last chunk before the
    signal lands.)"""
    arriving: asyncio.Task[None] | None = None
    try:
        for round_ in range(kills):
            await daemon.start()
            # The burst runs on while the daemon is killed at a random moment: some
            # messages arrive mid-flight, some while it is down.
            arriving = asyncio.create_task(burst(round_))
            if url is None:
                await asyncio.sleep(rng.uniform(0.2, 1.5))
            else:  # a random moment while the burst's messages are being handled
                await asyncio.sleep(rng.uniform(0.05, 0.6))
                await _until_work_in_flight(url)
            daemon.signal(signal.SIGKILL)
            assert await daemon.wait() == -signal.SIGKILL
            await arriving
    finally:
        if arriving is not None and not arriving.done():
            arriving.cancel()
    await daemon.start()


async def _until_work_in_flight(url: str, timeout: float = 30.0) -> None:
    async with Store.open(url, migrate=False) as store, asyncio.timeout(timeout):
        while not await work_left(store):
            await asyncio.sleep(0.01)


async def kill_leftover(daemon: Daemon) -> None:
    """Kill the daemon's process if it still runs (a failed test)."""
    if daemon.process is not None and daemon.process.returncode is None:
        daemon.process.kill()
        await daemon.process.wait()


async def work_left(store: Store) -> bool:
    """Whether a stored message is not done yet or a chunk not sent yet."""
    async with store.read() as conn:
        open_rows = await conn.scalar(select(inbox.c.id).where(inbox.c.status != "done").limit(1))
        unsent = await conn.scalar(
            select(outbox.c.id).where(outbox.c.status.in_(["pending", "sending"])).limit(1)
        )
    return open_rows is not None or unsent is not None


async def settle(store: Store, platform_done: Callable[[], bool], timeout: float) -> None:
    """Wait until `platform_done()` (nothing pending on the fake) and no work is left.

    `platform_done` is looked at before the database: what the fake saw confirmed by then is
    stored by then. The database is polled: no change of the fake's state says when it is done.
    """
    async with asyncio.timeout(timeout):
        while True:
            done = platform_done()
            if not await work_left(store) and done:
                return
            await asyncio.sleep(0.2)


async def read_results(
    store: Store, platform: str
) -> tuple[Sequence[RowMapping], dict[int, str], Sequence[RowMapping]]:
    """The inbox rows of `platform`, every turn's status by id, and every outbox chunk."""
    async with store.read() as conn:
        rows = (
            (await conn.execute(select(inbox).where(inbox.c.platform == platform))).mappings().all()
        )
        turn_status = {
            int(r.id): str(r.status)
            for r in (await conn.execute(select(turns.c.id, turns.c.status))).all()
        }
        chunks = (await conn.execute(select(outbox))).mappings().all()
    return rows, turn_status, chunks


def check_accepted_once(
    rows: Sequence[RowMapping], injected: Mapping[str, tuple[str, str]], *, kills: int
) -> None:
    """Every injected message (platform message id → chat id, text) was accepted exactly once,
    as injected, and has exactly one outcome; at most `max_dropped(kills)` were dropped."""
    by_message = Counter(str(r["platform_message_id"]) for r in rows)
    assert set(by_message) == set(injected)
    assert set(by_message.values()) == {1}
    outcomes = Counter(str(r["outcome"]) for r in rows)
    assert set(outcomes) <= {"answered", "dropped"}, outcomes
    assert outcomes["dropped"] <= max_dropped(kills), outcomes
    for r in rows:
        assert r["status"] == "done"
        assert (r["chat_id"], r["text"]) == injected[str(r["platform_message_id"])]
        if r["outcome"] == "dropped":  # only a message whose turn was cut off three times
            assert "stopped" in str(r["outcome_detail"]), dict(r)


def check_turns_once(
    rows: Sequence[RowMapping], turn_status: Mapping[int, str]
) -> tuple[list[RowMapping], list[int]]:
    """No turn ran twice: one completed turn per answered message, each answering one message.

    Returns the answered rows and their turn ids.
    """
    answered = [r for r in rows if r["outcome"] == "answered"]
    turn_ids = [int(r["turn_id"]) for r in answered]
    assert len(set(turn_ids)) == len(turn_ids)
    assert all(turn_status[t] == "completed" for t in turn_ids)
    completed = {t for t, status in turn_status.items() if status == "completed"}
    assert completed == set(turn_ids)
    return answered, turn_ids


def check_deliveries(
    chunks: Sequence[RowMapping],
    answered: Sequence[RowMapping],
    received: Mapping[tuple[str, str], Sequence[S]],
    *,
    chat: str,
    check_reply: Callable[[Sequence[S]], None] | None = None,
) -> None:
    """Everything queued was delivered, everything the chats `received` (by chat id and text)
    was queued, and every answered message's reply reached its own chat, exactly once unless
    it was resent after a crash (its chunk marked recovered); `check_reply` checks a reply's
    sends further. `chat` names a chat in the messages."""
    assert all(c["status"] == "sent" for c in chunks), [
        dict(c) for c in chunks if c["status"] != "sent"
    ]
    queued: defaultdict[tuple[str, str], list[RowMapping]] = defaultdict(list)
    for c in chunks:
        queued[str(c["chat_id"]), str(c["text"])].append(c)
    unqueued = received.keys() - queued.keys()
    assert not unqueued, f"reached a {chat} but never queued: {sorted(unqueued)}"
    for key, group in queued.items():
        assert len(received.get(key, [])) >= len(group), (key, [dict(c) for c in group])

    replies = {int(c["turn_id"]): c for c in chunks if c["kind"] == "reply"}
    assert set(replies) == {int(r["turn_id"]) for r in answered}
    for r in answered:
        chunk = replies[int(r["turn_id"])]
        expected = f"You said: {r['text']}"
        assert chunk["text"] == expected, (chunk["text"], expected)
        assert chunk["chat_id"] == r["chat_id"]
        group = queued[str(r["chat_id"]), expected]
        assert len(group) == 1, [dict(c) for c in group]
        sends = received.get((str(r["chat_id"]), expected), [])
        assert sends, f"the reply to {r['text']!r} never reached the {chat}"
        if check_reply is not None:
            check_reply(sends)
        assert len(sends) == 1 or chunk["recovered"], (dict(chunk), sends)
    # Likewise for any other text (queue acknowledgements): a surplus needs a recovered chunk.
    for key, group in queued.items():
        if len(received.get(key, [])) > len(group):
            assert any(c["recovered"] for c in group), (key, [dict(c) for c in group])
