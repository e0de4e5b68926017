"""Building the prompt of a turn: system prompt, SOUL, USER/MEMORY snapshots, history."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from gateway.contracts.history import ChatMessage, History, Role, SessionInfo

BASE_PROMPT = (
    "You are an assistant reached through a messaging gateway. The conversation below is "
    "with one person (or one group chat). Tools are available; use them when they help."
)


def system_prompt(soul: str, session: SessionInfo | None, summary: str | None) -> str:
    """The one system message: base prompt, persona, memory snapshots and the summary."""
    parts = [BASE_PROMPT, f"# Persona (SOUL.md)\n{soul}"]
    if session is not None:
        if session.user_snapshot.strip():
            parts.append(f"# About the user (USER.md)\n{session.user_snapshot.strip()}")
        if session.memory_snapshot.strip():
            parts.append(f"# Your notes (MEMORY.md)\n{session.memory_snapshot.strip()}")
        if session.skills_snapshot.strip():
            parts.append(session.skills_snapshot.strip())
    if summary:
        parts.append(f"# Summary of the conversation so far\n{summary.strip()}")
    return "\n\n".join(parts)


def build_context(
    soul: str, session: SessionInfo | None, history: History, extra: Sequence[ChatMessage] = ()
) -> list[ChatMessage]:
    """The messages sent to the model for the next call of a turn."""
    system = ChatMessage(Role.SYSTEM, system_prompt(soul, session, history.summary))
    return [system, *sanitize(history.messages), *extra]


def sanitize(messages: Iterable[ChatMessage]) -> list[ChatMessage]:
    """Drop what a model API would refuse: tool calls without results and orphan results.

    A call counts as answered only by a tool message directly after its assistant message
    (call ids repeat across turns). A window can start in the middle of a tool exchange,
    and an interrupted turn can stop between a call and its result.
    """
    items = list(messages)
    out: list[ChatMessage] = []
    i = 0
    while i < len(items):
        m = items[i]
        i += 1
        if m.role is Role.TOOL:
            continue  # orphan: its call is not directly before it
        if m.role is not Role.ASSISTANT or not m.tool_calls:
            out.append(m)
            continue
        results: list[ChatMessage] = []
        while i < len(items) and items[i].role is Role.TOOL:
            results.append(items[i])
            i += 1
        answered = {r.tool_call_id for r in results}
        calls = tuple(c for c in m.tool_calls if c.id in answered)
        kept = {c.id for c in calls}
        if calls or m.content:
            out.append(replace(m, tool_calls=calls))
        out.extend(r for r in results if r.tool_call_id in kept)
    return out


def estimate_tokens(messages: Iterable[ChatMessage]) -> int:
    """A rough token count (characters / 4) for use before the model has reported usage."""
    total = 0
    for m in messages:
        total += len(m.content) + sum(len(c.arguments) + len(c.name) for c in m.tool_calls) + 16
    return total // 4
