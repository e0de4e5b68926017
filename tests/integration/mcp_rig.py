"""Herald's message path with MCP servers: real FastMCP servers (`tests/fakes/mcp_server.py`)
over stdio or streamable HTTP, the tool source and chat approvals, a scripted model, and a
recording platform `test` (account `acct`)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_core.agent import Agent, AgentSettings
from agent_core.mcp.config import MCPConfig
from agent_core.mcp.hub import MCPHub
from agent_core.mcp.server import MCPServer
from agent_core.mcp.status import ServerState
from agent_core.mcp.tools import MCPTools
from agent_core.memory import MemoryFiles
from agent_core.tools import SendMessageTool, ToolRegistry
from gateway.access import Access
from gateway.channels import Channels
from gateway.config import AccessConfig, DeliveryConfig, SessionsConfig
from gateway.contracts.config import PlatformSection
from gateway.contracts.history import Role
from gateway.contracts.messages import SendLimits
from gateway.delivery import DeliveryWorker
from gateway.metrics import Metrics
from gateway.redact import Redactor
from gateway.sessions import SessionManager
from gateway.store import Store
from gateway.store.outbox import Outbox
from gateway.tools.approvals import ChatApprovals
from gateway.tools.channels import OutboxChannels
from gateway.tools.people import StorePeople
from gateway.tools.places import Places
from tests.fakes.platform import RecordingAdapter
from tests.unit.agent.fakes import ScriptedProvider

REPO = Path(__file__).resolve().parents[2]
SERVER_SCRIPT = str(REPO / "tests" / "fakes" / "mcp_server.py")
WAIT = 15.0


def stdio_server(**settings: Any) -> dict[str, Any]:
    """The config of the fake server over stdio (`-P`: its folder shadows no stdlib module)."""
    return {"command": sys.executable, "args": ["-P", SERVER_SCRIPT], **settings}


@dataclass
class McpRig:
    """A running message path whose agent has the MCP servers' tools."""

    store: Store
    llm: ScriptedProvider
    adapter: RecordingAdapter
    manager: SessionManager
    hub: MCPHub

    def server(self, name: str = "t") -> MCPServer:
        """A configured server."""
        return self.hub.servers[name]

    async def wait_ready(self, name: str = "t") -> MCPServer:
        """Wait until the server is connected with its tools listed."""
        server = self.server(name)
        await until(lambda: server.state is ServerState.READY)
        return server

    def tool_results(self) -> list[str]:
        """The text of every tool result the model was sent, in order, once per call id
        (later turns see earlier results again in their history)."""
        seen: dict[str | None, str] = {}
        for call in self.llm.calls:
            for m in call.messages:
                if m.role is Role.TOOL:
                    seen.setdefault(m.tool_call_id, m.content)
        return list(seen.values())

    async def said(self, chat: str, part: str) -> str:
        """Wait until a message containing `part` was delivered to `chat`; its text."""
        found = await self.adapter.wait_for(
            lambda d: any(x.chat_id == chat and part in x.text for x in d), WAIT
        )
        return next(x.text for x in found if x.chat_id == chat and part in x.text)


async def until(check: Any, timeout: float = WAIT) -> None:
    """Poll a condition (sync or async) every 20 ms until it is truthy."""
    async with asyncio.timeout(timeout):
        while True:
            result = check()
            if asyncio.iscoroutine(result):
                result = await result
            if result:
                return
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def mcp_rig(
    store: Store,
    tmp_path: Path,
    llm: ScriptedProvider,
    servers: dict[str, dict[str, Any]],
    *,
    operators: tuple[str, ...] = (),
    approval_timeout: float = 600.0,
    allow_api: bool = False,
    homes: tuple[str, ...] = (),
    send_targets: tuple[str, ...] = ("home",),
    wait: bool = True,
    secrets: tuple[str, ...] = (),
    max_chunk: int | None = None,
) -> AsyncIterator[McpRig]:
    """The rig, with every server ready (unless `wait` is False); `secrets` are Herald's
    configured secrets, `max_chunk` what one message of the platform holds."""
    config = MCPConfig.model_validate(
        {"servers": servers, "approval_timeout": approval_timeout, "restart_initial": 0.05}
    )
    adapter = RecordingAdapter(
        limits=None if max_chunk is None else SendLimits(max_chunk=max_chunk, min_edit_interval=0)
    )
    section = PlatformSection(account="acct", allowed_users=("*",))
    platforms = {("test", "acct"): section}
    channels = Channels()
    channels.register("test", "acct", adapter.limits, lambda: adapter)
    metrics = Metrics()
    worker = DeliveryWorker(
        Outbox(store), channels, DeliveryConfig(backoff_initial=0.01, backoff_max=0.05), metrics
    )
    approvals = ChatApprovals(
        store,
        platforms,
        allow_api=allow_api,
        on_outbox=worker.wake,
        poll=0.2,
        redact=Redactor(secrets).secrets,
        limits=channels.limits,
    )
    places = Places(store, platforms, homes=homes, allowed=send_targets)

    async def no_snapshot(*_: object) -> tuple[str, str]:
        return "", ""

    async with MCPHub(config) as hub:
        tools = MCPTools(
            list(hub.servers.values()),
            StorePeople(store),
            approvals,
            approval_timeout=approval_timeout,
        )
        sender = OutboxChannels(store, places, channels, worker.wake)
        agent = Agent(
            llm,
            store,
            MemoryFiles(tmp_path),
            ToolRegistry([SendMessageTool(sender)], [tools]),
            AgentSettings(memory_pass=False),
        )
        manager = SessionManager(
            store,
            agent,
            SessionsConfig(debounce_seconds=0, ack_interval=0, drain_timeout=0.5),
            metrics,
            no_snapshot,
            channels=channels,
            access=Access(store, platforms, AccessConfig(operators=operators)),
            platforms=platforms,
            on_outbox=worker.wake,
            approvals=approvals,
        )
        async with asyncio.TaskGroup() as tg, manager:
            task = tg.create_task(worker.run())
            try:
                rig = McpRig(store, llm, adapter, manager, hub)
                if wait:
                    for name in hub.servers:
                        await rig.wait_ready(name)
                yield rig
            finally:
                task.cancel()
