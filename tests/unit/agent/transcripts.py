"""Setting up transcripts in a real `Store` the way the session manager writes them."""

from __future__ import annotations

from collections.abc import Sequence

from agent_core.llm import Usage
from gateway.contracts.history import ChatMessage, Role, SessionInfo, TurnResult
from gateway.contracts.ids import MessageId, SessionKey, UserId
from gateway.store import Store
from tests.turns import finish_turn, start_turn


class FixedSnapshot:
    """A snapshot factory returning fixed (USER.md, MEMORY.md) texts; records its calls."""

    def __init__(self, user_md: str = "", memory_md: str = "") -> None:
        self.texts = (user_md, memory_md)
        self.calls: list[UserId | None] = []

    async def __call__(self, _key: SessionKey, user_id: UserId | None) -> tuple[str, str]:
        self.calls.append(user_id)
        return self.texts


async def open_session(
    store: Store,
    key: str = "test:bot:chat",
    *,
    user_id: UserId | None = None,
    user_md: str = "",
    memory_md: str = "",
) -> SessionInfo:
    """The session of `key`, created with the given snapshots."""
    return await store.open_session(
        SessionKey(key),
        platform="test",
        user_id=user_id,
        snapshot=FixedSnapshot(user_md, memory_md),
    )


def user(text: str) -> ChatMessage:
    """A user message."""
    return ChatMessage(Role.USER, text)


def assistant(text: str) -> ChatMessage:
    """An assistant message without tool calls."""
    return ChatMessage(Role.ASSISTANT, text)


async def add_turn(
    store: Store,
    session: SessionInfo,
    prompt: str,
    *replies: ChatMessage | str,
    usage: Usage | None = None,
    status: str = "completed",
) -> list[MessageId]:
    """A finished turn: `prompt` from the user, then `replies`; returns every message id."""
    turn_id, prompt_id = await start_turn(store, session.id, user(prompt))
    assert prompt_id is not None
    messages = tuple(assistant(r) if isinstance(r, str) else r for r in replies)
    ids = await finish_turn(
        store,
        session.id,
        turn_id,
        TurnResult(
            status=status,
            messages=messages,
            prompt_tokens=usage.prompt_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
        ),
    )
    return [prompt_id, *ids]


async def add_exchanges(store: Store, session: SessionInfo, count: int) -> list[MessageId]:
    """`count` completed turns `question i` / `answer i`; returns the ids of all messages."""
    ids: list[MessageId] = []
    for i in range(1, count + 1):
        ids += await add_turn(store, session, f"question {i}", f"answer {i}")
    return ids


async def start_user_turn(store: Store, session: SessionInfo, text: str) -> None:
    """Store the user message that starts a (running) turn."""
    await start_turn(store, session.id, user(text))


def contents(messages: Sequence[ChatMessage]) -> list[str]:
    """The contents of `messages`, in order."""
    return [m.content for m in messages]
