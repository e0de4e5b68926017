"""The vocabulary of skills: where a skill comes from, a change to one, and the write
journal (every write recorded in SQL: who, when, which turn, the diff)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from gateway.contracts.ids import SessionId


class SkillSource(StrEnum):
    """Where a skill lives, which says who may see and change it."""

    BUNDLED = "bundled"
    """Shipped with Herald, installed into `<state_dir>/skills/`; shared by everyone."""
    OPERATOR = "operator"
    """Put into `<state_dir>/skills/` by the operator (or shared by them); shared."""
    EXTERNAL = "external"
    """From a read-only folder of `skills.dirs`; shared."""
    PERSONAL = "personal"
    """Written by the agent in a person's (or a group's) conversation; only theirs."""


class SkillAction(StrEnum):
    """What `skill_manage` (or the CLI) does."""

    CREATE = "create"
    PATCH = "patch"
    EDIT = "edit"
    DELETE = "delete"
    WRITE_FILE = "write_file"
    REMOVE_FILE = "remove_file"


class WriteStatus(StrEnum):
    """A recorded write's state."""

    APPLIED = "applied"
    PENDING = "pending"
    """Waiting for `herald skills approve|reject` (`skills.write_approval`)."""
    APPROVED = "approved"
    REJECTED = "rejected"


class SkillError(Exception):
    """A skill operation was refused; the message says what to do instead."""


class SkillNotFound(SkillError, LookupError):
    """No skill (or file) of that name is visible here."""


@dataclass(frozen=True, slots=True)
class Skill:
    """One skill folder as discovered, valid or not."""

    name: str
    description: str
    source: SkillSource
    path: Path
    """The skill's folder."""
    category: str | None = None
    owner: str | None = None
    """The memory owner of a personal skill (`u-<user>` / `g-<chat>`); None when shared."""
    front: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None
    """Why it fails validation (it is then never shown to the model)."""
    quarantine: str | None = None
    """Why the scanner flagged or refused it (it is then never shown to the model)."""
    refused: bool = False
    """The scanner refused it outright: hidden characters, or a file it cannot read."""

    @property
    def verdict(self) -> str:
        """`invalid` (fails validation), else the scanner's: `refused`, `flagged` or `ok`."""
        if self.problem is not None:
            return "invalid"
        if self.quarantine is not None:
            return "refused" if self.refused else "flagged"
        return "ok"

    @property
    def usable(self) -> bool:
        """Valid and not quarantined: the model may see it."""
        return self.problem is None and self.quarantine is None

    @property
    def shared(self) -> bool:
        """Seen by everyone (bundled, operator or external)."""
        return self.source is not SkillSource.PERSONAL


@dataclass(frozen=True, slots=True)
class SkillChange:
    """One write to a skill, not yet applied: the text before and after of one file."""

    action: SkillAction
    skill: str
    owner: str | None
    """Whose skill folder (None: the shared `<state_dir>/skills/`)."""
    file_path: str
    """Relative to the skill folder: `SKILL.md` or a supporting file."""
    before: str | None
    after: str | None
    """None: the file (for `delete`, the whole skill) goes away."""
    category: str | None = None

    def diff(self) -> str:
        """A unified diff of the change."""
        label = f"{self.skill}/{self.file_path}"
        lines = difflib.unified_diff(
            (self.before or "").splitlines(keepends=True),
            (self.after or "").splitlines(keepends=True),
            fromfile="/dev/null" if self.before is None else f"a/{label}",
            tofile="/dev/null" if self.after is None else f"b/{label}",
        )
        return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


@dataclass(frozen=True, slots=True)
class SkillWrite:
    """A recorded write: the change, who asked for it, when, and its state."""

    change: SkillChange
    author: str
    """`agent` (a turn), `review` (the background review), `operator` (the CLI)."""
    status: WriteStatus
    session_id: SessionId | None = None
    id: int | None = None
    turn_id: int | None = None
    created_at: datetime | None = None
    decided_at: datetime | None = None


class SkillJournal(Protocol):
    """Where skill writes are recorded (SQL; `gateway/store/skills.py`)."""

    async def record(self, write: SkillWrite) -> int:
        """Store `write` (with its diff and the session's latest turn); return its id."""
        ...

    async def writes(
        self, *, status: WriteStatus | None = None, skill: str | None = None, limit: int = 100
    ) -> list[SkillWrite]:
        """Recorded writes, newest first, filtered by status and skill name."""
        ...

    async def get(self, write_id: int) -> SkillWrite:
        """One write. Raises LookupError when there is none of that id."""
        ...

    async def decide(self, write_id: int, status: WriteStatus) -> bool:
        """Mark a pending write approved or rejected; False when it was not pending."""
        ...
