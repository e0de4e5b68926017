"""The agent: one turn of a session, from history to answer, plus the memory-update pass."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from agent_core.compress import compress, needs_compression
from agent_core.context import build_context
from agent_core.llm import LLMProvider, TokenCallback, Usage
from agent_core.loop import SteerSource, TurnProgress, run_tool_loop
from agent_core.memory import MemoryFiles, MemoryScope
from agent_core.tools.base import ToolContext, ToolRegistry
from gateway.contracts.errors import LLMError
from gateway.contracts.history import ChatMessage, History, Role, SessionInfo, TranscriptStore

logger = logging.getLogger(__name__)

MEMORY_MARKER = "[herald:memory-pass]"
MEMORY_PROMPT = f"""{MEMORY_MARKER} You keep the assistant's long-term memory. Read the latest \
exchange below. If it revealed something durable (who the person is, lasting preferences, \
ongoing projects, commitments), record it with the `memory` tool: target "user" for facts \
about the person, "memory" for notes on ongoing work. Do not record secrets, one-off details \
or anything already saved. If nothing is worth saving, reply exactly: nothing to save."""


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """The agent's knobs, taken from `llm` and `memory` config."""

    history_window: int = 40
    context_window: int = 128_000
    compression_threshold: float = 0.5
    max_tool_iterations: int = 8
    memory_pass: bool = True


class Agent:
    """Runs turns. Stateless itself: history comes from the store, memory from files."""

    def __init__(
        self,
        provider: LLMProvider,
        store: TranscriptStore,
        memory: MemoryFiles,
        tools: ToolRegistry,
        settings: AgentSettings = AgentSettings(),
    ) -> None:
        self.provider = provider
        self.store = store
        self.memory = memory
        self.tools = tools
        self.settings = settings

    async def load_context(self, session: SessionInfo) -> list[ChatMessage]:
        """History rebuilt from SQL (compressing first when it is too long) as model input."""
        s = self.settings
        history = await self.store.load_history(session.id, s.history_window)
        last = history.last_usage
        incoming = len(history.messages[-1].content) if history.messages else 0
        if needs_compression(
            history,
            incoming_chars=incoming,
            last_usage=Usage(*last) if last else None,
            context_window=s.context_window,
            threshold=s.compression_threshold,
            window=s.history_window,
        ) and await self._compress(session, history):
            history = await self.store.load_history(session.id, s.history_window)
        return build_context(self.memory.soul(), session, history)

    async def _compress(self, session: SessionInfo, history: History) -> bool:
        """Compress the history; a failure leaves it as it is (the turn goes on with the
        window) rather than failing the turn."""
        try:
            return await compress(self.provider, self.store, session, history)
        except LLMError as err:
            logger.warning("compression of %s skipped: %s", session.key, err)
        except Exception:
            logger.exception("compression of %s failed; the turn goes on uncompressed", session.key)
        return False

    async def run_turn(
        self,
        session: SessionInfo,
        progress: TurnProgress,
        *,
        on_token: TokenCallback | None = None,
        steer: SteerSource | None = None,
        operator: bool = False,
    ) -> str:
        """Answer the messages already stored for the session; return the final text.

        Messages produced are appended to `progress`; on cancellation the caller keeps what
        is there. `operator`: the person asking operates Herald (tools may reach other
        chats). Raises LLMError when the model cannot answer.
        """
        context = await self.load_context(session)
        return await run_tool_loop(
            self.provider,
            context,
            self.tools,
            ToolContext(session=session, user_id=session.user_id, operator=operator),
            progress,
            max_iterations=self.settings.max_tool_iterations,
            on_token=on_token,
            steer=steer,
        )

    async def memory_pass(self, session: SessionInfo, exchange: Sequence[ChatMessage]) -> None:
        """Let the model save what the latest exchange taught it. Never raises (but for
        cancellation): a failure is logged and the pass skipped."""
        if not self.settings.memory_pass or "memory" not in self.tools:
            return
        talk = "\n".join(
            f"{m.role}: {m.content}"
            for m in exchange
            if m.role in (Role.USER, Role.ASSISTANT) and m.content
        )
        owner = self.memory.owner(session.key, session.user_id)
        if not talk or owner is None:
            return
        user_md = self.memory.read(MemoryScope.USER, owner)
        memory_md = self.memory.read(MemoryScope.MEMORY, owner)
        context = [
            ChatMessage(Role.SYSTEM, MEMORY_PROMPT),
            ChatMessage(
                Role.USER,
                f"USER.md now:\n{user_md or '(empty)'}\n\nMEMORY.md now:\n"
                f"{memory_md or '(empty)'}\n\nLatest exchange:\n{talk}",
            ),
        ]
        try:
            await run_tool_loop(
                self.provider,
                context,
                self.tools.only("memory"),
                ToolContext(session=session, user_id=session.user_id),
                TurnProgress(),
                max_iterations=3,
            )
        except LLMError as err:
            logger.warning("memory pass for %s skipped: %s", session.key, err)
        except Exception:  # the answer is stored already; a failed pass only loses a note
            logger.exception("memory pass for %s failed", session.key)

    async def answer_stateless(
        self, messages: Sequence[ChatMessage], *, on_token: TokenCallback | None = None
    ) -> TurnProgress:
        """Answer a full conversation sent by the caller, storing nothing (no tools)."""
        progress = TurnProgress()
        context = build_context(self.memory.soul(), None, History(None, ()), messages)
        await run_tool_loop(
            self.provider,
            context,
            ToolRegistry(),
            ToolContext(session=None, user_id=None),
            progress,
            max_iterations=0,
            on_token=on_token,
        )
        return progress
