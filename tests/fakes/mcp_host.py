"""A stand-in for Herald holding one local MCP server (the fake), for the orphan tests.

Run as `python -P tests/fakes/mcp_host.py`: starts the server through `MCPHub`, has it start a
grandchild that ignores stdin, prints `{"server": pid, "launcher": pid, "grandchild": pid}`
on one line, then waits to be killed (SIGKILL) or stopped (SIGTERM: the hub is left cleanly).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from agent_core.mcp.config import MCPConfig  # noqa: E402 - after the path is set
from agent_core.mcp.hub import MCPHub  # noqa: E402


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


async def main() -> None:
    """Start, report the pids, wait for SIGTERM."""
    script = str(REPO / "tests" / "fakes" / "mcp_server.py")
    config = MCPConfig.model_validate(
        {"servers": {"t": {"command": sys.executable, "args": ["-P", script]}}}
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with MCPHub(config) as hub:
        if not await hub.wait_ready(30):
            raise SystemExit("the server did not start")
        server = hub.servers["t"]
        pid = int(await server.call("pid", {}))
        grandchild = int(await server.call("spawn", {}))
        print(
            json.dumps({"server": pid, "launcher": _parent(pid), "grandchild": grandchild}),
            flush=True,
        )
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
