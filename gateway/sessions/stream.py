"""API turns as the caller sees them: the request, and the stream of its events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from agent_core.llm import Usage
from gateway.contracts.history import ChatMessage
from gateway.contracts.ids import SessionKey, TurnId, UserId


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """A new user message for a session, to be answered in its own turn."""

    key: SessionKey
    platform: str
    text: str
    user_id: UserId | None = None
    history: tuple[ChatMessage, ...] | None = None
    """When set, a stateless request: answer this conversation and store nothing."""
    stream: bool = True
    """Whether the caller reads tokens as they come; if not, the model is not asked to
    stream (cheaper), and the stream carries only the final event."""
    operator: bool = False
    """Whether the caller operates Herald (the API key holder): its tools may reach other
    chats."""
    idempotency_key: str | None = None
    """The request's `Idempotency-Key`: a request sent again with it is answered by the same
    turn (its stored answer, or the continuation of a try that failed)."""
    retry_window: float = 0.0
    """Seconds within which a request repeating the session's last, unanswered question
    continues it rather than asking it again (`api.retry_window`)."""
    profile: str = "default"
    """The profile that answers (its agent; the session key carries it already)."""


@dataclass(frozen=True, slots=True)
class Token:
    """A piece of the reply as the model streams it."""

    text: str


@dataclass(frozen=True, slots=True)
class Finished:
    """The end of a turn. `status`: completed, failed, interrupted or timed_out."""

    status: str
    text: str = ""
    turn_id: TurnId | None = None
    usage: Usage | None = None
    error: str | None = None
    retryable: bool = True
    """For a failed turn: whether the same request may succeed later."""
    code: int | None = None
    """For a request refused before its turn ran: the HTTP status to answer (422: an
    `Idempotency-Key` reused for another request)."""
    llm_seconds: float = 0.0
    """Time the turn spent waiting on the model (the rest is Herald's own)."""


TurnEvent = Token | Finished


@dataclass
class TurnStream:
    """The events of one submitted turn, in order, ending with exactly one Finished."""

    key: SessionKey
    _queue: asyncio.Queue[TurnEvent] = field(default_factory=asyncio.Queue)
    _finished: Finished | None = None
    task: asyncio.Task[None] | None = None
    """The task running the turn (set by `submit`): cancelling it stops the turn."""

    async def token(self, text: str) -> None:
        """Deliver a streamed piece of the reply."""
        if self._finished is None and text:
            self._queue.put_nowait(Token(text))

    def finish(self, event: Finished) -> None:
        """End the stream (only the first call counts)."""
        if self._finished is None:
            self._finished = event
            self._queue.put_nowait(event)

    async def next(self) -> TurnEvent:
        """The next event; safe to cancel (for keep-alive timeouts)."""
        return await self._queue.get()

    async def __aiter__(self) -> AsyncIterator[TurnEvent]:
        while True:
            event = await self._queue.get()
            yield event
            if isinstance(event, Finished):
                return

    async def result(self) -> Finished:
        """Wait for the end of the turn, skipping streamed tokens."""
        async for event in self:
            if isinstance(event, Finished):
                return event
        raise AssertionError("a turn stream always ends with Finished")
