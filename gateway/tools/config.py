"""The `tools` config section: settings of the built-in tools."""

from __future__ import annotations

from gateway.contracts.config import Section


class SendMessageConfig(Section):
    """`tools.send_message`: where the agent may send on its own."""

    targets: tuple[str, ...] = ("home",)
    """Targets in the syntax of scheduled jobs (`home`, `all`, `<platform>:<chat>[:<thread>]`).
    The chat being answered is always allowed; the others only for Herald's operators."""


class ToolsConfig(Section):
    """Settings of the built-in tools."""

    send_message: SendMessageConfig = SendMessageConfig()
