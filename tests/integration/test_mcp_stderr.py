"""What a local MCP server writes on stderr reaches Herald's log line by line under the
server's name, without secrets (its own `env` values and Herald's configured ones), control
characters made visible and long lines cut; never raw on Herald's own stderr."""

from __future__ import annotations

import asyncio
import logging

import pytest

from agent_core.mcp.config import MCPConfig
from agent_core.mcp.hub import MCPHub
from agent_core.mcp.server import STDERR_LINE
from gateway.redact import Redactor
from tests.integration.mcp_rig import stdio_server, until

pytestmark = pytest.mark.timeout(60)

TOKEN = "tok-9f8e7d6c5b4a3210"
"""The server's own `env` value."""
LLM_KEY = "configured-llm-key-0123456789"
"""A secret of Herald's configuration."""


def stderr_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "agent_core.mcp.server" and "(stderr)" in r.getMessage()
    ]


async def test_a_servers_stderr_is_logged_by_line_named_and_redacted(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.INFO, logger="agent_core.mcp.server")
    config = MCPConfig.model_validate(
        {"servers": {"files": stdio_server(env={"FAKE_MCP_TOKEN": TOKEN})}}
    )
    async with MCPHub(config, redact=Redactor([LLM_KEY])) as hub:
        server = hub.servers["files"]
        await until(lambda: server.tools)
        long = "y" * (STDERR_LINE * 3)
        said = f"the key is {LLM_KEY}\x1b[2J\nsecond line\n{long}\nafter the long one"
        assert await server.call("stderr", {"text": said}) == "written"
        await until(lambda: any("after the long one" in x for x in stderr_lines(caplog)))
    lines = stderr_lines(caplog)
    assert "MCP server files (stderr): starting with token ***" in lines
    assert "MCP server files (stderr): the key is ***\\x1b[2J" in lines
    assert "MCP server files (stderr): second line" in lines
    [cut] = [x for x in lines if "yyy" in x]
    assert len(cut) < STDERR_LINE + 100
    assert "cut" in cut
    logged = "\n".join(r.getMessage() for r in caplog.records)
    raw = capfd.readouterr().err
    for secret in (TOKEN, LLM_KEY):
        assert secret not in logged
        assert secret not in raw
    assert "second line" not in raw, "the server's stderr went raw to Herald's stderr"


async def test_a_server_that_dies_at_start_says_why_in_its_state(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="agent_core.mcp.server")
    script = f"import sys; print('bad token {TOKEN}: refused', file=sys.stderr); sys.exit(3)"
    config = MCPConfig.model_validate(
        {
            "servers": {
                "gone": {
                    "command": "python3",
                    "args": ["-c", script],
                    "env": {"FAKE_MCP_TOKEN": TOKEN},
                }
            },
            "restart_initial": 30,
        }
    )
    async with MCPHub(config) as hub:
        server = hub.servers["gone"]
        async with asyncio.timeout(30):
            await server.tried.wait()
        error = server.status().error or ""
    assert "bad token ***: refused" in error
    assert TOKEN not in error
