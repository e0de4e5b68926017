"""What is known of an MCP server without its SDK: its state, its status line, the names of
its tools. Imported by the daemon whether or not any MCP server is configured; `server`
(which imports the `mcp` SDK) only when one is."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


class ServerState(StrEnum):
    """Where a server is in its life."""

    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class ServerStatus:
    """A server as `/health` and `herald doctor` show it."""

    name: str
    transport: str
    state: ServerState
    tools: int
    restarts: int
    error: str | None

    def as_dict(self) -> dict[str, Any]:
        """Plain data for JSON."""
        return {
            "transport": self.transport,
            "state": str(self.state),
            "tools": self.tools,
            "restarts": self.restarts,
            "error": self.error,
        }


def exposed_name(prefix: str, tool: str) -> str:
    """The name the model knows a server's tool by: `<prefix>__<tool>`, made safe for the
    function-name rules of model APIs (letters, digits, `_`, `-`; 64 characters)."""
    name = f"{prefix}__{tool}" if prefix else tool
    return NAME_UNSAFE.sub("_", name)[:64]
