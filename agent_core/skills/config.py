"""The `skills` config section."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from agent_core.skills.service import SkillSettings
from gateway.contracts.config import Section


class SkillsConfig(Section):
    """Skills: procedures the agent reads, follows, writes and improves."""

    enabled: bool = True
    """False: no skills tools, no index, no review."""
    dirs: tuple[Path, ...] = ()
    """Extra read-only folders of skills (scanned before use), shared by everyone."""
    index_max_chars: int = Field(default=3_000, ge=200, le=100_000)
    """The skills index in the system prompt is at most this long."""
    self_improve: bool = True
    """After a turn with many tool calls, a background review may save or improve a skill."""
    review_after_tool_calls: int = Field(default=8, ge=1, le=1_000)
    review_max_iterations: int = Field(default=8, ge=1, le=50)
    review_timeout: float = Field(default=120.0, gt=0)
    write_approval: bool = False
    """The agent's skill writes wait for `herald skills approve` (or `reject`)."""
    bundled: bool = True
    """Install Herald's bundled skills into the state directory (false: none)."""

    def settings(self) -> SkillSettings:
        """The knobs the agent core reads."""
        return SkillSettings(
            index_max_chars=self.index_max_chars,
            self_improve=self.self_improve,
            review_after_tool_calls=self.review_after_tool_calls,
            write_approval=self.write_approval,
            review_max_iterations=self.review_max_iterations,
            review_timeout=self.review_timeout,
        )
