"""Fakes at the agent core's seams: a scripted LLM provider, a channel sender, a steer source.

`ScriptedProvider` stands in for the model at the `LLMProvider` protocol: each call records
what it was sent and plays the next step of its script (a `Completion` to return, an error to
raise, or a `Stall` that streams some text and then waits until the test releases it).
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent_core.llm import Completion, TokenCallback, Usage
from agent_core.loop import Steered
from agent_core.tools.base import ToolContext, ToolError
from gateway.contracts.errors import LLMError
from gateway.contracts.history import ChatMessage, Role, ToolCall


@dataclass(frozen=True, slots=True)
class ProviderCall:
    """One call the provider received."""

    messages: tuple[ChatMessage, ...]
    tools: tuple[Mapping[str, Any], ...]
    streamed: bool

    @property
    def tool_names(self) -> list[str]:
        """The names of the tools offered in this call, in order."""
        return [str(t["function"]["name"]) for t in self.tools]

    @property
    def system(self) -> str:
        """The text of the first message when it is a system message, else ""."""
        if self.messages and self.messages[0].role is Role.SYSTEM:
            return self.messages[0].content
        return ""


@dataclass(slots=True)
class Stall:
    """A step that streams `tokens`, signals `reached`, then waits for `release`.

    Cancel the caller while it waits to simulate an interrupt in the middle of a model call;
    or set `release` to let the call return `then`.
    """

    tokens: tuple[str, ...] = ()
    then: Completion = field(default_factory=lambda: Completion(content=""))
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)


Step = Completion | LLMError | Stall


class ScriptedProvider:
    """An `LLMProvider` that answers from a queue of steps and records every call."""

    def __init__(self, *steps: Step, piece_chars: int = 4, model: str = "scripted") -> None:
        self.name = "scripted"
        self.model = model
        self.calls: list[ProviderCall] = []
        self.closed = False
        self._steps: deque[Step] = deque(steps)
        self._piece_chars = piece_chars

    def add(self, *steps: Step) -> None:
        """Queue more steps."""
        self._steps.extend(steps)

    @property
    def pending(self) -> int:
        """How many steps have not been played yet."""
        return len(self._steps)

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[Mapping[str, Any]] = (),
        on_token: TokenCallback | None = None,
    ) -> Completion:
        """Record the call, then play the next step; AssertionError when the script is done."""
        self.calls.append(ProviderCall(tuple(messages), tuple(tools), on_token is not None))
        if not self._steps:
            raise AssertionError(f"unexpected model call #{len(self.calls)}: the script is done")
        step = self._steps.popleft()
        if isinstance(step, LLMError):
            raise step
        if isinstance(step, Stall):
            if on_token is not None:
                for token in step.tokens:
                    await on_token(token)
            step.reached.set()
            await step.release.wait()
            return step.then
        if on_token is not None:
            for piece in pieces(step.content, self._piece_chars):
                await on_token(piece)
        return step

    async def check(self) -> str:
        """Always reachable."""
        return "scripted provider"

    async def aclose(self) -> None:
        """Mark the provider closed."""
        self.closed = True


def pieces(text: str, size: int) -> list[str]:
    """`text` cut into pieces of `size` characters (the last may be shorter)."""
    return [text[i : i + size] for i in range(0, len(text), size)]


def answer(text: str, *, usage: Usage | None = None) -> Completion:
    """A final answer without tool calls."""
    return Completion(content=text, usage=usage, finish_reason="stop")


def call(call_id: str, name: str, arguments: Mapping[str, Any] | str = "{}") -> ToolCall:
    """A tool call; `arguments` as a mapping is encoded as JSON, a string is sent as is."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ToolCall(id=call_id, name=name, arguments=text)


def use_tools(*calls: ToolCall, content: str = "", usage: Usage | None = None) -> Completion:
    """A response asking for `calls`."""
    return Completion(content=content, tool_calls=calls, usage=usage, finish_reason="tool_calls")


class Tokens:
    """An `on_token` callback that keeps what it receives."""

    def __init__(self) -> None:
        self.received: list[str] = []

    async def __call__(self, token: str) -> None:
        self.received.append(token)

    @property
    def text(self) -> str:
        """Everything received, joined."""
        return "".join(self.received)


class QueueSteer:
    """A `SteerSource` fed by the test; counts how often it was asked."""

    def __init__(self, *texts: str) -> None:
        self.waiting: list[str] = list(texts)
        self.takes = 0

    def push(self, *texts: str) -> None:
        """Queue texts for injection."""
        self.waiting.extend(texts)

    async def take(self) -> list[Steered]:
        """Remove and return every waiting text (as the words of the person asking)."""
        self.takes += 1
        taken, self.waiting = self.waiting, []
        return [Steered(t) for t in taken]


@dataclass(frozen=True, slots=True)
class Sent:
    """One message the fake channel sender accepted."""

    target: str
    text: str
    ctx: ToolContext


class FakeChannels:
    """A `ChannelSender` with a fixed set of targets; records what it sends."""

    def __init__(self, targets: Iterable[str] = ("home",), *, refuse: str | None = None) -> None:
        self.known = list(targets)
        self.sent: list[Sent] = []
        self._refuse = refuse

    def targets(self) -> list[str]:
        """The targets given at construction."""
        return list(self.known)

    async def send(self, target: str, text: str, ctx: ToolContext) -> str:
        """Record the message; ToolError when constructed with `refuse`, or for a target
        that is not among the known ones."""
        if self._refuse is not None:
            raise ToolError(self._refuse)
        if target not in self.known:
            known = ", ".join(self.known) or "none"
            raise ToolError(f"unknown target {target!r}; known targets: {known}")
        self.sent.append(Sent(target, text, ctx))
        return f"queued for {target}"


class EchoTool:
    """A tool that answers with its arguments, as sorted JSON; records its calls."""

    description = "Echo the arguments back."

    def __init__(self, name: str = "echo") -> None:
        self.name = name
        self.calls: list[tuple[dict[str, Any], ToolContext]] = []

    @property
    def parameters(self) -> dict[str, Any]:
        """Any object."""
        return {"type": "object", "properties": {}}

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> str:
        self.calls.append((args, ctx))
        return json.dumps(args, sort_keys=True)


class RaisingTool:
    """A tool that raises the exception it was built with."""

    description = "Always fails."

    def __init__(self, error: BaseException, name: str = "broken") -> None:
        self.name = name
        self.error = error

    @property
    def parameters(self) -> dict[str, Any]:
        """No arguments."""
        return {"type": "object", "properties": {}}

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> str:
        raise self.error


class BlockingTool:
    """A tool that signals `entered` and then waits for `release` (for cancelling mid-tool)."""

    description = "Waits until released."

    def __init__(self, name: str = "wait") -> None:
        self.name = name
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    @property
    def parameters(self) -> dict[str, Any]:
        """No arguments."""
        return {"type": "object", "properties": {}}

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> str:
        self.entered.set()
        await self.release.wait()
        return "released"
