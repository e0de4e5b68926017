"""Crash safety over Slack Socket Mode: `herald run` killed with SIGKILL during bursts loses
nothing.

The fake Slack redelivers every envelope not acknowledged within `ack_timeout` (on the next
socket when the old one is gone), as Slack does, and Herald acknowledges an envelope only after
its event is in the inbox; so a process killed between storing an event and acknowledging it
gets the event again on restart, and an event it never stored comes again too. A fake LLM
answers `You said: <text>` after a short random delay, so kills land in the middle of envelopes,
turns, commits and posts. Messages keep arriving while the daemon is down, too. At the end:
every event was acknowledged, every message was accepted once and has exactly one outcome, every
answered message's reply reached its DM, no message was answered by two turns, and a text that
reached a DM twice belongs to a chunk resent after a crash (marked recovered).
"""

from __future__ import annotations

import asyncio
import random
import signal
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import RowMapping, select

from gateway.store import Store
from gateway.store.tables import inbox, outbox, turns
from tests.e2e.daemon import Daemon
from tests.fakes.llm import FakeLLM, Reply, last_user_text
from tests.fakes.slack_server import (
    DEFAULT_APP_TOKEN,
    DEFAULT_BOT_TOKEN,
    FakeSlackServer,
    Posted,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

MESSAGES = 200
USERS = 30
"""Each user writes in a DM of their own: user `U…NN`, channel `D…NN`."""
KILLS = 5
ACK_TIMEOUT = 1.0
"""Seconds the fake waits for an ack before sending the envelope again."""
MAX_RETRIES = 1000
"""Redeliveries before the fake gives up: never, here (Herald cannot help Slack's limit)."""
SETTLE_TIMEOUT = 90.0


def user_id(n: int) -> str:
    return f"U0CRASH{n:03d}"


def dm_of(user: str) -> str:
    return "D" + user[1:]


async def _settle(slack: FakeSlackServer, store: Store, timeout: float) -> None:
    """Wait until every event is acknowledged, every stored message done and every chunk sent.

    Herald acknowledges an envelope only after the inbox commit, so with nothing pending on the
    fake every injected message should be in the inbox: `_check` says which are not.
    """
    async with asyncio.timeout(timeout):
        while True:
            # Looked at before the database: an event acknowledged by then is stored by then.
            acknowledged = not slack.pending
            async with store.read() as conn:
                open_rows = await conn.scalar(
                    select(inbox.c.id).where(inbox.c.status != "done").limit(1)
                )
                unsent = await conn.scalar(
                    select(outbox.c.id).where(outbox.c.status.in_(["pending", "sending"])).limit(1)
                )
            if acknowledged and open_rows is None and unsent is None:
                return
            # The database is polled: no change of the fake's state says when it is done.
            await asyncio.sleep(0.2)


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_sigkill_during_bursts_loses_and_duplicates_nothing(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    rng = random.Random(20261124)
    delays = random.Random(11)
    database_url = (
        f"sqlite+aiosqlite:///{tmp_path / 'state' / 'herald.db'}"
        if backend == "sqlite"
        else str(request.getfixturevalue("pg_url"))
    )

    def answer(body: dict[str, Any]) -> Reply:
        return Reply(text=f"You said: {last_user_text(body)}", delay=delays.uniform(0.0, 0.15))

    async with (
        FakeLLM() as llm,
        FakeSlackServer(ack_timeout=ACK_TIMEOUT, max_retries=MAX_RETRIES) as slack,
    ):
        llm.responder = answer
        daemon = Daemon(
            tmp_path / "state",
            {
                "database_url": database_url,
                "log_level": "INFO",
                "llm": {"base_url": llm.base_url, "api_key": "k", "memory_pass": False},
                "sessions": {"max_concurrent_turns": 8, "drain_timeout": 1},
                "platforms": {
                    "slack": {
                        "bot_token": DEFAULT_BOT_TOKEN,
                        "app_token": DEFAULT_APP_TOKEN,
                        "base_url": slack.base_url,
                        "allowed_users": ["*"],
                        "ping_interval": 2,
                        "stream_edits": False,
                        "working_reaction": "",
                        "min_send_interval": 0,
                    }
                },
            },
        )
        (tmp_path / "state").mkdir()
        injected: dict[str, tuple[str, str, str]] = {}
        """platform_message_id (`<channel>:<ts>`) -> (event id, channel, text)."""
        per_round = MESSAGES // KILLS

        async def burst(round_: int) -> None:
            for i in range(per_round):
                n = round_ * per_round + i
                user = user_id(n % USERS)
                text = f"message {n}"
                sent = slack.inject_message(dm_of(user), text, user=user)
                injected[f"{sent.channel}:{sent.ts}"] = (sent.event_id, sent.channel, text)
                await asyncio.sleep(rng.uniform(0.0, 0.05))

        arriving: asyncio.Task[None] | None = None
        try:
            for round_ in range(KILLS):
                await daemon.start()
                # The burst runs on while the daemon is killed at a random moment: some
                # messages arrive mid-flight, some while it is down.
                arriving = asyncio.create_task(burst(round_))
                await asyncio.sleep(rng.uniform(0.2, 1.5))
                daemon.signal(signal.SIGKILL)
                assert await daemon.wait() == -signal.SIGKILL
                await arriving
            await daemon.start()
            async with Store.open(database_url, migrate=False) as store:
                try:
                    await _settle(slack, store, timeout=SETTLE_TIMEOUT)
                except TimeoutError:
                    pytest.fail(
                        f"not settled in {SETTLE_TIMEOUT}s ({len(slack.pending)} events "
                        f"pending):\n{daemon.output()[-5000:]}"
                    )
                await _check(slack, store, injected)
            # And a clean stop still drains and exits 0 with the adapter connected.
            assert await daemon.stop() == 0
        finally:
            if arriving is not None and not arriving.done():
                arriving.cancel()
            if daemon.process is not None and daemon.process.returncode is None:
                daemon.process.kill()
                await daemon.process.wait()
        # Herald never held two sockets at once, restarts included.
        assert slack.max_open_sockets == 1


async def _check(
    slack: FakeSlackServer, store: Store, injected: dict[str, tuple[str, str, str]]
) -> None:
    async with store.read() as conn:
        rows = (
            (await conn.execute(select(inbox).where(inbox.c.platform == "slack"))).mappings().all()
        )
        turn_status = {
            int(r.id): str(r.status)
            for r in (await conn.execute(select(turns.c.id, turns.c.status))).all()
        }
        chunks = (await conn.execute(select(outbox))).mappings().all()

    # Slack's side: every event was acknowledged by Herald, none given up or left waiting.
    assert len(injected) == MESSAGES
    assert not slack.pending
    assert slack.expired == []
    event_ids = {event_id for event_id, _, _ in injected.values()}
    assert event_ids <= set(slack.acked)
    acked_by_ack = {
        envelope.event_id
        for envelope in slack.envelopes
        if envelope.acked_at is not None and envelope.event_id in event_ids
    }
    assert acked_by_ack == event_ids  # each by an ack of Herald's on a socket

    # Every injected message was accepted exactly once and has exactly one outcome.
    by_message = Counter(str(r["platform_message_id"]) for r in rows)
    lost = sorted(set(injected) - set(by_message))
    assert not lost, f"acknowledged to Slack but never stored: {[injected[k] for k in lost]}"
    assert set(by_message) == set(injected)
    assert set(by_message.values()) == {1}
    outcomes = Counter(str(r["outcome"]) for r in rows)
    assert set(outcomes) <= {"answered", "dropped"}, outcomes
    for r in rows:
        assert r["status"] == "done"
        _, channel, text = injected[str(r["platform_message_id"])]
        assert (r["chat_id"], r["text"]) == (channel, text)
        if r["outcome"] == "dropped":  # only a message whose turn was cut off three times
            assert "stopped" in str(r["outcome_detail"]), dict(r)

    # No turn ran twice: one completed turn per answered message, each answering one message.
    answered = [r for r in rows if r["outcome"] == "answered"]
    turn_ids = [int(r["turn_id"]) for r in answered]
    assert len(set(turn_ids)) == len(turn_ids)
    assert all(turn_status[t] == "completed" for t in turn_ids)
    completed = {t for t, status in turn_status.items() if status == "completed"}
    assert completed == set(turn_ids)

    # Everything Herald queued was delivered; everything the DMs got, Herald had queued.
    assert all(c["status"] == "sent" for c in chunks), [
        dict(c) for c in chunks if c["status"] != "sent"
    ]
    queued: defaultdict[tuple[str, str], list[RowMapping]] = defaultdict(list)
    for c in chunks:
        queued[str(c["chat_id"]), str(c["text"])].append(c)
    received: defaultdict[tuple[str, str], list[Posted]] = defaultdict(list)
    for p in slack.posted:
        received[p.channel, p.text].append(p)
    unqueued = received.keys() - queued.keys()
    assert not unqueued, f"reached a DM but never queued: {sorted(unqueued)}"
    for key, group in queued.items():
        assert len(received.get(key, [])) >= len(group), (key, [dict(c) for c in group])

    # Every answered message's reply reached its own DM, exactly once unless it was resent
    # after a crash (its chunk marked recovered).
    replies = {int(c["turn_id"]): c for c in chunks if c["kind"] == "reply"}
    assert set(replies) == set(turn_ids)
    for r in answered:
        chunk = replies[int(r["turn_id"])]
        expected = f"You said: {r['text']}"
        assert chunk["text"] == expected
        assert chunk["chat_id"] == r["chat_id"]
        group = queued[str(r["chat_id"]), expected]
        assert len(group) == 1, [dict(c) for c in group]
        sends = received.get((str(r["chat_id"]), expected), [])
        assert sends, f"the reply to {r['text']!r} never reached the DM"
        assert all(s.thread_ts is None for s in sends)  # a DM is answered in the DM itself
        assert len(sends) == 1 or chunk["recovered"], (dict(chunk), sends)
    # Likewise for any other text (queue acknowledgements): a surplus needs a recovered chunk.
    for key, group in queued.items():
        if len(received.get(key, [])) > len(group):
            assert any(c["recovered"] for c in group), (key, [dict(c) for c in group])
