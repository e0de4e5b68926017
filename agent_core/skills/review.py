"""The background review: after a turn that used many tools, a bounded agent run that may
save what worked as a skill, or improve one it wrote earlier.

It runs off the chat's path (the reply is sent already), is cancelled by the person's next
message in that chat, and never raises but for cancellation.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from agent_core.llm import LLMProvider
from agent_core.loop import TurnProgress, run_tool_loop
from agent_core.skills.model import SkillSource
from agent_core.skills.service import Author, Skills
from agent_core.skills.tools import OwnerOf, SkillManageTool, SkillsListTool, SkillViewTool
from agent_core.tools.base import ToolContext, ToolRegistry
from gateway.contracts.errors import LLMError
from gateway.contracts.history import ChatMessage, Role, SessionInfo

logger = logging.getLogger(__name__)

REVIEW_MARKER = "[herald:skill-review]"
REVIEW_PROMPT = f"""{REVIEW_MARKER} You review a finished task to keep reusable procedures \
(skills). Read the exchange below. Save a skill only when the task is likely to recur AND the \
exchange shows the procedure working. Skip one-off stories, failures caused by the \
environment (network, permissions, outages), and anything not shown to work.

Rules:
- Prefer improving a skill you wrote before: view it with skill_view, then patch it with \
skill_manage (action "patch"). Never add a near-duplicate of an existing skill.
- You may change only your own skills (listed below), never shared ones, and only after \
viewing them.
- A new skill: skill_manage action "create" with content = the whole SKILL.md (YAML front \
matter with name — lowercase letters, digits, hyphens — and description, then concise \
numbered steps). Leave out personal details that are not needed to repeat the procedure.
- If nothing is worth saving, reply exactly: nothing to save."""


BRIEF_MAX = 60
"""At most this many skills of each kind are listed in the review's brief."""


def tool_calls_in(exchange: Sequence[ChatMessage]) -> int:
    """How many tool calls a turn's messages made."""
    return sum(len(m.tool_calls) for m in exchange if m.role is Role.ASSISTANT)


class SkillReview:
    """Runs the review for one finished turn."""

    def __init__(self, provider: LLMProvider, skills: Skills, owner_of: OwnerOf) -> None:
        self.provider = provider
        self.skills = skills
        self.owner_of = owner_of

    def wanted(self, session: SessionInfo, exchange: Sequence[ChatMessage]) -> bool:
        """Whether this turn earns a review (self-improvement on, enough tool calls, and a
        person or group the skill would belong to)."""
        s = self.skills.settings
        return (
            s.self_improve
            and tool_calls_in(exchange) >= s.review_after_tool_calls
            and self.owner_of(session.key, session.user_id) is not None
        )

    async def run(self, session: SessionInfo, exchange: Sequence[ChatMessage]) -> None:
        """Review the exchange. Never raises, except on cancellation."""
        owner = self.owner_of(session.key, session.user_id)
        viewed: set[str] = set()
        tools = ToolRegistry(
            [
                SkillsListTool(self.skills, self.owner_of),
                SkillViewTool(self.skills, self.owner_of, viewed),
                SkillManageTool(self.skills, self.owner_of, author=Author.REVIEW, viewed=viewed),
            ]
        )
        context = [
            ChatMessage(Role.SYSTEM, REVIEW_PROMPT),
            ChatMessage(Role.USER, self._brief(owner, exchange)),
        ]
        settings = self.skills.settings
        try:
            async with asyncio.timeout(settings.review_timeout):
                await run_tool_loop(
                    self.provider,
                    context,
                    tools,
                    ToolContext(session=session, user_id=session.user_id),
                    TurnProgress(),
                    max_iterations=settings.review_max_iterations,
                )
        except TimeoutError:
            logger.warning("skill review for %s timed out", session.key)
        except LLMError as err:
            logger.warning("skill review for %s skipped: %s", session.key, err)
        except Exception:  # the reply is sent already; a failed review only loses a skill
            logger.exception("skill review for %s failed", session.key)

    def _brief(self, owner: str | None, exchange: Sequence[ChatMessage]) -> str:
        visible = self.skills.store.visible(owner)
        own = [s for s in visible if s.source is SkillSource.PERSONAL]
        shared = [s for s in visible if s.source is not SkillSource.PERSONAL]
        parts = ["Your own skills (you may patch these):"]
        parts += [f"- {s.name}: {s.description}" for s in own[:BRIEF_MAX]] or ["(none yet)"]
        parts.append("Shared skills (read-only; do not duplicate them):")
        parts.append(", ".join(s.name for s in shared[:BRIEF_MAX]) or "(none)")
        first = next((m.content for m in exchange if m.role is Role.USER and m.content), "")
        close = self.skills.similar("", first, owner) if first else []
        if close:
            parts.append("Skills close to this task (patch one of these rather than create):")
            parts += [f"- {s.name}: {s.description}" for s in close]
        parts += ["", "The exchange:", _transcript(exchange)]
        return "\n".join(parts)


def _transcript(exchange: Sequence[ChatMessage], limit: int = 12_000) -> str:
    lines: list[str] = []
    for m in exchange:
        if m.role is Role.TOOL:
            lines.append(f"tool result: {_cut(m.content, 400)}")
            continue
        if m.content:
            lines.append(f"{m.role}: {_cut(m.content, 2_000)}")
        lines.extend(f"tool call: {c.name}({_cut(c.arguments, 300)})" for c in m.tool_calls)
    text = "\n".join(lines)
    return text if len(text) <= limit else "…" + text[-limit:]


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n] + "…"
