"""One MCP server as Herald keeps it: connected, its tools listed, restarted when it exits.

`MCPServer.run` is a long-lived task (a child of the supervisor's TaskGroup through
`MCPHub`): it starts a local server (stdio, through `launch.py` so that the server dies with
Herald) or connects to a remote one (streamable HTTP), lists the tools, lists them again
when the server says they changed, and after a lost connection starts over with jittered
exponential backoff. `call` runs one tool with the server's timeout; every failure is a
ToolError the model reads, never an exception that fails the turn.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import shutil
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import ClientSession, McpError, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.message import SessionMessage
from mcp.shared.session import RequestResponder

from agent_core.mcp.config import MCPServerConfig
from agent_core.mcp.status import ServerState, ServerStatus
from agent_core.tools.base import ToolError

logger = logging.getLogger(__name__)

LAUNCHER = Path(__file__).with_name("launch.py")
CONNECT_TIMEOUT = 30.0
"""Seconds to start (or reach) a server and list its tools."""
PING_TIMEOUT = 5.0
STABLE = 60.0
"""A connection that lasted this long resets the backoff."""
STDERR_LINE = 2000
"""Characters of one line a local server writes on stderr that reach the log (then cut)."""
STDERR_DRAIN = 1.0
"""Seconds to read what a stopped server still had on stderr."""
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

Incoming = SessionMessage | Exception
ServerMessage = (
    RequestResponder[types.ServerRequest, types.ClientResult] | types.ServerNotification | Exception
)


class MCPServer:
    """A connection to one configured MCP server, kept up by `run`."""

    def __init__(
        self,
        name: str,
        config: MCPServerConfig,
        *,
        restart_initial: float = 1.0,
        restart_max: float = 60.0,
        redact: Callable[[str], str] = lambda text: text,
    ) -> None:
        self.name = name
        self.config = config
        self.redact = redact
        """Takes Herald's configured secrets out of what the server writes on stderr (its
        own `env` and `headers` values are taken out in any case)."""
        self._own_secrets = sorted(
            (
                v.get_secret_value()
                for v in (*config.env.values(), *config.headers.values())
                if len(v.get_secret_value()) >= 4
            ),
            key=len,
            reverse=True,
        )
        self.stderr_tail: deque[str] = deque(maxlen=3)
        """The last lines the local server wrote on stderr (redacted)."""
        self.prefix = name if config.prefix is None else config.prefix
        self.restart_initial = restart_initial
        self.restart_max = restart_max
        self.state = ServerState.STARTING
        self.tools: tuple[types.Tool, ...] = ()
        """The server's tools that `include` / `exclude` let through (the last list known)."""
        self.restarts = 0
        self.last_error: str | None = None
        self.listed = asyncio.Event()
        """Set each time the tools have been listed (tests wait on it)."""
        self.tried = asyncio.Event()
        """Set once the first connection has either listed the tools or failed."""
        self._session: ClientSession | None = None
        self._lost = asyncio.Event()
        self._relist = asyncio.Event()

    def status(self) -> ServerStatus:
        """The server's state now."""
        return ServerStatus(
            self.name,
            "stdio" if self.config.local else "http",
            self.state,
            len(self.tools),
            self.restarts,
            self.last_error,
        )

    async def run(self) -> None:
        """Keep the server connected until cancelled."""
        attempt = 0
        while True:
            started = time.monotonic()
            try:
                await self._connect_once()
                error = "the server closed the connection"
            except asyncio.CancelledError:
                self.state = ServerState.STOPPED
                self._session = None
                raise
            except Exception as err:
                if _cancelling():
                    # The SDK's cleanup can raise over our cancellation (a broken stream):
                    # stopping must still stop, not start the server again.
                    self.state = ServerState.STOPPED
                    self._session = None
                    raise asyncio.CancelledError from err
                error = _describe(err)
                if self.stderr_tail:
                    error += f"; its stderr ended with: {self.stderr_tail[-1][:200]}"
            self._session = None
            self.state = ServerState.RESTARTING
            self.last_error = error
            self.tried.set()
            if time.monotonic() - started >= STABLE:
                attempt = 0
            delay = min(self.restart_max, self.restart_initial * 2 ** min(attempt, 16))
            delay *= random.uniform(0.5, 1.0)
            attempt += 1
            self.restarts += 1
            logger.warning(
                "MCP server %s is down (%s); starting it again in %.1fs", self.name, error, delay
            )
            await asyncio.sleep(delay)

    async def check(self, timeout: float) -> ServerStatus:  # noqa: ASYNC109 - a bounded probe
        """Start (or reach) the server, list its tools, stop it: its status then (for
        `herald doctor`). The first failure ends the check."""
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(self.run(), name=f"mcp check {self.name}")
            try:
                async with asyncio.timeout(timeout):
                    await self.tried.wait()
            except TimeoutError:
                self.last_error = self.last_error or f"no tool list within {timeout:g}s"
            status = self.status()
            task.cancel()
        return status

    async def _connect_once(self) -> None:
        """One connection: returns (or raises) when it is lost."""
        self._lost.clear()
        self._relist.clear()
        forward_in, forward_out = anyio.create_memory_object_stream[Incoming](0)
        async with (
            forward_in,
            forward_out,
            self._transport() as (read, write),
            ClientSession(forward_out, write, message_handler=self._on_message) as session,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(self._forward, read, forward_in)
            with anyio.fail_after(CONNECT_TIMEOUT):
                await session.initialize()
                await self._list(session)
            self._session = session
            self.state = ServerState.READY
            self.last_error = None
            logger.info("MCP server %s is ready with %d tools", self.name, len(self.tools))
            tg.start_soon(self._relister, session)
            await self._lost.wait()
            self._session = None
            tg.cancel_scope.cancel()

    def _transport(self) -> Any:
        """The SDK's transport context: yields (read stream, write stream[, …])."""
        cfg = self.config
        if cfg.command is not None:
            env = {**_inherited_env(), **{k: v.get_secret_value() for k, v in cfg.env.items()}}
            if not _runnable(cfg.command, cfg.cwd, env.get("PATH")):
                # Said here: the launcher's own failure reaches Herald as "Connection closed".
                raise FileNotFoundError(
                    f"command not found: {cfg.command} (no such executable"
                    + ("" if os.sep in cfg.command else " on PATH")
                    + ")"
                )
            params = StdioServerParameters(
                command=sys.executable,
                args=["-P", str(LAUNCHER), str(os.getpid()), cfg.command, *cfg.args],
                env=env,
                cwd=cfg.cwd,
            )
            return _Two(self._local(params))
        assert cfg.url is not None
        return _Two(_remote(cfg.url, {k: v.get_secret_value() for k, v in cfg.headers.items()}))

    @asynccontextmanager
    async def _local(self, params: StdioServerParameters) -> AsyncIterator[Any]:
        """The stdio transport, the server's stderr going to the log line by line (never
        raw into Herald's own stderr)."""
        self.stderr_tail.clear()
        read_fd, write_fd = os.pipe()
        errlog = os.fdopen(write_fd, "w")
        reader = asyncio.create_task(self._log_stderr(read_fd), name=f"mcp {self.name} stderr")
        try:
            async with stdio_client(params, errlog=errlog) as streams:
                errlog.close()  # the server has its own copy: its exit ends the reading
                yield streams
        finally:
            errlog.close()
            try:
                async with asyncio.timeout(STDERR_DRAIN):
                    await asyncio.shield(reader)
            except TimeoutError:  # a grandchild keeps stderr open: stop reading it
                reader.cancel()

    async def _log_stderr(self, fd: int) -> None:
        """Log each line read from `fd` under the server's name, redacted and cut."""
        loop = asyncio.get_running_loop()
        stream = asyncio.StreamReader()
        pipe = os.fdopen(fd, "rb", buffering=0)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(stream), pipe
        )
        pending, skipping = b"", False
        try:
            while chunk := await stream.read(65536):
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    if not skipping:
                        self._stderr_line(line)
                    skipping = False
                if len(pending) > STDERR_LINE * 4:  # no line end in sight: log what fits
                    if not skipping:
                        self._stderr_line(pending)
                    pending, skipping = b"", True
            if pending and not skipping:
                self._stderr_line(pending)
        finally:
            transport.close()

    def _stderr_line(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        for secret in self._own_secrets:
            text = text.replace(secret, "***")
        text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", self.redact(text))
        if len(text) > STDERR_LINE:
            text = text[:STDERR_LINE] + f"… (cut: {len(text)} characters)"
        if text.strip():
            self.stderr_tail.append(text)
            logger.info("MCP server %s (stderr): %s", self.name, text)

    async def _forward(
        self, read: MemoryObjectReceiveStream[Incoming], out: MemoryObjectSendStream[Incoming]
    ) -> None:
        """Pass the server's messages on to the session; the end of them is a lost
        connection (a local server that exited)."""
        try:
            async with read, out:
                async for item in read:
                    await out.send(item)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass
        finally:
            self._mark_lost()

    def _mark_lost(self) -> None:
        """The connection is gone: calls are refused until `run` has connected again."""
        self._session = None
        if self.state is ServerState.READY:
            self.state = ServerState.RESTARTING
        self._lost.set()

    async def _on_message(self, message: ServerMessage) -> None:
        if isinstance(message, types.ServerNotification) and isinstance(
            message.root, types.ToolListChangedNotification
        ):
            self._relist.set()  # listed by `_relister`: a request cannot wait in this callback

    async def _relister(self, session: ClientSession) -> None:
        while True:
            await self._relist.wait()
            self._relist.clear()
            try:
                with anyio.fail_after(CONNECT_TIMEOUT):
                    await self._list(session)
                logger.info("MCP server %s now has %d tools", self.name, len(self.tools))
            except Exception as err:
                logger.warning("MCP server %s: listing its tools failed: %s", self.name, err)
                self._mark_lost()
                return

    async def _list(self, session: ClientSession) -> None:
        found: list[types.Tool] = []
        cursor: str | None = None
        while True:
            page = await session.list_tools(cursor=cursor)
            found.extend(t for t in page.tools if self.config.offers(t.name))
            cursor = page.nextCursor
            if not cursor:
                break
        self.tools = tuple(found)
        self.listed.set()
        self.tried.set()

    async def call(self, tool: str, arguments: Mapping[str, Any]) -> str:
        """Run `tool`; its result as text (cut to the budget). Raises ToolError."""
        session = self._session
        if session is None or self.state is not ServerState.READY:
            why = f" ({self.last_error})" if self.last_error else ""
            raise ToolError(
                f"the MCP server {self.name!r} is unavailable right now: {self.state}{why}. "
                "Try again later, or do without this tool"
            )
        timeout = self.config.timeout
        try:
            async with asyncio.timeout(timeout):
                result = await session.call_tool(tool, dict(arguments))
        except TimeoutError:
            await self._check_alive(session)
            raise ToolError(
                f"{tool} did not answer within {timeout:g}s and was abandoned; "
                "do not call it again right away"
            ) from None
        except McpError as err:
            if err.error.code == types.CONNECTION_CLOSED:
                self._mark_lost()
                raise ToolError(
                    f"the MCP server {self.name!r} stopped during the call (it is being "
                    "restarted); the call may or may not have taken effect"
                ) from None
            raise ToolError(f"the MCP server refused the call: {err.error.message}") from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._mark_lost()
            raise ToolError(
                f"the MCP server {self.name!r} is unavailable right now (restarting)"
            ) from None
        text = _render(result)
        if result.isError:
            raise ToolError(f"{tool} failed: {_cut(text, 2000) or 'no details given'}")
        return _cut(text, self.config.max_result_chars)

    async def _check_alive(self, session: ClientSession) -> None:
        """After a timed-out call: a server that no longer answers pings is reconnected."""
        try:
            with anyio.fail_after(PING_TIMEOUT):
                await session.send_ping()
        except Exception:
            self._mark_lost()


class _Two:
    """A transport context yielding (read, write) whatever else the SDK yields."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __aenter__(
        self,
    ) -> tuple[MemoryObjectReceiveStream[Incoming], MemoryObjectSendStream[SessionMessage]]:
        streams = await self.inner.__aenter__()
        return streams[0], streams[1]

    async def __aexit__(self, *exc: Any) -> bool | None:
        result: bool | None = await self.inner.__aexit__(*exc)
        return result


@asynccontextmanager
async def _remote(url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
    """The streamable-HTTP transport with its own HTTP client (closed with it)."""
    client = create_mcp_http_client(
        headers=headers, timeout=httpx.Timeout(CONNECT_TIMEOUT, read=300)
    )
    async with client, streamable_http_client(url, http_client=client) as streams:
        yield streams


def _runnable(command: str, cwd: Path | str | None, path: str | None) -> bool:
    """Whether `command` names an executable: a path (from `cwd` when relative), or a name
    found on `path`, as the launcher will look for it."""
    if os.sep in command:
        target = Path(cwd or ".") / command
        return target.is_file() and os.access(target, os.X_OK)
    return shutil.which(command, path=path) is not None


def _inherited_env() -> dict[str, str]:
    """What a local server gets of Herald's environment: where programs are and whose they
    are, never Herald's own settings (its secrets are in `HERALD_*`)."""
    keep = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TMPDIR", "TERM", "SHELL")
    return {k: v for k, v in os.environ.items() if k in keep}


def _render(result: types.CallToolResult) -> str:
    parts: list[str] = []
    for item in result.content:
        if isinstance(item, types.TextContent):
            parts.append(item.text)
        elif isinstance(item, types.ImageContent):
            parts.append(f"[an image ({item.mimeType}) the tool returned]")
        elif isinstance(item, types.AudioContent):
            parts.append(f"[audio ({item.mimeType}) the tool returned]")
        elif isinstance(item, types.ResourceLink):
            parts.append(f"[resource {item.uri}]")
        elif isinstance(item, types.EmbeddedResource):
            res = item.resource
            if isinstance(res, types.TextResourceContents):
                parts.append(res.text)
            else:
                parts.append(f"[binary resource {res.uri}]")
    if not parts and result.structuredContent is not None:
        parts.append(json.dumps(result.structuredContent, ensure_ascii=False))
    return "\n".join(parts)


def _cut(text: str, budget: int) -> str:
    if len(text) <= budget:
        return text
    return (
        text[:budget]
        + f"\n[… cut: the result had {len(text)} characters; only the first {budget} are shown]"
    )


def _cancelling() -> bool:
    """Whether the current task has been asked to stop."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _describe(err: BaseException) -> str:
    if isinstance(err, BaseExceptionGroup):
        leaves = [e for e in _leaves(err) if not isinstance(e, asyncio.CancelledError)]
        if leaves:
            return _describe(leaves[0])
    if isinstance(err, McpError):
        return err.error.message
    text = str(err) or type(err).__name__
    return text.splitlines()[0][:300]


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for e in group.exceptions:
        out.extend(_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    return out
