"""`herald doctor` starts each MCP server once and lists its tools."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.integration.mcp_rig import SERVER_SCRIPT
from tests.unit.doctor_harness import run_doctor

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

TOOLS = Path(SERVER_SCRIPT).read_text(encoding="utf-8").count("@server.tool(")
"""The fake MCP server's tools, as its script declares them."""


async def test_doctor_shows_each_server_state_and_tool_count(tmp_path: Path) -> None:
    mcp = {
        "servers": {
            "good": {"command": sys.executable, "args": ["-P", SERVER_SCRIPT]},
            "broken": {"command": str(tmp_path / "no-such-server")},
            "off": {"command": "whatever", "enabled": False},
        }
    }
    doctor = await run_doctor(tmp_path, {}, {"mcp": mcp})
    verdicts = doctor.verdicts
    assert verdicts["mcp.good"] == ("OK", f"stdio, {TOOLS} tools"), doctor.stdout
    verdict, detail = verdicts["mcp.broken"]
    assert verdict == "FAIL"
    assert detail.startswith("stdio, not ready: ")
    assert "mcp.off" not in verdicts
    assert doctor.returncode == 1
