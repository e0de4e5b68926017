"""The tool loop of one turn, with steer points at every tool and model boundary."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from agent_core.llm import LLMProvider, TokenCallback, Usage
from agent_core.tools.base import ToolContext, ToolRegistry
from gateway.contracts.history import ChatMessage, Role, TurnResult

ITERATION_CAP_NOTE = (
    "You have used every tool call this turn allows. Answer now with what you have."
)


@dataclass(frozen=True, slots=True)
class Steered:
    """A message injected into a running turn, with who wrote it: its words join the turn,
    and so do its writer's (lesser) rights."""

    text: str
    sender: str | None = None
    """`platform:id` of the writer (None: the person the turn answers)."""
    operator: bool = False
    """Whether the writer operates Herald."""


class SteerSource(Protocol):
    """Messages that arrived for a running turn and should be injected into it."""

    async def take(self) -> Sequence[Steered]:
        """Remove and return the messages waiting to be injected (possibly none); may take
        a moment (a voice note is transcribed first)."""
        ...


ToolsFor = Callable[[ToolContext], Awaitable[ToolRegistry]]
"""The tools a context may use (chosen again when steered words change who acts)."""


@dataclass
class TurnProgress:
    """What a turn has produced so far. Read it after cancellation to keep partial output."""

    messages: list[ChatMessage] = field(default_factory=list)
    partial: list[str] = field(default_factory=list)
    """Streamed text of the model call in flight."""
    usage: Usage | None = None
    steered: int = 0
    """How many steer messages were injected."""
    llm_seconds: float = 0.0
    """Time spent waiting on the model, summed over the turn's calls."""

    def add_usage(self, usage: Usage | None) -> None:
        """Prompt tokens of the latest call (the context size); completion tokens summed."""
        if usage is None:
            return
        done = self.usage.completion_tokens if self.usage else 0
        self.usage = Usage(usage.prompt_tokens, done + usage.completion_tokens)

    @property
    def final_text(self) -> str:
        """The text of the last assistant message without tool calls ("" if none yet)."""
        for m in reversed(self.messages):
            if m.role is Role.ASSISTANT and not m.tool_calls:
                return m.content
        return ""

    def result(self, status: str, error: str | None = None) -> TurnResult:
        """What to store: complete messages, plus the partial text marked interrupted."""
        messages = list(self.messages)
        partial = "".join(self.partial)
        if status != "completed" and partial.strip():
            messages.append(ChatMessage(Role.ASSISTANT, partial, interrupted=True))
        return TurnResult(
            status=status,
            messages=tuple(messages),
            prompt_tokens=self.usage.prompt_tokens if self.usage else None,
            completion_tokens=self.usage.completion_tokens if self.usage else None,
            error=error,
        )


async def run_tool_loop(
    provider: LLMProvider,
    context: Sequence[ChatMessage],
    tools: ToolRegistry,
    ctx: ToolContext,
    progress: TurnProgress,
    *,
    max_iterations: int,
    on_token: TokenCallback | None = None,
    steer: SteerSource | None = None,
    partial: bool = True,
    tools_for: ToolsFor | None = None,
) -> str:
    """Call the model, run the tools it asks for, repeat; return the final answer.

    Every message produced is appended to `progress` as soon as it is complete. With
    `partial` (or an `on_token`), each call is streamed so that the text of an answer cut
    off midway is in `progress.partial`; without both, calls are not streamed (cheaper),
    and an answer cut off leaves no partial text. Steer
    messages are injected as user messages after each tool round; one that arrives while
    the final answer is being written is left for the next turn. The rights of the turn are
    decided again when steered words join: every tool called afterwards sees the context
    narrowed to what all the writers may do (`ToolContext.joined_by`), and the tools offered
    are chosen again with `tools_for`. Raises LLMError.
    """

    async def stream(token: str) -> None:
        progress.partial.append(token)
        if on_token is not None:
            await on_token(token)

    specs = tools.specs()
    for iteration in range(max_iterations + 1):
        last = iteration == max_iterations
        messages = [*context, *progress.messages]
        if last and specs:
            messages.append(ChatMessage(Role.SYSTEM, ITERATION_CAP_NOTE))
        progress.partial.clear()
        asked = time.perf_counter()
        try:
            completion = await provider.complete(
                messages,
                tools=() if last else specs,
                on_token=stream if partial or on_token is not None else None,
            )
        finally:
            progress.llm_seconds += time.perf_counter() - asked
        progress.partial.clear()
        progress.add_usage(completion.usage)
        if not completion.tool_calls or last:
            progress.messages.append(ChatMessage(Role.ASSISTANT, completion.content))
            return completion.content
        progress.messages.append(
            ChatMessage(Role.ASSISTANT, completion.content, tool_calls=completion.tool_calls)
        )
        for call in completion.tool_calls:
            output = await tools.call(call, ctx)
            progress.messages.append(
                ChatMessage(Role.TOOL, output, tool_call_id=call.id, name=call.name)
            )
        if ctx.media is not None:  # pictures a tool asked to show (view_attachment)
            progress.messages.extend(ctx.media.take_shown())
        if steer is not None:
            joined = ctx
            for steered in await steer.take():
                progress.messages.append(ChatMessage(Role.USER, steered.text))
                progress.steered += 1
                joined = joined.joined_by(steered.sender, operator=steered.operator)
            if joined != ctx:
                ctx = joined
                if tools_for is not None:
                    tools = await tools_for(ctx)
                    specs = tools.specs()
    raise AssertionError("unreachable: the last iteration always returns")
