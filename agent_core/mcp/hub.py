"""All configured MCP servers, running while the hub is entered."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Self

from agent_core.mcp.config import MCPConfig
from agent_core.mcp.status import ServerStatus

if TYPE_CHECKING:
    from agent_core.mcp.server import MCPServer


class MCPHub:
    """An async context manager: entering starts every enabled server's task (in a TaskGroup
    of its own, entered on the supervisor's exit stack); leaving stops them and their
    processes. A server that fails never stops the others or Herald. What a local server
    writes on stderr is logged under its name after `redact`."""

    def __init__(
        self, config: MCPConfig, *, redact: Callable[[str], str] = lambda text: text
    ) -> None:
        self.config = config
        self.servers: dict[str, MCPServer] = {}
        if config.enabled():  # the SDK is imported only when a server is configured
            from agent_core.mcp import server as sdk  # noqa: PLC0415

            self.servers = {
                name: sdk.MCPServer(
                    name,
                    server,
                    restart_initial=config.restart_initial,
                    restart_max=config.restart_max,
                    redact=redact,
                )
                for name, server in config.enabled().items()
            }
        self._tg: asyncio.TaskGroup | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Self:
        self._tg = asyncio.TaskGroup()
        await self._tg.__aenter__()
        for name, server in self.servers.items():
            self._tasks.append(self._tg.create_task(server.run(), name=f"mcp {name}"))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for task in self._tasks:
            task.cancel()
        assert self._tg is not None
        await self._tg.__aexit__(None, None, None)
        self._tg = None

    async def wait_ready(self, timeout: float) -> bool:  # noqa: ASYNC109 - a bounded look
        """Wait until every server listed its tools once; False if some did not in time."""
        try:
            async with asyncio.timeout(timeout):
                for server in self.servers.values():
                    await server.listed.wait()
        except TimeoutError:
            return False
        return True

    def status(self) -> Mapping[str, ServerStatus]:
        """Each server's state and tool count."""
        return {name: server.status() for name, server in self.servers.items()}
