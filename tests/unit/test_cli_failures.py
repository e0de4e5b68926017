"""Every CLI failure is one line on stderr that names the problem and the fix, with exit 2 for
configuration and environment errors (systemd's RestartPreventExitStatus=2) and no traceback
unless `--debug`. Read-only commands never create a database; a database newer than the code
is named as such. The CLI runs as a real subprocess (real exit codes, real stderr)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import stat
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from sqlalchemy import text

from gateway.store import Store
from tests.conftest import PgServer
from tests.e2e.daemon import HERALD, free_port
from tests.services import require_service

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

RUN_TIMEOUT = 60.0
FUTURE_REVISION = "9999_from_the_future"


@dataclass(frozen=True, slots=True)
class Ran:
    """What one `herald` process printed and returned."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def error_lines(self) -> list[str]:
        """The `error: ...` lines on stderr."""
        return [line for line in self.stderr.splitlines() if line.startswith("error:")]


async def herald(
    tmp_path: Path,
    *args: str,
    settings: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    stdin: bytes = b"",
) -> Ran:
    """Run `herald <args> --config <file>` (no --config when `settings` is None)."""
    argv = [str(HERALD), *args]
    if settings is not None:
        config = tmp_path / "herald.yaml"
        config.write_text(yaml.safe_dump(settings), encoding="utf-8")
        argv += ["--config", str(config)]
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "COLUMNS": "250", **(env or {})},
    )
    try:
        async with asyncio.timeout(RUN_TIMEOUT):
            stdout, stderr = await process.communicate(stdin)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return Ran(process.returncode, stdout.decode(), stderr.decode())


def assert_one_line(ran: Ran, code: int, *needles: str) -> str:
    """The run failed with `code` and one error line holding each needle, no traceback."""
    output = ran.stdout + ran.stderr
    assert ran.returncode == code, output
    assert "Traceback" not in output, output
    assert "ExceptionGroup" not in output, output
    (line,) = ran.error_lines
    for needle in needles:
        assert needle in line, line
    return line


def settings(state_dir: Path, **more: Any) -> dict[str, Any]:
    return {"state_dir": str(state_dir), "api": {"port": free_port()}, **more}


COMMANDS = [("run",), ("sessions", "list"), ("jobs", "list"), ("db", "upgrade")]


# an unusable state directory ---------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
async def test_a_state_dir_under_a_file_is_one_line_and_exit_2(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    state_dir = tmp_path / "a-file" / "state"

    ran = await herald(tmp_path, *command, settings=settings(state_dir))

    assert_one_line(ran, 2, str(state_dir))


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
async def test_a_database_that_cannot_be_opened_is_one_line_and_exit_2(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    # What an unwritable state directory does to SQLite, reproducible as root too.
    state_dir = tmp_path / "state"
    (state_dir / "herald.db").mkdir(parents=True)

    ran = await herald(tmp_path, *command, settings=settings(state_dir))

    assert_one_line(
        ran, 2, f"cannot open the SQLite database {state_dir / 'herald.db'}", "state_dir"
    )


@contextlib.contextmanager
def read_only_directory(path: Path) -> Iterator[Path]:
    """A directory nobody may write to: mode 0500, or (as root, who writes there anyway) a
    read-only tmpfs mounted on it."""
    path.mkdir(mode=0o500)
    if os.geteuid() != 0:
        try:
            yield path
        finally:
            path.chmod(0o700)
        return
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        require_service("a read-only tmpfs (mount -t tmpfs, as root)", mounted.stderr.strip())
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


async def test_a_read_only_state_dir_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with read_only_directory(tmp_path / "state") as state_dir:
        ran = await herald(tmp_path, "sessions", "list", settings=settings(state_dir))

    assert_one_line(ran, 2, str(state_dir))


async def test_run_on_postgresql_with_a_read_only_state_dir_is_one_line_and_exit_2(
    tmp_path: Path, pg_server: PgServer
) -> None:
    # On SQLite the database cannot open; on PostgreSQL the state directory is only a cache,
    # and a container's root-owned mount left Herald "ready" with files, skills and the
    # workspace failing later, one by one.
    database = pg_server.create_database()
    try:
        with read_only_directory(tmp_path / "state") as state_dir:
            config = settings(state_dir, database_url=pg_server.url(database))
            ran = await herald(tmp_path, "run", settings=config)
    finally:
        pg_server.drop_database(database)

    assert_one_line(ran, 2, f"the state directory {state_dir} is not writable", "HERALD_HOME")


async def test_debug_adds_the_traceback(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    (state_dir / "herald.db").mkdir(parents=True)

    ran = await herald(tmp_path, "--debug", "sessions", "list", settings=settings(state_dir))

    assert ran.returncode == 2, ran.stderr
    assert "Traceback (most recent call last)" in ran.stderr
    assert ran.stderr.rstrip().splitlines()[-1].startswith("error: cannot open the SQLite")


async def test_a_database_server_that_does_not_answer_is_one_line_and_exit_1(
    tmp_path: Path,
) -> None:
    # It may be starting: exit 1 lets systemd try again (2 would stop it for good).
    url = f"postgresql+asyncpg://herald:db-secret-pw@127.0.0.1:{free_port()}/herald"
    config = settings(tmp_path / "state", database_url=url)

    ran = await herald(tmp_path, "sessions", "list", settings=config)

    line = assert_one_line(ran, 1, "does not answer", "database_url")
    assert "db-secret-pw" not in ran.stderr
    assert "herald:***@127.0.0.1" in line


# a port in use -----------------------------------------------------------------------------------


async def test_a_port_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = settings(tmp_path / "state", api={"port": port})

        ran = await herald(tmp_path, "run", settings=config)

    assert_one_line(ran, 2, f"cannot listen on 127.0.0.1:{port}", "api.port")


# a database newer than the code ------------------------------------------------------------------


async def stamp_future_revision(state_dir: Path) -> None:
    """A database migrated by a (pretend) newer Herald."""
    url = f"sqlite+aiosqlite:///{state_dir / 'herald.db'}"
    async with Store.open(url) as store, store.engine.begin() as conn:
        await conn.execute(
            text("UPDATE alembic_version SET version_num = :v"), {"v": FUTURE_REVISION}
        )


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
async def test_a_database_newer_than_the_code_is_one_line_and_exit_2(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    await stamp_future_revision(tmp_path / "state")

    ran = await herald(tmp_path, *command, settings=settings(tmp_path / "state"))

    assert_one_line(
        ran,
        2,
        f"was upgraded by a newer Herald (revision {FUTURE_REVISION};",
        "upgrade Herald or restore a backup",
    )


async def test_doctor_names_a_database_newer_than_the_code(tmp_path: Path) -> None:
    await stamp_future_revision(tmp_path / "state")

    ran = await herald(tmp_path, "doctor", settings=settings(tmp_path / "state"))

    assert ran.returncode == 1, ran.stdout + ran.stderr
    (line,) = [line for line in ran.stdout.splitlines() if "database:" in line]
    assert line.startswith("FAIL database: upgraded by a newer Herald")
    assert FUTURE_REVISION in line


# read-only commands never create a database ------------------------------------------------------


READ_ONLY = [
    ("sessions", "list"),
    ("sessions", "show", "api:default:x"),
    ("sessions", "search", "hello"),
    ("deliveries", "list"),
    ("pairing", "list"),
    ("instances",),
    ("jobs", "list"),
    ("jobs", "runs", "job-1"),
]


@pytest.mark.parametrize("command", READ_ONLY, ids=" ".join)
async def test_a_read_only_command_never_creates_a_database(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    home = tmp_path / "no-such-home"

    ran = await herald(tmp_path, *command, env={"HERALD_HOME": str(home)})

    assert_one_line(ran, 2, f"no Herald database at {home / 'herald.db'}", "HERALD_HOME")
    assert not home.exists()


async def test_doctor_creates_no_database(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"

    ran = await herald(tmp_path, "doctor", settings=settings(state_dir))

    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"WARN database: none yet at {state_dir / 'herald.db'}" in ran.stdout
    assert not (state_dir / "herald.db").exists()


async def test_db_upgrade_creates_a_private_state_directory(tmp_path: Path) -> None:
    home = tmp_path / "home" / "herald"

    ran = await herald(tmp_path, "db", "upgrade", env={"HERALD_HOME": str(home)})

    assert ran.returncode == 0, ran.stderr
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert (home / "herald.db").is_file()


# herald chat -------------------------------------------------------------------------------------


@pytest.fixture
async def failing_api() -> AsyncIterator[str]:
    """An OpenAI-compatible endpoint whose every streamed reply breaks off with an error event
    after its first words; yields its base URL."""

    async def completions(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = {
            "id": "c1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "herald",
            "choices": [{"index": 0, "delta": {"content": "Once upon"}, "finish_reason": None}],
        }
        error = {"error": {"message": "the turn was interrupted", "type": "server_error"}}
        await response.write(f"data: {_json(chunk)}\n\n".encode())
        await response.write(f"data: {_json(error)}\n\n".encode())
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


def _json(value: Any) -> str:
    return json.dumps(value)


async def test_chat_shows_a_failed_turn_as_one_line(tmp_path: Path, failing_api: str) -> None:
    ran = await herald(
        tmp_path,
        "chat",
        "--url",
        failing_api,
        "-m",
        "tell me a story",
        settings=settings(tmp_path / "state"),
    )

    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "Traceback" not in ran.stdout + ran.stderr
    assert "Once upon" in ran.stdout
    assert "the turn was interrupted" in ran.stdout
    assert "the turn failed: the turn" not in ran.stdout  # said once, not twice


async def test_chat_goes_on_after_a_failed_turn(tmp_path: Path, failing_api: str) -> None:
    ran = await herald(
        tmp_path,
        "chat",
        "--url",
        failing_api,
        settings=settings(tmp_path / "state"),
        stdin=b"first\nsecond\n",
    )

    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "Traceback" not in ran.stdout + ran.stderr
    assert ran.stdout.count("the turn was interrupted") == 2
