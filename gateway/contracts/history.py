"""The transcript vocabulary shared by the store and the agent core."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol

from gateway.contracts.ids import MessageId, SessionId, SessionKey, UserId


class Role(StrEnum):
    """Who said a message in a transcript."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call the model asked for."""

    id: str
    name: str
    arguments: str
    """JSON text, exactly as the model produced it."""

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI chat-completions shape of this call."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of a conversation with the model."""

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    interrupted: bool = False
    """True for the partial output of a turn that was cancelled."""
    id: MessageId | None = None
    created_at: datetime | None = None
    images: tuple[str, ...] = ()
    """Pictures shown with a user message (`data:` URLs) for this model call only; the
    transcript keeps just `content`, where a reference to each picture is written."""

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI chat-completions shape of this message (content parts with images)."""
        out: dict[str, Any] = {"role": str(self.role), "content": self.content}
        if self.images:
            out["content"] = [
                {"type": "text", "text": self.content},
                *({"type": "image_url", "image_url": {"url": url}} for url in self.images),
            ]
        if self.tool_calls:
            out["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None and self.role is not Role.TOOL:
            out["name"] = self.name
        return out


@dataclass(frozen=True, slots=True)
class History:
    """What a turn needs of the past: the latest summary and the messages after it."""

    summary: str | None
    messages: tuple[ChatMessage, ...]
    summary_upto: MessageId | None = None
    last_usage: tuple[int, int] | None = None
    """(prompt, completion) tokens the model reported for the session's latest turn."""


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """One session as the store knows it."""

    id: SessionId
    key: SessionKey
    epoch: int
    platform: str
    user_id: UserId | None
    busy_mode: str | None
    user_snapshot: str
    memory_snapshot: str
    created_at: datetime
    updated_at: datetime
    message_count: int
    skills_snapshot: str = ""
    """The skills index frozen when the session opened (changes show in the next session)."""
    profile: str = "default"
    """The profile that answers the session (its persona, model, memory namespace)."""
    group: bool = False
    """Whether the turn being run answers a chat several people share (a group, or one
    person's session in it with `group_sessions: user`): set for the turn, not stored. Such
    a turn is never synced to the memory provider nor given the person's recalled memory."""


@dataclass(frozen=True, slots=True)
class SearchHit:
    """A message that matched a full-text query, with a snippet around the match."""

    message_id: MessageId
    session_id: SessionId
    session_key: SessionKey
    role: Role
    snippet: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class TurnResult:
    """What a finished (or cut off) turn adds to the transcript."""

    status: str
    """completed, failed or interrupted."""
    messages: tuple[ChatMessage, ...] = ()
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class TranscriptStore(Protocol):
    """What the agent core reads and writes of transcripts."""

    async def load_history(self, session_id: SessionId, window: int) -> History:
        """The latest summary and at most `window` messages after it, oldest first, with
        the token usage of the latest turn (read together)."""
        ...

    async def save_summary(
        self, session_id: SessionId, upto_message_id: MessageId, content: str
    ) -> None:
        """Record a summary covering every message up to `upto_message_id`."""
        ...

    async def transcript(
        self, session_id: SessionId, *, limit: int = 200, before: MessageId | None = None
    ) -> list[ChatMessage]:
        """Up to `limit` messages of a session (those before `before`), oldest first."""
        ...

    async def search_messages(
        self, query: str, *, user_id: UserId | None, limit: int = 10, profile: str | None = None
    ) -> list[SearchHit]:
        """Full-text search over transcripts of `user_id`'s sessions (all when None) that
        `profile` answered (any when None)."""
        ...

    async def messages_around(
        self, message_id: MessageId, *, before: int, after: int
    ) -> list[ChatMessage]:
        """The conversation (user messages, assistant messages with text) of the same session
        surrounding `message_id`, itself included; tool calls and results are left out."""
        ...

    async def recent_sessions(
        self, *, user_id: UserId | None, limit: int = 10, profile: str | None = None
    ) -> list[SessionInfo]:
        """The most recently active sessions of `user_id` (all when None) that `profile`
        answered (any when None)."""
        ...
