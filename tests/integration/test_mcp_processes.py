"""No MCP server process outlives Herald: not after a clean stop, not after a SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

HOST = str(Path(__file__).resolve().parents[2] / "tests" / "fakes" / "mcp_host.py")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _gone(pids: list[int], timeout: float = 15.0) -> list[int]:
    """The pids still alive after waiting up to `timeout` for them to end."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _start() -> tuple[subprocess.Popen[str], dict[str, int]]:
    host = subprocess.Popen(
        [sys.executable, "-P", HOST], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert host.stdout is not None
    line = host.stdout.readline()
    if not line:
        host.kill()
        raise RuntimeError("the host did not start its server")
    return host, json.loads(line)


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_servers_and_what_they_started_end_with_herald(how: signal.Signals) -> None:
    host, pids = _start()
    try:
        assert all(_alive(p) for p in pids.values())
        os.kill(host.pid, how)
        host.wait(15)
        left = _gone(list(pids.values()))
    finally:
        for pid in [host.pid, *pids.values()]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        host.wait(15)
        assert host.stdout is not None
        host.stdout.close()
    assert left == [], f"left running after {how.name}: {left} of {pids}"
