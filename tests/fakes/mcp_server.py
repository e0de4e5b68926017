"""A real MCP server (FastMCP, the `mcp` SDK) for the tests, over stdio or streamable HTTP.

Run as `python tests/fakes/mcp_server.py stdio` or `python tests/fakes/mcp_server.py http
PORT` (127.0.0.1). Its tools: `echo`, `add`, `boom` (raises), `hang` (never answers),
`crash` (the process exits mid-call), `login` (fails quoting `SERVICE_TOKEN` of its
environment), `grow` (adds the tool `extra` and tells the client its
list changed), `big` (a long result), `pid` (the server's process id, to see restarts), and
`spawn` (starts a grandchild process that ignores stdin, and returns its pid), `stderr`
(writes its text on stderr). Started with `FAKE_MCP_TOKEN` in its environment, it first
says that token on stderr, as a careless server would.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from mcp.server.fastmcp import Context, FastMCP

server = FastMCP("herald-test", host="127.0.0.1", log_level="WARNING")


@server.tool()
def echo(text: str) -> str:
    """Return the text."""
    return f"echo: {text}"


@server.tool()
def add(a: int, b: int) -> str:
    """Add two numbers."""
    return str(a + b)


@server.tool()
def boom() -> str:
    """Always fails."""
    raise RuntimeError("the boom tool exploded")


@server.tool()
def login() -> str:
    """Always refused, quoting the credential it was given (`SERVICE_TOKEN` of its
    environment), as a careless service's error does."""
    raise RuntimeError(f"login refused for token {os.environ.get('SERVICE_TOKEN')!r}")


@server.tool()
async def hang() -> str:
    """Never answers."""
    await asyncio.sleep(3600)
    return "late"


@server.tool()
def crash() -> str:
    """The server process exits mid-call."""
    os._exit(3)


@server.tool()
def pid() -> str:
    """The server's process id."""
    return str(os.getpid())


@server.tool()
def big(n: int) -> str:
    """A result of n characters."""
    return "x" * n


@server.tool()
def spawn() -> str:
    """Start a grandchild that outlives stdin (sleeps); its pid."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(3600)"],
        stdin=subprocess.DEVNULL,
    )
    return str(child.pid)


@server.tool()
def stderr(text: str) -> str:
    """Write the text on stderr."""
    print(text, file=sys.stderr, flush=True)
    return "written"


def extra(word: str) -> str:
    """A tool added at run time."""
    return f"extra: {word}"


@server.tool()
async def grow(ctx: Context) -> str:  # type: ignore[type-arg]
    """Add the tool `extra` and announce the change."""
    server.add_tool(extra)
    await ctx.session.send_tool_list_changed()
    return "grown"


def main() -> None:
    """Serve on stdio, or streamable HTTP on 127.0.0.1:PORT."""
    token = os.environ.get("FAKE_MCP_TOKEN")
    if token:
        print(f"starting with token {token}", file=sys.stderr, flush=True)
    if sys.argv[1:2] == ["http"]:
        server.settings.port = int(sys.argv[2])
        server.run("streamable-http")
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
