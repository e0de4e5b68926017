"""Crash safety over Discord: `herald run` killed with SIGKILL during bursts loses nothing.

Discord has no acknowledgement: what the gateway sent a killed process is gone, and what
arrives while Herald is down is sent to no one. It is all still in channel history, though,
and Herald moves a channel's last seen id only after the inbox stored the message; after
every READY it reads each channel it talks in from there on. A fake LLM answers
`You said: <text>` after a short random delay, so kills land in the middle of events, turns,
commits and posts. At the end: every message was accepted once and has exactly one outcome,
every answered message's reply reached its DM, no message was answered by two turns, and a text
that reached a DM twice belongs to a chunk resent after a crash (marked recovered).

Each person says hello first, while Herald runs: a DM channel Herald never heard from is
not one it can read back (Discord does not list a bot's DM channels).
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from pathlib import Path

import pytest
from sqlalchemy import func, select

from gateway.store import Store
from gateway.store.tables import inbox
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
from tests.fakes.discord_server import DEFAULT_TOKEN, FakeDiscordServer, Posted
from tests.fakes.llm import FakeLLM

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

MESSAGES = 60
USERS = 8
KILLS = 3
SETTLE_TIMEOUT = 90.0


def user_id(n: int) -> str:
    return f"20000000000000{n:05d}"


def dm_id(n: int) -> str:
    return f"30000000000000{n:05d}"


async def stored(store: Store) -> int:
    async with store.read() as conn:
        count = await conn.scalar(
            select(func.count()).select_from(inbox).where(inbox.c.platform == "discord")
        )
    return int(count or 0)


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_sigkill_during_bursts_loses_and_duplicates_nothing(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    rng = random.Random(20261123)
    delays = random.Random(7)
    url = database_url(tmp_path, backend, request)
    async with FakeLLM() as llm, FakeDiscordServer(heartbeat_interval=1.0) as discord:
        llm.responder = you_said(delays)
        for n in range(USERS):
            discord.add_user(user_id(n), f"user{n}")
            discord.add_channel(dm_id(n), dm=True)
        section = {
            "token": DEFAULT_TOKEN,
            "api_base": discord.api_base,
            "allowed_users": ["*"],
            "stream_edits": False,
            "min_send_interval": 0,
        }
        daemon = crash_daemon(tmp_path, url, llm, {"discord": section})
        injected: dict[str, tuple[str, str]] = {}
        """platform_message_id -> (chat id, text)."""

        def say(n: int, text: str) -> None:
            sent = discord.inject_message(dm_id(n), text, author=user_id(n))
            injected[f"{dm_id(n)}:{sent['id']}"] = (dm_id(n), text)

        per_round = MESSAGES // KILLS

        async def burst(round_: int) -> None:
            for i in range(per_round):
                n = round_ * per_round + i
                say(n % USERS, f"message {n}")
                await asyncio.sleep(rng.uniform(0.0, 0.05))

        try:
            await daemon.start()
            for n in range(USERS):
                say(n, f"hello from {n}")
            await discord.wait_for_posted(
                lambda p: p.content.startswith("You said: hello"), count=USERS, timeout=60
            )
            assert await daemon.stop() == 0  # kill_during_bursts starts it again
            await kill_during_bursts(daemon, rng, KILLS, burst)
            async with Store.open(url, migrate=False) as store:
                try:
                    async with asyncio.timeout(SETTLE_TIMEOUT):
                        while await stored(store) < len(injected):
                            await asyncio.sleep(0.2)
                    await settle(store, lambda: True, SETTLE_TIMEOUT)
                except TimeoutError:
                    pytest.fail(
                        f"not settled in {SETTLE_TIMEOUT}s ({await stored(store)} of "
                        f"{len(injected)} stored):\n{daemon.output()[-5000:]}"
                    )
                rows, turn_status, chunks = await read_results(store, "discord")
            assert len(injected) == MESSAGES + USERS
            check_accepted_once(rows, injected)
            answered, _ = check_turns_once(rows, turn_status)
            received: defaultdict[tuple[str, str], list[Posted]] = defaultdict(list)
            for p in discord.posted:
                received[p.channel_id, p.content].append(p)
            check_deliveries(chunks, answered, received, chat="DM")
            # And a clean stop still drains and exits 0 with the adapter connected.
            assert await daemon.stop() == 0
        finally:
            await kill_leftover(daemon)
