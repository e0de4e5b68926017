"""The processes a benchmark runs: Herald itself, the fake LLM, fakes of platforms; databases."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from sqlalchemy import NullPool
from sqlalchemy.ext.asyncio import create_async_engine

from tests.fakes.telegram import TelegramServerClient

ROOT = Path(__file__).resolve().parent.parent
PYTHON = Path(sys.executable)
HERALD = PYTHON.with_name("herald")
API_KEY = "bench-key"
PG_ADMIN = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_http(url: str, timeout: float = 60.0, status: int = 200) -> float:
    """Poll `url` until it answers `status`; return the seconds it took."""
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=2.0) as client:
        async with asyncio.timeout(timeout):
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get(url)).status_code == status:
                        return time.monotonic() - started
                await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def process(
    *args: str, log: Path, ready_url: str | None = None
) -> AsyncIterator[asyncio.subprocess.Process]:
    """A child process (logging to `log`), SIGTERMed (then killed) on exit."""
    with log.open("ab") as out:
        proc = await asyncio.create_subprocess_exec(
            *args, stdout=out, stderr=out, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    try:
        if ready_url is not None:
            await wait_http(ready_url)
        yield proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(30):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()


@contextlib.asynccontextmanager
async def fake_llm(workdir: Path, latency: float = 0.0) -> AsyncIterator[str]:
    """The benchmark's fake LLM in its own process; yields its base URL (…/v1)."""
    port = free_port()
    async with process(
        str(PYTHON),
        "-m",
        "bench.fake_llm",
        "--port",
        str(port),
        "--latency",
        str(latency),
        log=workdir / "fake_llm.log",
        ready_url=f"http://127.0.0.1:{port}/v1/models",
    ):
        yield f"http://127.0.0.1:{port}/v1"


@contextlib.asynccontextmanager
async def floor_app(workdir: Path, llm_url: str) -> AsyncIterator[tuple[str, int]]:
    """`bench.floor_app` (the HTTP stack and model client alone) in its own process; yields
    its base URL and process id."""
    port = free_port()
    async with process(
        str(PYTHON),
        "-m",
        "bench.floor_app",
        "--port",
        str(port),
        "--llm",
        llm_url,
        log=workdir / "floor_app.log",
        ready_url=f"http://127.0.0.1:{port}/ready",
    ) as proc:
        yield f"http://127.0.0.1:{port}", proc.pid


CHAT_TOKEN = "bench-token"


@contextlib.asynccontextmanager
async def chat_server(workdir: Path) -> AsyncIterator[str]:
    """The loopback platform's fake chat server in its own process; yields its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with process(
        str(PYTHON),
        "-m",
        "tests.fakes.chat_server",
        "--port",
        str(port),
        "--token",
        CHAT_TOKEN,
        log=workdir / "chat_server.log",
        ready_url=f"{url}/bot{CHAT_TOKEN}/me",
    ):
        yield url


@contextlib.asynccontextmanager
async def database(backend: str, workdir: Path) -> AsyncIterator[str]:
    """An empty database of `backend` (sqlite or postgres), dropped afterwards."""
    if backend == "sqlite":
        workdir.mkdir(parents=True, exist_ok=True)
        yield f"sqlite+aiosqlite:///{workdir / 'herald.db'}"
        return
    name = f"herald_bench_{secrets.token_hex(4)}"
    await _admin(f'CREATE DATABASE "{name}" TEMPLATE template0')
    try:
        yield f"postgresql+asyncpg://postgres@127.0.0.1:5432/{name}"
    finally:
        await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def _admin(statement: str) -> None:
    engine = create_async_engine(PG_ADMIN, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            await conn.exec_driver_sql(statement)
    finally:
        await engine.dispose()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time process `pid` has used, all its threads together."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


@dataclass
class Herald:
    """One `herald run` process with a generated config."""

    state_dir: Path
    database_url: str
    settings: dict[str, Any] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        """The HTTP base URL."""
        return f"http://127.0.0.1:{self.port}"

    def write_config(self) -> Path:
        """The config file: benchmark defaults under the given settings."""
        config: dict[str, Any] = {
            "state_dir": str(self.state_dir),
            "database_url": self.database_url,
            "log_level": "WARNING",
            "api": {"host": "127.0.0.1", "port": self.port, "key": API_KEY},
            "sessions": {"max_concurrent_turns": 256},
        }
        for section, values in self.settings.items():
            if isinstance(values, dict):
                config.setdefault(section, {}).update(values)
            else:
                config[section] = values
        path = self.state_dir.parent / f"{self.state_dir.name}.yaml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        return path

    async def start(self) -> float:
        """Start and wait for `/ready`; return the seconds from exec to ready."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        config = self.write_config()
        log = self.state_dir.parent / f"{self.state_dir.name}.log"
        started = time.monotonic()
        with log.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                str(HERALD), "run", "--config", str(config), stdout=out, stderr=out, cwd=ROOT
            )
        async with httpx.AsyncClient(timeout=2.0) as client:
            async with asyncio.timeout(120):
                while True:
                    if self.proc.returncode is not None:
                        raise RuntimeError(f"herald exited on start; see {log}")
                    with contextlib.suppress(httpx.TransportError):
                        if (await client.get(f"{self.url}/ready")).status_code == 200:
                            return time.monotonic() - started
                    await asyncio.sleep(0.01)

    def rss_mb(self) -> float:
        """Resident memory of the process, in MiB."""
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def cpu_seconds(self) -> float:
        """User + system CPU time the process has used."""
        assert self.proc is not None
        return cpu_seconds(self.proc.pid)

    async def stop(self) -> tuple[float, int]:
        """SIGTERM; return (seconds to exit, exit code)."""
        assert self.proc is not None
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(120):
            code = await self.proc.wait()
        return time.monotonic() - started, code

    async def kill(self) -> None:
        """SIGKILL if still running."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


@contextlib.asynccontextmanager
async def herald(state_dir: Path, database_url: str, **settings: Any) -> AsyncIterator[Herald]:
    """A started Herald, stopped on exit."""
    daemon = Herald(state_dir, database_url, settings)
    await daemon.start()
    try:
        yield daemon
    finally:
        if daemon.proc is not None and daemon.proc.returncode is None:
            try:
                await daemon.stop()
            except TimeoutError:
                await daemon.kill()


@contextlib.asynccontextmanager
async def telegram_fake(work: Path, token: str) -> AsyncIterator[TelegramServerClient]:
    """The fake Bot API (`bench.telegram_fake`) in a process of its own, for bot `token`; its
    client."""
    port = free_port()
    async with (
        process(
            sys.executable,
            "-m",
            "bench.telegram_fake",
            "--port",
            str(port),
            "--token",
            token,
            log=work / "telegram.log",
            ready_url=f"http://127.0.0.1:{port}/bot{token}/getMe",
        ),
        TelegramServerClient(f"http://127.0.0.1:{port}") as client,
    ):
        yield client
