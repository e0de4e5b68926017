"""Running `herald run` as a subprocess for end-to-end tests."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

HERALD = Path(sys.executable).with_name("herald")
START_TIMEOUT = 60.0
"""A loaded 2-core machine may take this long to import and migrate; a start that fails ends
the wait at once (the process exits)."""
STOP_TIMEOUT = 30.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Daemon:
    """One `herald run` process with its own config and state directory."""

    state_dir: Path
    settings: dict[str, Any] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    process: asyncio.subprocess.Process | None = None
    log: Path | None = None
    start_timeout: float = START_TIMEOUT
    """Seconds `start` waits for `/ready`."""
    _started: bool = field(default=False, init=False, repr=False)
    """Whether it has been ready once (its port is then its own)."""

    @property
    def url(self) -> str:
        """The HTTP base URL."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def config_path(self) -> Path:
        """Where the config file is written."""
        return self.state_dir.parent / f"{self.state_dir.name}.yaml"

    @property
    def database_url(self) -> str:
        """The daemon's SQLite database."""
        return f"sqlite+aiosqlite:///{self.state_dir / 'herald.db'}"

    def write_config(self) -> None:
        """Write the YAML config: the given settings over test defaults."""
        config: dict[str, Any] = {
            "state_dir": str(self.state_dir),
            "log_level": "DEBUG",
            "api": {"host": "127.0.0.1", "port": self.port},
        }
        for section, values in self.settings.items():
            if isinstance(values, dict):
                config.setdefault(section, {}).update(values)
            else:
                config[section] = values
        self.config_path.write_text(yaml.safe_dump(config), encoding="utf-8")

    async def start(self) -> None:
        """Start the process and wait until `/ready` answers 200.

        On its first start, a port another process took since `free_port` chose it (tests run
        in parallel) is swapped for a new one, up to three times.
        """
        for _ in range(3):
            seen = len(self.output())
            try:
                await self._start()
                return
            except RuntimeError:
                if self._started or "Address already in use" not in self.output()[seen:]:
                    raise
            self.port = free_port()
        await self._start()

    def _listening(self, seen: int) -> bool:
        """Whether this start logged that its HTTP API listens on its port (always True
        when its log level hides that line)."""
        if str(self.settings.get("log_level", "DEBUG")).upper() not in ("DEBUG", "INFO"):
            return True
        found = re.search(rf"listening on http://\S+:{self.port}\b", self.output()[seen:])
        return found is not None

    async def _start(self) -> None:
        seen = len(self.output())
        self.write_config()
        self.log = self.state_dir.parent / f"{self.state_dir.name}.log"
        with self.log.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                str(HERALD),
                "run",
                "--config",
                str(self.config_path),
                stdout=log,
                stderr=log,
                env={"PATH": "/usr/bin:/bin", "HOME": str(self.state_dir.parent)},
            )
        try:
            async with httpx.AsyncClient(timeout=2.0) as client:
                async with asyncio.timeout(self.start_timeout):
                    while True:
                        if self.process.returncode is not None:
                            raise RuntimeError(f"herald exited on start:\n{self.output()}")
                        with contextlib.suppress(httpx.TransportError):
                            ready = await client.get(f"{self.url}/ready")
                            # Its own answer, not another test's daemon that took the port
                            # `free_port` chose a moment ago: this one said it listens there.
                            if ready.status_code == 200 and self._listening(seen):
                                self._started = True
                                return
                        await asyncio.sleep(0.05)
        except BaseException:
            if self.process.returncode is None:  # never ready: it must not outlive the test
                self.process.kill()
                await asyncio.shield(self.process.wait())
            raise

    def signal(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Send a signal to the process."""
        assert self.process is not None
        self.process.send_signal(sig)

    async def wait(self) -> int:
        """Wait for the process to exit; return its exit code."""
        assert self.process is not None
        async with asyncio.timeout(STOP_TIMEOUT):
            return await self.process.wait()

    async def stop(self) -> int:
        """SIGTERM and wait; return the exit code."""
        assert self.process is not None
        if self.process.returncode is None:
            self.signal(signal.SIGTERM)
        return await self.wait()

    def output(self) -> str:
        """What the process logged so far."""
        return self.log.read_text(encoding="utf-8", errors="replace") if self.log else ""


@contextlib.asynccontextmanager
async def running(state_dir: Path, **settings: Any) -> AsyncIterator[Daemon]:
    """A started daemon, stopped (SIGTERM, then SIGKILL if stuck) on exit."""
    daemon = Daemon(state_dir, settings)
    await daemon.start()
    try:
        yield daemon
    finally:
        if daemon.process is not None and daemon.process.returncode is None:
            daemon.signal(signal.SIGTERM)
            try:
                await daemon.wait()
            except TimeoutError:
                daemon.process.kill()
                await daemon.process.wait()
