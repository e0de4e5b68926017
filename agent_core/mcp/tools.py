"""MCP servers' tools as agent tools: offered per turn to the people allowed, approved when
the config asks for it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from agent_core.mcp.config import MCPServerConfig
from agent_core.mcp.status import ServerState, exposed_name
from agent_core.tools.approval import ApprovalRequest, Approvals, Verdict, arguments_digest
from agent_core.tools.base import Tool, ToolContext, ToolError
from gateway.contracts.ids import Origin

if TYPE_CHECKING:
    from mcp import types

    from agent_core.mcp.server import MCPServer


class People(Protocol):
    """Who is acting in a tool context, as the allowlists name people."""

    async def identities(self, ctx: ToolContext) -> frozenset[str]:
        """`platform:id` of the person acting: the sender of the message being answered and
        every identity linked to the session's user (a job's owner for scheduled runs)."""
        ...


def may_use(config: MCPServerConfig, ctx: ToolContext, identities: frozenset[str]) -> bool:
    """Whether a server's `platforms` and `users` allowlists let the person of `ctx` in.

    A scheduled run (platform `cron`) has its owner's rights: the platforms of the owner's
    identities count. A turn with other people's words in it (`ctx.others`) gets the tools
    only when each of them is listed in `users` too.
    """
    if config.platforms:
        platform = None if ctx.session is None else ctx.session.platform
        if platform == str(Origin.CRON):
            places = {i.partition(":")[0] for i in identities}
        else:
            places = {platform} if platform else set()
        if not places.intersection(config.platforms):
            return False
    if not config.users:
        return True
    return bool(identities.intersection(config.users)) and ctx.others <= set(config.users)


class MCPTool:
    """One tool of an MCP server, under the name the model knows it by."""

    def __init__(
        self,
        server: MCPServer,
        tool: types.Tool,
        approvals: Approvals | None,
        approval_timeout: float,
    ) -> None:
        self.server = server
        self.tool = tool
        self.approvals = approvals
        self.approval_timeout = server.config.approval_timeout or approval_timeout
        self.name = exposed_name(server.prefix, tool.name)
        description = tool.description or tool.title or tool.name
        if server.state is not ServerState.READY:
            description = f"[unavailable right now: its server is {server.state}] {description}"
        self.description = description[:1024]

    @property
    def parameters(self) -> dict[str, Any]:
        """The tool's input schema, as the server gave it."""
        schema = dict(self.tool.inputSchema or {})
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})
        return schema

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> str:
        """Ask for approval when the config wants it, then run the tool on its server."""
        note = ""
        if self.server.config.needs_approval(self.tool.name):
            if self.approvals is None:
                raise ToolError(f"{self.name} needs a person's approval, and none can be asked")
            outcome = await self.approvals.ask(
                ctx,
                ApprovalRequest(
                    self.name, args, self.tool.description or "", self.approval_timeout
                ),
            )
            if outcome.verdict is Verdict.DENIED:
                raise ToolError(
                    f"the person declined this call of {self.name}; it did not run. "
                    "Do not call it again unless they ask"
                )
            if outcome.verdict is Verdict.TIMED_OUT:
                raise ToolError(f"nobody approved this call of {self.name} in time; it did not run")
            if outcome.digest != arguments_digest(args):
                raise ToolError(
                    f"this call of {self.name} is not the one the person approved; it did not run"
                )
            note = f"[approved by {outcome.by}]\n" if outcome.by else ""
        return note + await self.server.call(self.tool.name, args)


class MCPTools:
    """The tool source of every configured MCP server (a `ToolSource`)."""

    def __init__(
        self,
        servers: Sequence[MCPServer],
        people: People,
        approvals: Approvals | None = None,
        *,
        approval_timeout: float = 600.0,
        first_list_wait: float = 15.0,
    ) -> None:
        self.servers = tuple(servers)
        self.first_list_wait = first_list_wait
        self.people = people
        self.approvals = approvals
        self.approval_timeout = approval_timeout

    async def _first_lists(self) -> None:
        """Right after Herald starts, wait (a bounded time) for servers still starting, so
        that a turn recovered or received at once sees their tools."""
        starting = [s for s in self.servers if s.state is ServerState.STARTING]
        if not starting:
            return
        try:
            async with asyncio.timeout(self.first_list_wait):
                for server in starting:
                    await server.listed.wait()
        except TimeoutError:
            pass

    async def tools_for(self, ctx: ToolContext) -> Sequence[Tool]:
        """The tools of the servers the person of `ctx` may use (the last list known of a
        server that is down: calling them says it is unavailable)."""
        if not self.servers:
            return []
        await self._first_lists()
        identities: frozenset[str] | None = None
        out: list[Tool] = []
        for server in self.servers:
            cfg = server.config
            if cfg.platforms or cfg.users:
                if identities is None:
                    identities = await self.people.identities(ctx)
                if not may_use(cfg, ctx, identities):
                    continue
            out.extend(
                MCPTool(server, tool, self.approvals, self.approval_timeout)
                for tool in server.tools
            )
        return out
