"""The `mcp` config section: the MCP servers whose tools the agent may use.

Each `mcp.servers.<name>` is a local server (`command`, `args`, `env`, `cwd`; spoken to over
stdio) or a remote one (`url`, `headers`; streamable HTTP). A secret value of `env` or
`headers` may be given as `<key>_file`, as everywhere in Herald's config.
"""

from __future__ import annotations

import fnmatch
import re
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, field_validator, model_validator

from gateway.contracts.config import IdList, Section, read_secret_files

SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,40}$")


class Approval(StrEnum):
    """Whether a tool call waits for the person's yes in the chat."""

    NEVER = "never"
    ALWAYS = "always"


class MCPToolConfig(Section):
    """Settings of one tool of a server (`mcp.servers.<name>.tools.<tool>`)."""

    approval: Approval | None = None
    """Wins over the server's `approval`."""


class MCPServerConfig(Section):
    """One MCP server: how to reach it, which of its tools to offer, and to whom."""

    enabled: bool = True
    command: str | None = None
    """A local server: the program to start (spoken to over stdin/stdout)."""
    args: tuple[str, ...] = ()
    env: dict[str, SecretStr] = Field(default_factory=dict)
    """Variables added to the server's environment (Herald's own `PATH`, `HOME`… are kept)."""
    cwd: Path | None = None
    url: str | None = None
    """A remote server: its streamable-HTTP endpoint (`https://…/mcp`)."""
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    prefix: str | None = None
    """Tools are offered as `<prefix>__<tool>`; default: the server's name. `""`: bare names."""
    include: tuple[str, ...] = ()
    """Only these tools (names or shell patterns like `get_*`); empty: all."""
    exclude: tuple[str, ...] = ()
    """Never these tools (names or patterns); wins over `include`."""
    timeout: float = Field(default=60.0, gt=0)
    """Seconds one call may take; then the model is told it timed out."""
    max_result_chars: int = Field(default=20_000, ge=100)
    """Longer results are cut, with a note saying so."""
    platforms: tuple[str, ...] = ()
    """Only sessions on these platforms get the tools; empty: every platform."""
    users: IdList = ()
    """Only these people (`platform:id`) get the tools; empty: everyone allowed to talk to
    the agent."""
    approval: Approval = Approval.NEVER
    tools: dict[str, MCPToolConfig] = Field(default_factory=dict)
    approval_timeout: float | None = Field(default=None, gt=0)
    """Seconds to wait for `/approve` (default `mcp.approval_timeout`); then it is a no."""

    @field_validator("env", "headers", mode="before")
    @classmethod
    def _secret_values(cls, value: Any) -> Any:
        return read_secret_files(value)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL (a streamable-HTTP endpoint)")
        return value

    @field_validator("users")
    @classmethod
    def _users(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        out = []
        for item in value:
            platform, sep, ident = item.strip().partition(":")
            if not sep or not platform or not ident:
                raise ValueError(f"{item!r} is not of the form platform:id")
            out.append(f"{platform.lower()}:{ident}")
        return tuple(out)

    @field_validator("platforms")
    @classmethod
    def _platforms(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(p.strip().lower() for p in value if p.strip())

    @model_validator(mode="after")
    def _one_transport(self) -> MCPServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("set either command (a local server) or url (a remote one)")
        if self.url is None and self.headers:
            raise ValueError("headers are for a remote server (url)")
        if self.command is None and (self.args or self.env or self.cwd):
            raise ValueError("args, env and cwd are for a local server (command)")
        return self

    @property
    def local(self) -> bool:
        """Whether Herald starts this server itself (stdio)."""
        return self.command is not None

    def offers(self, tool: str) -> bool:
        """Whether `include` / `exclude` let `tool` through."""
        if any(fnmatch.fnmatchcase(tool, p) for p in self.exclude):
            return False
        return not self.include or any(fnmatch.fnmatchcase(tool, p) for p in self.include)

    def needs_approval(self, tool: str) -> bool:
        """Whether a call of `tool` waits for the person's yes."""
        own = self.tools.get(tool)
        if own is not None and own.approval is not None:
            return own.approval is Approval.ALWAYS
        return self.approval is Approval.ALWAYS


class MCPConfig(Section):
    """MCP servers and what applies to all of them."""

    servers: dict[str, MCPServerConfig] = Field(default_factory=dict)
    approval_timeout: float = Field(default=600.0, gt=0)
    """Seconds to wait for `/approve` or `/deny`; no answer means no."""
    restart_initial: float = Field(default=1.0, gt=0)
    """The first wait before a local server that exited is started again (jittered)."""
    restart_max: float = Field(default=60.0, gt=0)
    """The longest wait between two restarts."""

    @field_validator("servers")
    @classmethod
    def _names(cls, value: dict[str, MCPServerConfig]) -> dict[str, MCPServerConfig]:
        for name in value:
            if not SERVER_NAME.match(name):
                raise ValueError(f"server name {name!r}: use letters, digits, _ and - only")
        return value

    def enabled(self) -> dict[str, MCPServerConfig]:
        """The servers to start."""
        return {n: s for n, s in self.servers.items() if s.enabled}
