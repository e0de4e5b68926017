"""A private PostgreSQL server in a temporary directory, on its own port, for tests that stop
and restart the server (the machine's shared server is never touched).

Needs the server binaries (`/usr/lib/postgresql/<version>/bin`, package postgresql); as root,
the server runs as the `postgres` user (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Self

from tests.e2e.daemon import free_port
from tests.services import require_service

SERVICE = "PostgreSQL server binaries (postgresql)"


def binaries() -> Path:
    """The directory of initdb and pg_ctl; skips the test (fails it in CI) without them."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if not found:
        require_service(SERVICE, "no /usr/lib/postgresql/*/bin/pg_ctl (apt-get install postgresql)")
    return found[-1].parent


class PrivatePostgres:
    """`async with PrivatePostgres() as pg:` a running server; `pg.url`, `stop`, `start`."""

    def __init__(self) -> None:
        self.bin = binaries()
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="herald-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.user: str | None = None

    @property
    def url(self) -> str:
        """The asyncpg URL of the `postgres` database."""
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    async def _run(self, *args: str) -> None:
        command = [str(self.bin / args[0]), *args[1:]]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        process = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await process.communicate()
        if process.returncode != 0:
            log = self.log.read_text(errors="replace") if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(args)} failed:\n{out.decode(errors='replace')}\n{log}")

    async def __aenter__(self) -> Self:
        if os.geteuid() == 0:
            self.user = "postgres"
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        await self._run(
            "initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8"
        )
        await self.start()
        return self

    async def start(self) -> None:
        """Start the server; returns once it accepts connections."""
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        await self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start"
        )

    async def stop(self, mode: str = "immediate") -> None:
        """Stop the server (`immediate`: like a crash, every connection dropped at once)."""
        await self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with contextlib.suppress(RuntimeError):
            await self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
