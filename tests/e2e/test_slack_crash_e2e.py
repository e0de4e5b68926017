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
from collections import Counter, defaultdict
from collections.abc import Sequence
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


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_sigkill_during_bursts_loses_and_duplicates_nothing(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    rng = random.Random(20261124)
    delays = random.Random(11)
    url = database_url(tmp_path, backend, request)
    async with (
        FakeLLM() as llm,
        FakeSlackServer(ack_timeout=ACK_TIMEOUT, max_retries=MAX_RETRIES) as slack,
    ):
        llm.responder = you_said(delays)
        section = {
            "bot_token": DEFAULT_BOT_TOKEN,
            "app_token": DEFAULT_APP_TOKEN,
            "base_url": slack.base_url,
            "allowed_users": ["*"],
            "ping_interval": 2,
            "stream_edits": False,
            "working_reaction": "",
            "min_send_interval": 0,
        }
        daemon = crash_daemon(tmp_path, url, llm, {"slack": section})
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

        try:
            await kill_during_bursts(daemon, rng, KILLS, burst)
            async with Store.open(url, migrate=False) as store:
                try:
                    # Herald acknowledges an envelope only after the inbox commit, so with
                    # nothing pending every injected message should be in the inbox: `_check`
                    # says which are not.
                    await settle(store, lambda: not slack.pending, SETTLE_TIMEOUT)
                except TimeoutError:
                    pytest.fail(
                        f"not settled in {SETTLE_TIMEOUT}s ({len(slack.pending)} events "
                        f"pending):\n{daemon.output()[-5000:]}"
                    )
                await _check(slack, store, injected)
            # And a clean stop still drains and exits 0 with the adapter connected.
            assert await daemon.stop() == 0
        finally:
            await kill_leftover(daemon)
        # Herald never held two sockets at once, restarts included.
        assert slack.max_open_sockets == 1


async def _check(
    slack: FakeSlackServer, store: Store, injected: dict[str, tuple[str, str, str]]
) -> None:
    rows, turn_status, chunks = await read_results(store, "slack")

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
    check_accepted_once(rows, {k: (chat, text) for k, (_, chat, text) in injected.items()})

    answered, _ = check_turns_once(rows, turn_status)

    # Everything Herald queued was delivered; everything the DMs got, Herald had queued;
    # every answered message's reply reached its own DM, exactly once unless it was resent
    # after a crash (its chunk marked recovered), and in the DM itself, not in a thread.
    received: defaultdict[tuple[str, str], list[Posted]] = defaultdict(list)
    for p in slack.posted:
        received[p.channel, p.text].append(p)
    check_deliveries(chunks, answered, received, chat="DM", check_reply=_not_in_threads)


def _not_in_threads(sends: Sequence[Posted]) -> None:
    assert all(s.thread_ts is None for s in sends)  # a DM is answered in the DM itself
