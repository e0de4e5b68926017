"""The whole daemon in-process, with one platform pointed at its fake and a fake LLM."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import RowMapping, select

from gateway.config import HeraldConfig
from gateway.contracts.adapter import AdapterState
from gateway.cron.clock import Clock
from gateway.store import Store
from gateway.store.tables import blob_chunks, inbox
from gateway.supervisor import Supervisor
from tests.e2e.daemon import free_port
from tests.fakes.llm import FakeLLM

WAIT = 15.0
START_WAIT = 60.0
"""A start on a loaded 2-core machine (migrations, bundled skills) takes longer than a reply;
a start that fails ends the wait at once."""


@dataclass
class Herald:
    """A running in-process daemon."""

    supervisor: Supervisor
    config: HeraldConfig
    url: str
    store: Store
    platform: str
    """A second connection to the daemon's database, for reading what it stored."""
    exit_code: int | None = None
    """What `Supervisor.run()` returned, once `running_daemon` has stopped it."""

    async def ready(self) -> int:
        """The status code of `GET /ready`."""
        async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
            return (await client.get(f"{self.url}/ready")).status_code

    async def until(self, check: Callable[[], Any], timeout: float = WAIT) -> None:
        """Poll an async or sync condition every 20 ms until it is truthy (TimeoutError)."""
        await _until(check, timeout)

    async def rows(self) -> list[RowMapping]:
        """Every stored inbound message of the platform, oldest first."""
        async with self.store.read() as conn:
            result = await conn.execute(
                select(inbox).where(inbox.c.platform == self.platform).order_by(inbox.c.id)
            )
            return list(result.mappings().all())

    async def kept_files(self) -> dict[str, bytes]:
        """The bytes of every file kept in the database's blob store, by key (received
        files live there, not in the state directory)."""
        async with self.store.read() as conn:
            result = await conn.execute(
                select(blob_chunks.c.key, blob_chunks.c.data).order_by(
                    blob_chunks.c.key, blob_chunks.c.seq
                )
            )
            out: dict[str, bytes] = {}
            for key, data in result:
                out[key] = out.get(key, b"") + bytes(data)
            return out

    async def answered(self, count: int) -> list[RowMapping]:
        """Wait until `count` messages of the platform are stored with an outcome; return all
        its rows."""

        async def done() -> bool:
            rows = await self.rows()
            return len(rows) >= count and all(r["outcome"] for r in rows)

        await self.until(done)
        return await self.rows()

    def adapter_state(self) -> AdapterState:
        """The platform adapter's liveness."""
        return self.supervisor.adapter_states()[self.platform]


def herald_config(
    tmp_path: Path,
    llm: FakeLLM,
    platform: str,
    section: dict[str, Any],
    *,
    port: int,
    extra: dict[str, Any] | None = None,
) -> HeraldConfig:
    """A config: SQLite under tmp_path, the fake LLM, one platform section (plus `extra`
    top-level sections, replacing the defaults here; an `llm` section there means `llm` is
    not read, so it may be a server not started)."""
    extra = extra or {}
    llm_section = extra.get("llm") or {
        "base_url": llm.base_url,
        "api_key": "k",
        "memory_pass": False,
    }
    return HeraldConfig.model_validate(
        {
            "state_dir": str(tmp_path / "state"),
            "api": {"host": "127.0.0.1", "port": port},
            "sessions": {"drain_timeout": 2, "ack_interval": 0},
            "delivery": {"backoff_initial": 0.2, "backoff_max": 1, "flush_timeout": 2},
            "platforms": {platform: section},
            **extra,
            "llm": llm_section,
        }
    )


@contextlib.asynccontextmanager
async def running_daemon(
    tmp_path: Path,
    llm: FakeLLM,
    platform: str,
    section: dict[str, Any],
    *,
    wait_ready: bool = True,
    port: int | None = None,
    extra: dict[str, Any] | None = None,
    cron_clock: Clock | None = None,
) -> AsyncIterator[Herald]:
    """The daemon, started; stopped (drained) on exit. Waits for `/ready` unless told not to."""
    port = free_port() if port is None else port
    config = herald_config(tmp_path, llm, platform, section, port=port, extra=extra)
    supervisor = Supervisor(config, environ={}, cron_clock=cron_clock)
    task = asyncio.create_task(supervisor.run(), name="herald")
    url = f"http://127.0.0.1:{config.api.port}"
    herald: Herald | None = None
    try:
        if wait_ready:
            await _until(_ready_or_failed(url, task), START_WAIT)
        else:
            await _until(lambda: supervisor.state.serving or task.done(), START_WAIT)
        async with Store.open(config.effective_database_url, migrate=False) as store:
            herald = Herald(supervisor, config, url, store, platform)
            yield herald
    finally:
        supervisor.stop()
        async with asyncio.timeout(WAIT):
            code = await task
        if herald is not None:
            herald.exit_code = code


async def _until(check: Callable[[], Any], timeout: float = WAIT) -> None:
    async with asyncio.timeout(timeout):
        while True:
            result = check()
            if asyncio.iscoroutine(result):
                result = await result
            if result:
                return
            await asyncio.sleep(0.02)


def _ready_or_failed(url: str, task: asyncio.Task[int]) -> Callable[[], Any]:
    async def check() -> bool:
        if task.done():
            task.result()
            raise RuntimeError("herald stopped while starting")
        with contextlib.suppress(httpx.TransportError):
            async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
                return (await client.get(f"{url}/ready")).status_code == 200
        return False

    return check
