"""PostgreSQL under stress while messages arrive on Telegram: its connections killed with
`pg_terminate_backend`, and the whole server stopped (as in a crash) and started again
(a private server: the machine's shared one is never restarted). Herald keeps running (the
same process, never restarted), reconnects by itself, and in the end every update was
confirmed, every message accepted once with one outcome, no turn ran twice, and every reply
reached its chat once unless resent marked recovered.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from gateway.store import Store
from tests.e2e.crash import crash_daemon, kill_leftover, you_said
from tests.e2e.crash_platforms import TelegramCrash
from tests.fakes.llm import FakeLLM
from tests.fakes.private_pg import PrivatePostgres

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.timeout(300)]

ROUNDS = 3


class Outage(TelegramCrash):
    """Telegram's crash scenario, with outages of the database instead of kills."""

    messages = 90
    kills = ROUNDS
    settle_timeout = 120.0


async def terminate_backends(url: str) -> int:
    """`pg_terminate_backend` every other connection to the database of `url`."""
    engine = create_async_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            result = await conn.exec_driver_sql(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return int(result.scalar_one())
    finally:
        await engine.dispose()


async def under_outages(tmp_path: Path, url: str, outage: Callable[[], Awaitable[None]]) -> None:
    """Bursts of Telegram messages with an outage in the middle of each, then the checks."""
    crash = Outage()
    async with contextlib.AsyncExitStack() as stack:
        llm = await stack.enter_async_context(FakeLLM())
        llm.responder = you_said(random.Random(crash.delays_seed))
        await crash.start(stack)
        daemon = crash_daemon(tmp_path, url, llm, {"telegram": crash.section()})
        try:
            await daemon.start()
            assert daemon.process is not None
            pid = daemon.process.pid
            for round_ in range(ROUNDS):
                arriving = asyncio.create_task(crash.burst(round_))
                await asyncio.sleep(crash.rng.uniform(0.2, 1.0))
                await outage()
                await arriving
            async with Store.open(url, migrate=False) as store:
                await crash.settle(store, daemon)
                await crash.check(store)
            # The same process all along, ready again, and it still drains cleanly.
            assert daemon.process.pid == pid
            assert daemon.process.returncode is None
            async with httpx.AsyncClient() as http:
                assert (await http.get(f"{daemon.url}/ready")).status_code == 200
            assert await daemon.stop() == 0
        finally:
            await kill_leftover(daemon)


async def test_connections_killed_mid_load_lose_nothing(tmp_path: Path, pg_url: str) -> None:
    killed: list[int] = []

    async def outage() -> None:
        killed.append(await terminate_backends(pg_url))

    await under_outages(tmp_path, pg_url, outage)
    assert sum(killed) > 0  # there were connections to kill


async def test_a_server_restart_mid_load_loses_nothing(tmp_path: Path) -> None:
    async with PrivatePostgres() as pg:

        async def outage() -> None:
            await pg.stop("immediate")  # every connection dropped, as in a crash
            await asyncio.sleep(1.0)  # down for a while: connections are refused meanwhile
            await pg.start()

        await under_outages(tmp_path, pg.url, outage)
