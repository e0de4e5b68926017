"""A database that refuses writes (a full disk, a read-only database): every retry loop backs
off and logs once, `/health` says degraded, `/ready` is 503, and once writes work again
everything resumes and nothing is lost. On SQLite and PostgreSQL (see `tests/fakes/full_disk.py`
for how each is filled).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import event
from sqlalchemy.exc import DBAPIError, OperationalError

from gateway.channels import Channels
from gateway.config import DeliveryConfig, HeraldConfig
from gateway.contracts.ids import AccountId, ChatId
from gateway.contracts.messages import DeliveryReceipt, OutboundMessage, utcnow
from gateway.delivery import DeliveryWorker
from gateway.http.app import create_app
from gateway.http.deps import AppDeps
from gateway.metrics import Metrics
from gateway.store import Store
from gateway.store.health import WriteProblem
from gateway.store.inbox import Outcome
from gateway.store.outbox import Chunk, Outbox, Target
from gateway.store.store import set_setting
from tests.fakes.full_disk import FullDisk
from tests.fakes.platform import RecordingAdapter, inbound
from tests.integration.rig import outcomes, running_rig

pytestmark = pytest.mark.timeout(60)

BACKOFF = DeliveryConfig(backoff_initial=1.0, backoff_max=300.0, store_retry_max=8.0)
"""Never slept for real: the worker's `sleep` is the test's."""


class GatedAdapter(RecordingAdapter):
    """Holds every send to chat `c1` until `gate` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def send(self, message: OutboundMessage) -> DeliveryReceipt:
        if message.chat_id == "c1":
            self.attempts.append((message.chat_id, "held"))
            async with self.changed:
                self.changed.notify_all()
            await self.gate.wait()
        return await super().send(message)


def chunk(chat: str, at: datetime | None = None) -> Chunk:
    target = Target("test", AccountId("acct"), ChatId(chat))
    return Chunk(f"full:{chat}", target, f"to {chat}", not_before=at)


def problem_of(store: Store) -> WriteProblem:
    """What a full disk looks like on this backend (see FullDisk)."""
    return WriteProblem.DISK_FULL if store.dialect == "sqlite" else WriteProblem.READ_ONLY


async def test_delivery_backs_off_while_writes_fail_and_loses_nothing(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    start = utcnow()
    outbox = Outbox(store)
    # c1 is due now; c2 and c3 only after the disk is full (the worker's clock is the test's).
    later = start + timedelta(seconds=60)
    await outbox.enqueue([chunk("c1"), chunk("c2", later), chunk("c3", later)])
    now = [utcnow() + timedelta(seconds=1)]
    adapter = GatedAdapter()
    channels = Channels()
    channels.register("test", "acct", adapter.limits, lambda: adapter)
    delays: list[float] = []

    with FullDisk(store) as disk:

        async def sleep(seconds: float) -> None:
            delays.append(seconds)
            # Space again once both kinds of write were refused for a while: storing c1's
            # receipt, and claiming c2 and c3.
            if len(delays) >= 12 and len(set(disk.refused)) >= 2:
                disk.full = False
            await asyncio.sleep(0)

        worker = DeliveryWorker(
            outbox, channels, BACKOFF, Metrics(), clock=lambda: now[0], sleep=sleep
        )
        async with asyncio.timeout(30), asyncio.TaskGroup() as tg:
            task = tg.create_task(worker.run())
            await adapter.wait_for(lambda _: ("c1", "held") in adapter.attempts)
            disk.full = True
            now[0] = start + timedelta(seconds=120)  # c2 and c3 are due; their claims fail
            worker.wake()
            adapter.gate.set()  # c1 is sent; storing that fails until there is space
            delivered = await adapter.wait_for(lambda d: len(d) == 3)
            while await outbox.counts() != {"sent": 3}:  # the last receipts being stored
                await asyncio.sleep(0.01)
            assert store.health.degraded is None
            task.cancel()

    # Every chunk went out exactly once and is recorded as sent.
    assert sorted(d.chat_id for d in delivered) == ["c1", "c2", "c3"]
    # It slept between tries, growing delays up to the cap, instead of spinning: the writes
    # tried are bounded by the sleeps (c1's record, and c2 and c3's claims, per sleep).
    assert len(delays) >= 12
    # The first wait is the first try's (or the second's, when a chat's receipt and a look
    # failed before it: on a loaded machine both can come first).
    assert delays[0] <= 2 * BACKOFF.backoff_initial
    assert all(d <= BACKOFF.store_retry_max for d in delays)
    assert max(delays) >= BACKOFF.store_retry_max / 2
    assert len(disk.refused) <= 3 * len(delays) + 3
    # One line when it started (with the traceback), one when it ended; no line per try.
    lines = [r for r in caplog.records if r.name == "gateway.delivery"]
    assert [r.levelno for r in lines] == [logging.ERROR, logging.WARNING]
    assert lines[0].exc_info is not None
    assert "works again" in lines[1].getMessage()
    health = [r.getMessage() for r in caplog.records if r.name == "gateway.store.health"]
    assert len(health) == 2
    assert f"refuses writes ({problem_of(store)})" in health[0]
    assert "takes writes again" in health[1]


@pytest.fixture
async def http_rig(store: Store, tmp_path: Path) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    async with running_rig(store, tmp_path, gated=False) as rig:
        deps = AppDeps(HeraldConfig(), store, rig.manager, Metrics(), "fake", "fake")
        deps.state.serving = True
        app = create_app(deps)
        transport = httpx.ASGITransport(app=app.state.asgi)
        # A request made on this machine to this server (8642: `api.port`'s default): without
        # an API key, only such a request reads /health's details.
        local = "http://127.0.0.1:8642"
        async with httpx.AsyncClient(transport=transport, base_url=local) as http:
            yield rig, http


async def test_health_and_ready_report_refused_writes_until_they_work_again(
    store: Store, http_rig: tuple[Any, httpx.AsyncClient]
) -> None:
    rig, http = http_rig
    message = inbound("hello", chat="c1")
    assert (await http.get("/ready")).status_code == 200
    with FullDisk(store, full=True):
        with pytest.raises(DBAPIError, match=r"full|read-only"):  # so not acknowledged
            await rig.manager.accept(message)
        assert store.health.degraded is not None

        health = (await http.get("/health")).json()
        assert health["status"] == "degraded"
        assert health["store"].startswith(f"degraded ({problem_of(store)} since ")
        ready = await http.get("/ready")
        assert ready.status_code == 503
        assert ready.json()["store"] == health["store"]

    # Space again: the platform redelivers the message, and it is answered.
    await rig.manager.accept(message)
    await rig.adapter.wait_for(lambda d: [x.text for x in d] == ["answer to hello"])
    assert outcomes(await rig.settled("test:acct:c1", 1)) == [("hello", Outcome.ANSWERED)]
    health = (await http.get("/health")).json()
    assert (health["status"], health["store"]) == ("ok", "ok")
    assert (await http.get("/ready")).status_code == 200


async def test_sqlite_itself_reports_a_full_database(tmp_path: Path) -> None:
    """No fault injection: SQLite at its page limit (`PRAGMA max_page_count`) refuses to
    grow with SQLITE_FULL, as on a full disk."""
    limit: list[int | None] = [None]
    async with Store.open(f"sqlite+aiosqlite:///{tmp_path / 'herald.db'}") as store:

        @event.listens_for(store.engine.sync_engine, "connect")
        def _limit(dbapi_connection: Any, _record: Any) -> None:
            if limit[0] is not None:
                dbapi_connection.execute(f"PRAGMA max_page_count={limit[0]}")

        async with store.read() as conn:
            pages = int((await conn.exec_driver_sql("PRAGMA page_count")).scalar_one())
        limit[0] = pages
        await store.engine.dispose()  # new connections, with the limit
        with pytest.raises(OperationalError, match="database or disk is full") as full:
            async with store.write() as conn:
                await set_setting(conn, "big", "x" * 200_000)
        assert isinstance(full.value.orig, sqlite3.OperationalError)
        degraded = store.health.degraded
        assert degraded is not None
        assert degraded.problem is WriteProblem.DISK_FULL

        limit[0] = pages * 100
        await store.engine.dispose()
        async with store.write() as conn:
            await set_setting(conn, "big", "x" * 200_000)
        assert store.health.describe() == "ok"
