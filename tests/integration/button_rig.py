"""What the approval-button tests of every platform share: an MCP server whose every tool needs
approval, a model that calls `t__pid` on "run pid", and counting how often the tool ran."""

from __future__ import annotations

import sys
from typing import Any

import httpx

from tests.fakes.llm import FakeLLM, Reply, last_user_text, you_said
from tests.integration.mcp_rig import SERVER_SCRIPT, until

MCP: dict[str, Any] = {
    "servers": {
        "t": {"command": sys.executable, "args": ["-P", SERVER_SCRIPT], "approval": "always"}
    }
}
"""The `mcp` config section: server `t`, every call approved first."""
APPROVE_LABEL = "✅ Approve"
DENY_LABEL = "❌ Deny"


def responder(body: dict[str, Any]) -> Reply:
    """Asks for `t__pid` on "run pid"; answers with the tool's result once it has one."""
    results = [m for m in body.get("messages", []) if m.get("role") == "tool"]
    if results:
        return Reply(text=f"done: {results[-1]['content']}")
    if last_user_text(body).endswith("run pid"):
        return Reply(tool_calls=[("t__pid", {})])
    return you_said(body)


def tool_runs(llm: FakeLLM) -> int:
    """How many distinct tool results the model was ever sent (one per call that ran)."""
    ids = {
        m.get("tool_call_id")
        for request in llm.requests
        for m in request.get("messages", [])
        if m.get("role") == "tool"
    }
    return len(ids)


async def mcp_ready(url: str) -> None:
    """Wait until `/health` reports server `t` ready."""

    async def ready() -> bool:
        async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
            health = (await client.get(f"{url}/health")).json()
        return bool(health["mcp"]["t"]["state"] == "ready")

    await until(ready, 30)
