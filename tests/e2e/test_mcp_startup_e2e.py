"""`herald run` with MCP servers configured: a port in use ends the start at once with one
clear line (no tool server started), and a stop signal ends the process while a tool server
is still starting."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.daemon import HERALD, Daemon
from tests.integration.mcp_rig import SERVER_SCRIPT, until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

STUCK = "import time; time.sleep(3600)"
"""A local MCP server that never answers `initialize`."""
EXIT_WAIT = 60.0
"""Seconds a stopping or failing `herald run` may take (a loaded 2-core machine imports
slowly); today's hang never ends."""


def mcp_settings(**servers: dict[str, Any]) -> dict[str, Any]:
    """Settings with the given MCP servers and the offline model."""
    return {"log_level": "INFO", "llm": {"provider": "echo"}, "mcp": {"servers": servers}}


async def test_a_port_in_use_ends_the_start_before_any_tool_server(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        (tmp_path / "state").mkdir()
        marker = tmp_path / "started"
        server = {
            "command": sys.executable,
            "args": ["-c", f"open({str(marker)!r}, 'w').close(); import time; time.sleep(3600)"],
        }
        daemon = Daemon(tmp_path / "state", mcp_settings(t=server), port=port)
        daemon.write_config()
        log = tmp_path / "herald.log"
        with log.open("wb") as out:
            process = await asyncio.create_subprocess_exec(
                str(HERALD),
                "run",
                "--config",
                str(daemon.config_path),
                stdout=out,
                stderr=out,
                env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
            )
        try:
            async with asyncio.timeout(EXIT_WAIT):
                code = await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    output = log.read_text(encoding="utf-8", errors="replace")
    assert code == 2, output
    [line] = [x for x in output.splitlines() if x.startswith("error:")]
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in line
    assert "Traceback" not in output
    assert not marker.exists(), "the MCP server was started before the port was taken"


async def test_sigterm_ends_herald_while_a_tool_server_starts(tmp_path: Path) -> None:
    servers = {
        "stuck": {"command": sys.executable, "args": ["-c", STUCK]},
        "t": {"command": sys.executable, "args": ["-P", SERVER_SCRIPT]},
    }
    (tmp_path / "state").mkdir()
    daemon = Daemon(tmp_path / "state", mcp_settings(**servers))
    try:
        await daemon.start()

        async def states() -> dict[str, str]:
            async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
                body = (await client.get(f"{daemon.url}/health")).json()
            return {name: s["state"] for name, s in body["mcp"].items()}

        async def t_ready() -> bool:
            return (await states())["t"] == "ready"

        await until(t_ready, 30)
        assert (await states())["stuck"] == "starting"
        daemon.signal(signal.SIGTERM)
        async with asyncio.timeout(EXIT_WAIT):
            assert await daemon.wait() == 0
        assert "stopped" in daemon.output()
    except BaseException:
        print(daemon.output()[-6000:])
        raise
    finally:
        if daemon.process is not None and daemon.process.returncode is None:
            daemon.process.kill()
            await daemon.process.wait()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
async def test_a_stop_signal_ends_herald_while_it_starts(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """Ctrl-C or SIGTERM while the start waits on something that does not answer (here a
    database server that accepts and stays silent) ends the process at once."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    silent.setblocking(False)
    port = int(silent.getsockname()[1])
    (tmp_path / "state").mkdir()
    settings = mcp_settings(t={"command": sys.executable, "args": ["-c", STUCK]})
    settings["database_url"] = f"postgresql+asyncpg://herald:pw@127.0.0.1:{port}/herald"
    daemon = Daemon(tmp_path / "state", settings)
    daemon.write_config()
    log = tmp_path / "herald.log"
    loop = asyncio.get_running_loop()
    with silent, log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            str(HERALD),
            "run",
            "--config",
            str(daemon.config_path),
            stdout=out,
            stderr=out,
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        )
        try:
            async with asyncio.timeout(EXIT_WAIT):
                conn, _ = await loop.sock_accept(silent)  # Herald is opening its store
            with conn:
                process.send_signal(sig)
                async with asyncio.timeout(EXIT_WAIT / 3):
                    code = await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    output = log.read_text(encoding="utf-8", errors="replace")
    assert code == 0, output
    assert "stopped before Herald was ready" in output
