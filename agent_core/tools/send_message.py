"""The `send_message` tool: send text to one of the channels the gateway knows."""

from __future__ import annotations

from typing import Any, Protocol

from agent_core.tools.base import ToolContext, ToolError, str_arg

MAX_TEXT = 20_000


class ChannelSender(Protocol):
    """What the gateway offers the agent for sending outside the current conversation."""

    def targets(self) -> list[str]:
        """The targets to suggest to the model, like `here`, `home` or `telegram:12345`."""
        ...

    async def send(self, target: str, text: str, ctx: ToolContext) -> str:
        """Queue `text` for `target`; return a confirmation. Raise ToolError when the target
        is unknown or not allowed for the person of `ctx`."""
        ...


class SendMessageTool:
    """Sends through the gateway's outbox, never directly to a platform."""

    name = "send_message"
    description = (
        "Send a message to a chat: 'here' (this chat), 'home' (the home channel), 'all' "
        "(every home channel) or '<platform>:<chat id>[:<thread>]', as scheduled jobs name "
        "them. Only allowed targets are accepted. Use it only when the person asks you to "
        "message somewhere."
    )

    def __init__(self, sender: ChannelSender) -> None:
        self.sender = sender

    @property
    def parameters(self) -> dict[str, Any]:
        """The argument schema, listing the targets known right now."""
        return {
            "type": "object",
            "properties": {
                "target": {
                    "type": "string",
                    "description": "one of: " + (", ".join(self.sender.targets()) or "(none)"),
                },
                "text": {"type": "string"},
            },
            "required": ["target", "text"],
        }

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> str:
        """Send; ToolError for an empty or oversized text, or a target the sender refuses."""
        target = str_arg(args, "target").strip()
        text = str_arg(args, "text")
        if not text.strip():
            raise ToolError("the text is empty")
        if len(text) > MAX_TEXT:
            raise ToolError(f"the text is longer than {MAX_TEXT} characters")
        if not target:
            raise ToolError("the target is empty")
        return await self.sender.send(target, text, ctx)
