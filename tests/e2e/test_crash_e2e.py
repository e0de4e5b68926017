"""Crash safety, proven on every platform: `herald run` killed with SIGKILL again and again,
during bursts of messages, loses nothing and duplicates nothing.

Each platform's fake keeps or repeats what Herald did not acknowledge the way the platform
does (tests/e2e/crash_platforms.py says how, per platform); a fake LLM answers
`You said: <text>` after a short random delay, so kills land in the middle of receiving,
turns, commits and sends, and messages keep arriving while the daemon is down. At the end:
what the platform offers for acknowledgement was acknowledged, every message was accepted once
and has exactly one outcome, every answered message's reply reached its chat, no message was
answered by two turns, and a text that reached a chat twice belongs to a chunk resent after a
crash (marked recovered). Then a clean stop still drains and exits 0.
"""

from __future__ import annotations

import contextlib
import random
from pathlib import Path

import pytest

from gateway.store import Store
from tests.e2e.crash import crash_daemon, database_url, kill_during_bursts, kill_leftover, you_said
from tests.e2e.crash_platforms import CRASHES
from tests.fakes.llm import FakeLLM

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


ON_POSTGRES = ("loopback", "telegram")
"""The platforms whose crash test also runs on PostgreSQL. What a platform acknowledges and
redelivers does not depend on the store; the store's own crash safety on PostgreSQL is shown
by the loopback platform's test (the most messages and kills), Telegram's, the cluster test
(tests/e2e/test_cluster_e2e.py) and the server restarts of test_postgres_outage_e2e.py."""


@pytest.mark.parametrize(
    ("name", "backend"),
    [
        *((name, "sqlite") for name in sorted(CRASHES)),
        *(
            pytest.param(name, "postgres", marks=pytest.mark.postgres, id=f"{name}-postgres")
            for name in ON_POSTGRES
        ),
    ],
)
async def test_sigkill_during_bursts_loses_and_duplicates_nothing(
    tmp_path: Path, name: str, backend: str, request: pytest.FixtureRequest
) -> None:
    crash = CRASHES[name]()
    url = database_url(tmp_path, backend, request)
    async with contextlib.AsyncExitStack() as stack:
        llm = await stack.enter_async_context(FakeLLM())
        llm.responder = you_said(random.Random(crash.delays_seed))
        await crash.start(stack)
        daemon = crash_daemon(tmp_path, url, llm, {crash.section_name: crash.section()})
        try:
            await crash.before(daemon)
            await kill_during_bursts(daemon, crash.rng, crash.kills, crash.burst, url)
            async with Store.open(url, migrate=False) as store:
                await crash.settle(store, daemon)
                await crash.check(store)
            # And a clean stop still drains and exits 0 with the adapter connected.
            assert await daemon.stop() == 0
        finally:
            await kill_leftover(daemon)
        crash.after()
