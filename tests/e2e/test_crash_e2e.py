"""Crash safety, proven: `herald run` killed with SIGKILL again and again loses nothing.

A fake chat server keeps every message until the adapter acknowledges it (like a real
platform); a fake LLM answers `You said: <text>` after a short random delay, so kills land
in the middle of turns, of commits and of sends. At the end: every message was accepted and
has exactly one outcome, every answered message's reply reached the chat, no message was
answered by two turns, and every duplicate send is a resend marked recovered.
"""

from __future__ import annotations

import asyncio
import random
import signal
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from sqlalchemy import select

from gateway.store import Store
from gateway.store.tables import inbox, outbox, turns
from tests.e2e.crash import (
    check_turns_once,
    crash_daemon,
    database_url,
    kill_leftover,
    you_said,
)
from tests.fakes.chat_server import FakeChatServer
from tests.fakes.llm import FakeLLM

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

MESSAGES = 300
CHATS = 30
KILLS = 6
TOKEN = "crash-token"


async def _settle(server: FakeChatServer, store: Store, expected: int, timeout: float) -> None:
    """Wait until every message is acknowledged, answered and its reply sent."""
    async with asyncio.timeout(timeout):
        while True:
            async with store.read() as conn:
                open_rows = await conn.scalar(
                    select(inbox.c.id).where(inbox.c.status != "done").limit(1)
                )
                accepted = len((await conn.execute(select(inbox.c.id))).all())
                unsent = await conn.scalar(
                    select(outbox.c.id).where(outbox.c.status.in_(["pending", "sending"])).limit(1)
                )
            if not server.pending and open_rows is None and unsent is None and accepted >= expected:
                return
            await asyncio.sleep(0.2)


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_sigkill_at_random_moments_loses_and_duplicates_nothing(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    rng = random.Random(20261122)
    url = database_url(tmp_path, backend, request)
    async with FakeLLM() as llm, FakeChatServer(TOKEN) as chat:
        llm.responder = you_said(rng)
        test = {
            "url": chat.base_url,
            "token": TOKEN,
            "allowed_users": ["*"],
            "stream_edits": False,
            "poll_timeout": 1,
        }
        daemon = crash_daemon(tmp_path, url, llm, {"test": test})
        texts: dict[str, str] = {}
        per_round = MESSAGES // KILLS
        try:
            for round_ in range(KILLS):
                await daemon.start()
                for i in range(per_round):
                    n = round_ * per_round + i
                    user = f"u{n % CHATS}"
                    message_id = chat.inject(user, f"message {n}", sender_id=user)
                    texts[message_id] = f"message {n}"
                    if i % 10 == 9:
                        await asyncio.sleep(rng.uniform(0.0, 0.1))
                # Let it work for a random while, then kill it mid-flight.
                await asyncio.sleep(rng.uniform(0.2, 1.5))
                daemon.signal(signal.SIGKILL)
                assert await daemon.wait() == -signal.SIGKILL
            await daemon.start()
            async with Store.open(url, migrate=False) as store:
                await _settle(chat, store, MESSAGES, timeout=120)
                await _check(chat, store, texts)
            # And a clean stop still drains and exits 0 with the adapter connected.
            assert await daemon.stop() == 0
        finally:
            await kill_leftover(daemon)


async def _check(chat: FakeChatServer, store: Store, texts: dict[str, str]) -> None:
    async with store.read() as conn:
        rows = (await conn.execute(select(inbox))).mappings().all()
        done_turns = {
            int(r.id): str(r.status)
            for r in (await conn.execute(select(turns.c.id, turns.c.status))).all()
        }
        chunks = (await conn.execute(select(outbox))).mappings().all()

    # Every injected message was accepted exactly once and has exactly one outcome.
    by_message = Counter(str(r["platform_message_id"]) for r in rows)
    assert set(by_message) == set(texts)
    assert set(by_message.values()) == {1}
    outcomes = Counter(str(r["outcome"]) for r in rows)
    assert set(outcomes) <= {"answered", "dropped"}, outcomes
    for r in rows:
        assert r["status"] == "done"
        if r["outcome"] == "dropped":  # only a message whose turn was cut off three times
            assert "stopped" in str(r["outcome_detail"])

    answered, _ = check_turns_once(rows, done_turns)

    # Every answered message's reply reached its chat, with the right text.
    replies = {str(c["idempotency_key"]): c for c in chunks if c["kind"] == "reply"}
    sent_keys = defaultdict(list)
    for s in chat.sent:
        sent_keys[s.idempotency_key].append(s)
    for r in answered:
        chunk = next(c for c in replies.values() if c["turn_id"] == r["turn_id"])
        assert chunk["status"] == "sent", chunk
        sends = sent_keys[str(chunk["idempotency_key"])]
        assert sends, f"the reply to {r['text']!r} never reached the chat"
        assert sends[0].text == f"You said: {texts[str(r['platform_message_id'])]}"
        assert sends[0].chat_id == r["chat_id"]

    # Any duplicate is a resend after a crash, and marked so.
    for key, sends in sent_keys.items():
        assert all(s.recovered for s in sends[1:]), (key, sends)
