"""The agent: one turn of a session, from history to answer, plus the memory-update pass."""

from __future__ import annotations

import logging
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass

from agent_core.compress import compress, needs_compression
from agent_core.context import build_context
from agent_core.llm import LLMProvider, TokenCallback, Usage
from agent_core.loop import SteerSource, TurnProgress, run_tool_loop
from agent_core.media import TurnMedia, Vision
from agent_core.media.transcribe import Transcriber
from agent_core.memory import MemoryFiles, MemoryScope
from agent_core.memory_providers.recall import MemoryRecall
from agent_core.skills.invoke import invocation
from agent_core.skills.review import SkillReview
from agent_core.skills.service import Skills
from agent_core.tools.base import ToolContext, ToolRegistry
from gateway.contracts.errors import LLMError
from gateway.contracts.history import ChatMessage, History, Role, SessionInfo, TranscriptStore
from gateway.contracts.ids import SessionKey, UserId

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


async def session_snapshot(
    memory: MemoryFiles, skills: Skills | None, key: SessionKey, user_id: UserId | None
) -> tuple[str, str, str]:
    """(USER.md, MEMORY.md, skills index) of a session of `key` and `user_id`, as they are
    now: what a new session freezes into its prompt."""
    user_md, memory_md = await memory.snapshot(key, user_id)
    if skills is None:
        return user_md, memory_md, ""
    await skills.refresh()
    try:
        index = skills.index(memory.skill_owner(key, user_id))
    except OSError as err:  # an unreadable skills folder costs the index, not the session
        logger.warning("skills index for %s left out: %s", key, err)
        index = ""
    return user_md, memory_md, index


class Agent:
    """Runs turns. Stateless itself: history comes from the store, memory from files."""

    def __init__(
        self,
        provider: LLMProvider,
        store: TranscriptStore,
        memory: MemoryFiles,
        tools: ToolRegistry,
        settings: AgentSettings = AgentSettings(),
        *,
        recall: MemoryRecall | None = None,
        vision: Vision | None = None,
        transcriber: Transcriber | None = None,
        skills: Skills | None = None,
        allowed: frozenset[str] | None = None,
        profile: str = "default",
    ) -> None:
        self.provider = provider
        self.store = store
        self.memory = memory
        self.tools = tools
        self.settings = settings
        self.recall = recall
        """The external memory provider's recall (None: `memory.provider: none`)."""
        self.vision = vision
        """Shows the pictures of a turn's new messages (or tells the model it cannot see)."""
        self.transcriber = transcriber
        """Turns voice notes into text before their turn; None: no endpoint configured."""
        self.skills = skills
        self.allowed = allowed
        """The only tools this agent offers (its profile's `tools`; None: every tool): a
        turn's own `allowed` narrows it further, never widens it."""
        self.profile = profile
        """The name of the profile this agent answers as."""
        self.review = None if skills is None else SkillReview(provider, skills, memory.skill_owner)

    async def snapshot(self, key: SessionKey, user_id: UserId | None) -> tuple[str, str, str]:
        """(USER.md, MEMORY.md, skills index) as they are now, frozen into a new session."""
        return await session_snapshot(self.memory, self.skills, key, user_id)

    def skill_message(self, text: str, key: SessionKey, user_id: UserId | None) -> str:
        """`text`, or for `/<skill> rest` the user message carrying that skill's text."""
        if self.skills is None or not text.lstrip().startswith("/"):
            return text
        expanded = invocation(self.skills, text, self.memory.skill_owner(key, user_id))
        return text if expanded is None else expanded

    def skill_review(
        self, session: SessionInfo, exchange: Sequence[ChatMessage]
    ) -> Coroutine[object, object, None] | None:
        """The background review this finished turn earns, or None."""
        if self.review is None or not self.review.wanted(session, exchange):
            return None
        if self.allowed is not None and "skill_manage" not in self.allowed:
            return None  # the profile may not write skills: not in the background either
        return self.review.run(session, exchange)

    async def load_context(
        self, session: SessionInfo, history: History | None = None
    ) -> list[ChatMessage]:
        """History rebuilt from SQL (compressing first when it is too long) as model input.

        `history`: the session's history as just read (`history_window` messages), saving
        the read."""
        s = self.settings
        if history is None:
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
        return build_context(await self.memory.soul(), session, history)

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
        media: TurnMedia | None = None,
        sender: str | None = None,
        turn_id: int | None = None,
        history: History | None = None,
        partial: bool = True,
        others: frozenset[str] = frozenset(),
        group: bool = False,
        allowed: frozenset[str] | None = None,
    ) -> str:
        """Answer the messages already stored for the session; return the final text.

        Messages produced are appended to `progress`; on cancellation the caller keeps what
        is there. `operator`: the person asking operates Herald (tools may reach other
        chats). `media`: where tools put pictures to show and files to send (chat turns).
        `sender`: `platform:id` of the person asking; `turn_id`: the turn being answered.
        `history`: the session's history read as the turn began (None: read it here).
        `partial`: stream the model's answer even without `on_token`, so that a turn cut
        off keeps its partial text (False: nobody reads it; the calls are not streamed).
        `others`: `platform:id` of the other people whose words the turn answers (its
        rights are those all of them have); `group`: the chat is shared by several people.
        `allowed`: the only tools the turn may use (None: every tool its person may use).
        Raises LLMError when the model cannot answer.
        """
        if self.allowed is not None:
            allowed = self.allowed if allowed is None else allowed & self.allowed
        context = await self.load_context(session, history)
        if self.recall is not None:
            context = await self.recall.prepare(session, context)
        if self.vision is not None:
            context = await self.vision.show(session, context)
        ctx = ToolContext(
            session=session,
            user_id=session.user_id,
            operator=operator,
            media=media,
            sender=sender,
            turn_id=turn_id,
            others=others,
            group=group,
            allowed=allowed,
        )
        return await run_tool_loop(
            self.provider,
            context,
            await self.tools.for_turn(ctx),
            ctx,
            progress,
            max_iterations=self.settings.max_tool_iterations,
            on_token=on_token,
            steer=steer,
            partial=partial,
            tools_for=self.tools.for_turn,
        )

    async def memory_pass(self, session: SessionInfo, exchange: Sequence[ChatMessage]) -> None:
        """Let the model save what the latest exchange taught it. Never raises (but for
        cancellation): a failure is logged and the pass skipped."""
        if not self.settings.memory_pass or "memory" not in self.tools:
            return
        if self.allowed is not None and "memory" not in self.allowed:
            return
        talk = "\n".join(
            f"{m.role}: {m.content}"
            for m in exchange
            if m.role in (Role.USER, Role.ASSISTANT) and m.content
        )
        owner = self.memory.owner(session.key, session.user_id)
        if not talk or owner is None:
            return
        user_md = await self.memory.read(MemoryScope.USER, owner)
        memory_md = await self.memory.read(MemoryScope.MEMORY, owner)
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
        context = build_context(await self.memory.soul(), None, History(None, ()), messages)
        await run_tool_loop(
            self.provider,
            context,
            ToolRegistry(),
            ToolContext(session=None, user_id=None),
            progress,
            max_iterations=0,
            on_token=on_token,
            partial=False,  # nothing is stored: a cut-off answer is not kept anywhere
        )
        return progress
