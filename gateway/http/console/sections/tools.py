"""Tools: the agent's built-in tools, each MCP server (its state, transport, tools, who gets
them and which calls wait for a person's yes), and the recent tool approvals. Read-only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from agent_core.mcp.config import MCPConfig, MCPServerConfig
from agent_core.mcp.status import ServerStatus, exposed_name
from gateway.http.console.page import ConsoleDep, Who
from gateway.http.console.section import Section
from gateway.store import approvals as approvals_sql

router = APIRouter(prefix="/tools")
SECTION = Section("tools", "Tools", router)
RECENT_APPROVALS = 50

if TYPE_CHECKING:
    from agent_core.mcp.server import MCPServer  # the SDK is imported only with a server


@dataclass(frozen=True, slots=True)
class ServerTool:
    """One tool of a server: the name the model knows, the server's name, and whether a
    call waits for approval."""

    name: str
    original: str
    description: str
    approval: bool


@dataclass(frozen=True, slots=True)
class ServerView:
    """One configured MCP server as the page shows it."""

    name: str
    config: MCPServerConfig
    transport: str
    status: ServerStatus | None
    """None: not running (disabled)."""
    tools: tuple[ServerTool, ...]
    approval_timeout: float


def server_views(config: MCPConfig, running: dict[str, MCPServer]) -> list[ServerView]:
    """Every configured server, running or disabled, with what it offers now."""
    out: list[ServerView] = []
    for name, server_config in config.servers.items():
        server = running.get(name)
        tools: tuple[ServerTool, ...] = ()
        if server is not None:
            tools = tuple(
                ServerTool(
                    exposed_name(server.prefix, t.name),
                    t.name,
                    t.description or "",
                    server_config.needs_approval(t.name),
                )
                for t in server.tools
            )
        out.append(
            ServerView(
                name,
                server_config,
                "stdio" if server_config.local else "http",
                None if server is None else server.status(),
                tools,
                server_config.approval_timeout or config.approval_timeout,
            )
        )
    return out


@router.get("", response_class=HTMLResponse)
async def tools_page(request: Request, console: ConsoleDep, who: Who) -> Response:
    """Built-in tools, MCP servers and recent approvals."""
    deps = console.deps
    built_in = [
        (spec["function"]["name"], spec["function"]["description"])
        for spec in deps.manager.agent.tools.specs()
    ]
    async with deps.store.read() as conn:
        approvals = await approvals_sql.recent_approvals(conn, RECENT_APPROVALS)
    return console.render(
        request,
        "tools.html",
        current=SECTION.slug,
        title="Tools",
        built_in=built_in,
        send_targets=deps.config.tools.send_message.targets,
        servers=server_views(deps.config.mcp, dict(deps.mcp_servers)),
        approvals=approvals,
    )
