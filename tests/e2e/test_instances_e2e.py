"""Instances as an operator sees them: `herald instances`, `/health`, and a second instance
on one SQLite database refused with a clear message."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tests.e2e.daemon import HERALD, Daemon, running

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


async def _cli(daemon: Daemon, *args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        str(HERALD),
        *args,
        "--config",
        str(daemon.config_path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={"PATH": "/usr/bin:/bin", "HOME": str(daemon.state_dir.parent), "COLUMNS": "200"},
    )
    out, _ = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode()


async def test_instances_lists_the_running_one_and_sqlite_refuses_a_second(
    tmp_path: Path,
) -> None:
    async with running(tmp_path / "state", instance_id="herald-a") as daemon:
        async with httpx.AsyncClient(timeout=5) as client:
            health = (await client.get(f"{daemon.url}/health")).json()
        assert health["instance"] == "herald-a"
        assert health["cluster"]["mode"] == "single"
        assert "cron" in health["cluster"]["holds"]

        code, out = await _cli(daemon, "instances")
        assert code == 0, out
        assert "herald-a" in out
        assert "alive" in out

        # A second process on the same SQLite file (another port, another id).
        second = Daemon(daemon.state_dir, {"instance_id": "herald-b"})
        second.write_config()
        process = await asyncio.create_subprocess_exec(
            str(HERALD),
            "run",
            "--config",
            str(second.config_path),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        )
        async with asyncio.timeout(60):
            out_b, _ = await process.communicate()
        assert process.returncode == 2
        assert "SQLite serves one instance" in out_b.decode()
        async with httpx.AsyncClient(timeout=5) as client:
            assert (await client.get(f"{daemon.url}/ready")).status_code == 200

    daemon.write_config()
    code, out = await _cli(daemon, "instances")
    assert code == 0, out
    assert "stopped" in out
