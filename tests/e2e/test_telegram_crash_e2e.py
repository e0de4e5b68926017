"""Crash safety over Telegram: `herald run` killed with SIGKILL during bursts loses nothing.

The fake Bot API keeps every update until a later `getUpdates` passes it with its `offset`
(as Telegram does), so a process killed between storing an update and confirming it gets the
update again on restart; a fake LLM answers `You said: <text>` after a short random delay, so
kills land in the middle of polls, turns, commits and sends. Messages keep arriving while the
daemon is down, too. At the end: every update was confirmed, every message was accepted once
and has exactly one outcome, every answered message's reply reached its chat, no message was
answered by two turns, and a text that reached a chat twice belongs to a chunk resent after a
crash (marked recovered).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from gateway.store import Store
from tests.e2e.crash import (
    check_accepted_once,
    check_deliveries,
    check_turns_once,
    crash_daemon,
    database_url,
    kill_during_bursts,
    kill_leftover,
    read_results,
    settle,
    you_said,
)
from tests.fakes.llm import FakeLLM
from tests.fakes.telegram_server import FakeTelegramServer, Sent

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

MESSAGES = 200
USERS = 30
"""Direct chats: each user's chat id is the user's id."""
KILLS = 5
TOKEN = "123456:crash-token"
FIRST_USER = 1001
SETTLE_TIMEOUT = 120.0


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_sigkill_during_bursts_loses_and_duplicates_nothing(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    rng = random.Random(20261123)
    delays = random.Random(7)
    url = database_url(tmp_path, backend, request)
    async with FakeLLM() as llm, FakeTelegramServer(TOKEN) as tg:
        llm.responder = you_said(delays)
        telegram = {
            "token": TOKEN,
            "base_url": tg.base_url,
            "base_file_url": tg.base_file_url,
            "allowed_users": ["*"],
            "poll_timeout": 1,
            "stream_edits": False,
            "min_send_interval": 0,
        }
        daemon = crash_daemon(tmp_path, url, llm, {"telegram": telegram})
        injected: dict[str, tuple[int, int, str]] = {}
        """platform_message_id -> (update id, chat id, text)."""
        per_round = MESSAGES // KILLS

        async def burst(round_: int) -> None:
            for i in range(per_round):
                n = round_ * per_round + i
                user = FIRST_USER + n % USERS
                text = f"message {n}"
                sent = tg.inject_message(user, text, sender_id=user)
                injected[f"{sent.chat_id}:{sent.message_id}"] = (sent.update_id, user, text)
                await asyncio.sleep(rng.uniform(0.0, 0.05))

        try:
            await kill_during_bursts(daemon, rng, KILLS, burst)
            async with Store.open(url, migrate=False) as store:
                try:
                    # Telegram's offset passes an update only after Herald stored it, so with
                    # nothing pending every injected message should be in the inbox: `_check`
                    # says which are not.
                    await settle(store, lambda: not tg.pending, SETTLE_TIMEOUT)
                except TimeoutError:
                    pytest.fail(
                        f"not settled in {SETTLE_TIMEOUT}s ({len(tg.pending)} updates pending):"
                        f"\n{daemon.output()[-5000:]}"
                    )
                await _check(tg, store, injected)
            # And a clean stop still drains and exits 0 with the adapter connected.
            assert await daemon.stop() == 0
        finally:
            await kill_leftover(daemon)


async def _check(
    tg: FakeTelegramServer, store: Store, injected: dict[str, tuple[int, int, str]]
) -> None:
    rows, turn_status, chunks = await read_results(store, "telegram")

    # Telegram's side: every update was confirmed, none is left waiting.
    assert len(injected) == MESSAGES
    assert not tg.pending
    assert {update_id for update_id, _, _ in injected.values()} <= set(tg.confirmed)

    # Every injected message was accepted exactly once and has exactly one outcome.
    by_message = Counter(str(r["platform_message_id"]) for r in rows)
    lost = sorted(set(injected) - set(by_message), key=lambda k: injected[k][0])
    assert not lost, f"confirmed to Telegram but never stored: {[injected[k] for k in lost]}"
    check_accepted_once(rows, {k: (str(chat), text) for k, (_, chat, text) in injected.items()})

    answered, _ = check_turns_once(rows, turn_status)

    # Everything Herald queued was delivered; everything the chats got, Herald had queued;
    # every answered message's reply reached its own chat, exactly once unless it was resent
    # after a crash (its chunk marked recovered).
    received: defaultdict[tuple[str, str], list[Sent]] = defaultdict(list)
    for s in tg.sent:
        received[str(s.chat_id), s.plain_text].append(s)
    check_deliveries(chunks, answered, received, chat="chat")
