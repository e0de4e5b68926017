"""A turn recorded in a write transaction of its own, as the tests of the transcript need."""

from __future__ import annotations

from gateway.contracts.history import ChatMessage, TurnResult
from gateway.contracts.ids import MessageId, SessionId, TurnId
from gateway.store import Store
from gateway.store.store import record_finish, record_start


async def start_turn(
    store: Store, session_id: SessionId, user_message: ChatMessage | None
) -> tuple[TurnId, MessageId | None]:
    """A running turn and (in the same transaction) the message that started it."""
    async with store.write() as conn:
        turn_id, ids = await record_start(
            conn, session_id, [] if user_message is None else [user_message]
        )
    return turn_id, (ids[0] if ids else None)


async def finish_turn(
    store: Store, session_id: SessionId, turn_id: TurnId, result: TurnResult
) -> list[MessageId]:
    """What the turn produced and its final status, in one transaction."""
    async with store.write() as conn:
        return await record_finish(conn, session_id, turn_id, result)
