"""`gateway.store.api_turns` on every store: what an earlier try of an API request left."""

from __future__ import annotations

import pytest

from gateway.contracts.history import ChatMessage, Role, TurnResult
from gateway.contracts.ids import SessionKey
from gateway.store import Store
from gateway.store.api_turns import KeyReused, earlier_try, forget_question, mark
from tests.contract.test_store import open_session
from tests.turns import finish_turn, start_turn

KEY = SessionKey("api:api:retries")


async def test_a_forgotten_question_leaves_nothing_and_a_kept_one_is_continued(
    store: Store,
) -> None:
    session = await open_session(store, KEY)
    refused, _ = await start_turn(store, session.id, ChatMessage(Role.USER, "hi"))
    await finish_turn(store, session.id, refused, TurnResult("failed", (), error="down"))
    async with store.write() as conn:
        assert await forget_question(conn, session.id, refused) == 1
        assert await earlier_try(conn, session.id, "hi", key=None, window=600) is None
    assert (await store.load_history(session.id, 10)).messages == ()
    assert (await store.get_session(KEY)).message_count == 0  # type: ignore[union-attr]

    kept, _ = await start_turn(store, session.id, ChatMessage(Role.USER, "search"))
    tool = ChatMessage(Role.TOOL, "found", tool_call_id="c1", name="session_search")
    await finish_turn(store, session.id, kept, TurnResult("failed", (tool,), error="down"))
    async with store.write() as conn:
        again = await earlier_try(conn, session.id, "search", key=None, window=600)
        assert again is not None
        assert (again.turn_id, again.answer) == (kept, None)
        assert await earlier_try(conn, session.id, "search", key=None, window=0) is None
        assert await earlier_try(conn, session.id, "other", key=None, window=600) is None


async def test_an_idempotency_key_finds_its_answer_and_refuses_another_question(
    store: Store,
) -> None:
    session = await open_session(store, KEY)
    turn, _ = await start_turn(store, session.id, ChatMessage(Role.USER, "hello"))
    async with store.write() as conn:
        await mark(conn, turn, "k1")
    answer = (ChatMessage(Role.ASSISTANT, "Hi!"),)
    await finish_turn(store, session.id, turn, TurnResult("completed", answer))
    async with store.write() as conn:
        found = await earlier_try(conn, session.id, "hello", key="k1", window=0)
        assert found is not None
        assert found.answer == "Hi!"
        assert await earlier_try(conn, session.id, "hello", key="k2", window=0) is None
        with pytest.raises(KeyReused):
            await earlier_try(conn, session.id, "bye", key="k1", window=0)
