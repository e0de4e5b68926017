"""`herald run` with an MCP tool that needs approval: a SIGKILL while the question waits loses
nothing; after the restart the question is asked again and the yes runs the tool once."""

from __future__ import annotations

import contextlib
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.store import Store
from gateway.store import approvals as sql
from gateway.store.approvals import ApprovalStatus
from tests.e2e.daemon import Daemon
from tests.fakes.chat_server import FakeChatServer
from tests.fakes.llm import FakeLLM, Reply, last_user_text, you_said
from tests.integration.mcp_rig import SERVER_SCRIPT, until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

TOKEN = "mcp-token"


def responder(body: dict[str, Any]) -> Reply:
    """Asks for `t__pid` on "run pid"; answers with the tool's result once it has one."""
    results = [m for m in body.get("messages", []) if m.get("role") == "tool"]
    if results:
        return Reply(text=f"done: {results[-1]['content']}")
    if last_user_text(body) == "run pid":
        return Reply(tool_calls=[("t__pid", {})])
    return you_said(body)


async def mcp_health(daemon: Daemon) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
        body = (await client.get(f"{daemon.url}/health")).json()
        servers: dict[str, Any] = body["mcp"]
        return servers


async def test_a_pending_approval_survives_a_sigkill(tmp_path: Path) -> None:
    async with contextlib.AsyncExitStack() as stack:
        llm = await stack.enter_async_context(FakeLLM())
        llm.responder = responder
        chat = await stack.enter_async_context(FakeChatServer(TOKEN))
        (tmp_path / "state").mkdir()
        daemon = Daemon(
            tmp_path / "state",
            {
                "log_level": "INFO",
                "llm": {"base_url": llm.base_url, "api_key": "k", "memory_pass": False},
                "sessions": {"drain_timeout": 1},
                "platforms": {
                    "test": {
                        "url": chat.base_url,
                        "token": TOKEN,
                        "allowed_users": ["*"],
                        "stream_edits": False,
                        "poll_timeout": 1,
                    }
                },
                "mcp": {
                    "servers": {
                        "t": {
                            "command": sys.executable,
                            "args": ["-P", SERVER_SCRIPT],
                            "approval": "always",
                        },
                        # A server that cannot start: shown, never holding up /ready.
                        "broken": {"command": str(tmp_path / "no-such-mcp-server")},
                    }
                },
            },
        )
        try:
            await daemon.start()

            async def ready() -> bool:
                return bool((await mcp_health(daemon))["t"]["state"] == "ready")

            await until(ready, 30)
            assert (await mcp_health(daemon))["t"]["tools"] >= 5
            async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
                readiness = await client.get(f"{daemon.url}/ready")
            assert readiness.status_code == 200, readiness.text
            assert readiness.json()["mcp"]["t"]["state"] == "ready"
            assert readiness.json()["mcp"]["broken"]["state"] != "ready"
            chat.inject("u1", "run pid", sender_id="u1")
            await chat.wait_for_sent(lambda s: "Approval needed" in chat.text_of(s.message_id), 30)
            daemon.signal(signal.SIGKILL)
            await daemon.wait()

            await daemon.start()
            await chat.wait_for_sent(
                lambda s: "asked again after a restart" in chat.text_of(s.message_id), 60
            )
            chat.inject("u1", "/approve", sender_id="u1")
            [done] = await chat.wait_for_sent(
                lambda s: chat.text_of(s.message_id).startswith("done:"), 30
            )
            assert "[approved by test:u1]" in chat.text_of(done.message_id)
            async with (
                Store.open(daemon.database_url, migrate=False) as store,
                store.read() as conn,
            ):
                row = await sql.get_approval(conn, 1)
                assert await sql.get_approval(conn, 2) is None
            assert row is not None
            assert (row.status, row.asked, row.decided_by) == (
                ApprovalStatus.USED,
                2,
                "test:u1",
            )
            assert row.turn_id is not None
            assert await daemon.stop() == 0
        except BaseException:
            print(daemon.output()[-6000:])
            raise
        finally:
            if daemon.process is not None and daemon.process.returncode is None:
                daemon.process.kill()
                await daemon.process.wait()
