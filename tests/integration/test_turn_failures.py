"""No exception from a turn leaves its turn: a bug in the agent, a failing memory pass, a
failing store read in a lane — the message gets its outcome, the manager keeps running
(SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from agent_core.llm import Completion, TokenCallback
from gateway.config import SessionsConfig
from gateway.contracts.errors import LLMUnavailable
from gateway.contracts.history import ChatMessage, Role
from gateway.contracts.ids import SessionKey
from gateway.sessions import TurnRequest
from gateway.store import Store
from gateway.store.inbox import Outcome
from tests.fakes.platform import GatedLLM, inbound
from tests.integration.rig import running_rig

pytestmark = pytest.mark.timeout(60)

KEY = "test:acct:c1"


class BuggyLLM(GatedLLM):
    """Answers like GatedLLM, but raises a plain bug (not an LLMError) for `boom`."""

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[Mapping[str, Any]] = (),
        on_token: TokenCallback | None = None,
    ) -> Completion:
        last = next((m.content for m in reversed(messages) if m.role is Role.USER), "")
        if last == "boom":
            raise RuntimeError("a bug in the provider")
        return await super().complete(messages, tools=tools, on_token=on_token)


async def test_a_bug_in_a_turn_drops_its_message_with_a_notice_and_nothing_else(
    store: Store, tmp_path: Path
) -> None:
    async with running_rig(store, tmp_path, llm=BuggyLLM(gated=False)) as rig:
        await rig.manager.accept(inbound("boom"))
        [row] = await rig.settled(KEY, 1)
        assert row.outcome is Outcome.DROPPED
        assert row.outcome_detail == "internal error: RuntimeError"
        await rig.adapter.wait_for(lambda d: len(d) == 1)
        assert "went wrong on my side" in rig.adapter.delivered[0].text
        # The manager still runs turns, for this session and others.
        await rig.manager.accept(inbound("hello"))
        await rig.manager.accept(inbound("there", chat="c2"))
        rows = await rig.settled(KEY, 2)
        assert rows[1].outcome is Outcome.ANSWERED
        [other] = await rig.settled("test:acct:c2", 1)
        assert other.outcome is Outcome.ANSWERED


async def test_a_bug_in_an_api_turn_is_a_failed_turn_not_a_crash(
    store: Store, tmp_path: Path
) -> None:
    async with running_rig(store, tmp_path, llm=BuggyLLM(gated=False)) as rig:
        stream = rig.manager.submit(TurnRequest(SessionKey("api:x"), "api", "boom"))
        done = await stream.result()
        assert done.status == "failed"
        assert done.error == "internal error: RuntimeError"
        assert not done.retryable
        assert done.turn_id is not None
        assert await store.turn_status(done.turn_id) == "failed"
        again = await rig.manager.submit(TurnRequest(SessionKey("api:x"), "api", "hi")).result()
        assert again.status == "completed"


async def test_transient_failures_do_not_use_up_a_messages_tries(
    store: Store, tmp_path: Path
) -> None:
    """A message retried through a long outage is still answered, not given up as poison."""
    sessions = SessionsConfig(
        debounce_seconds=0,
        ack_interval=0,
        drain_timeout=0.5,
        model_retry_initial=0.01,
        model_retry_max=0.02,
    )
    llm = FlakyLLM(failures=6)
    async with running_rig(store, tmp_path, llm=llm, sessions=sessions) as rig:
        await rig.manager.accept(inbound("hello"))
        [row] = await rig.settled(KEY, 1)
        assert row.outcome is Outcome.ANSWERED
        assert llm.failed == 6
        texts = [d.text for d in await rig.adapter.wait_for(lambda d: len(d) >= 2)]
        assert len(texts) == 2
        assert "can't reach my language model" in texts[0]
        assert texts[1] == "answer to hello"


class FlakyLLM(GatedLLM):
    """Unreachable for the first `failures` calls, then answers like GatedLLM."""

    def __init__(self, failures: int) -> None:
        super().__init__(gated=False)
        self.left = failures
        self.failed = 0

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[Mapping[str, Any]] = (),
        on_token: TokenCallback | None = None,
    ) -> Completion:
        if self.left > 0:
            self.left -= 1
            self.failed += 1
            raise LLMUnavailable("cannot reach the model endpoint (fake); retry later")
        return await super().complete(messages, tools=tools, on_token=on_token)
