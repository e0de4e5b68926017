"""Skills as the agent and the operator use them: the index, changes checked against who
may make them, the scanner and the size caps, then applied or held for approval, and every
write recorded."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from enum import StrEnum

from agent_core.skills.format import (
    MAX_FILE_BYTES,
    SKILL_FILE,
    SkillDoc,
    SkillFormatError,
    check_category,
    check_name,
    parse_skill,
)
from agent_core.skills.index import build_index, similar
from agent_core.skills.model import (
    Skill,
    SkillAction,
    SkillChange,
    SkillError,
    SkillJournal,
    SkillNotFound,
    SkillSource,
    SkillWrite,
    WriteStatus,
)
from agent_core.skills.scanner import Finding, scan_skill, scan_text
from agent_core.skills.store import SkillStore, inside, support_path, supporting_files
from agent_core.skills.sync import NoSync, SkillSync
from gateway.contracts.ids import SessionId

logger = logging.getLogger(__name__)


class Author(StrEnum):
    """Who asks for a write."""

    AGENT = "agent"
    """The agent, during a turn."""
    REVIEW = "review"
    """The background review after a turn."""
    OPERATOR = "operator"
    """The operator, through `herald skills`."""


@dataclass(frozen=True, slots=True)
class SkillSettings:
    """The `skills` knobs the agent core needs."""

    index_max_chars: int = 3_000
    self_improve: bool = True
    review_after_tool_calls: int = 8
    write_approval: bool = False
    review_max_iterations: int = 8
    review_timeout: float = 120.0


@dataclass(frozen=True, slots=True)
class Request:
    """One `skill_manage` call's arguments."""

    action: SkillAction
    name: str
    content: str | None = None
    category: str | None = None
    file_path: str | None = None
    file_content: str | None = None
    old_string: str | None = None
    new_string: str | None = None


@dataclass(frozen=True, slots=True)
class Actor:
    """Who a write acts for: the memory owner whose skills it may change, and how."""

    owner: str | None
    author: Author
    operator: bool = False
    """A session of someone who operates Herald (may change operator and bundled skills)."""
    session_id: SessionId | None = None


class Skills:
    """The skills of one Herald: its store, its journal and its settings."""

    def __init__(
        self,
        store: SkillStore,
        journal: SkillJournal | None = None,
        settings: SkillSettings = SkillSettings(),
        sync: SkillSync | None = None,
    ) -> None:
        self.store = store
        self.journal = journal
        self.settings = settings
        self.sync: SkillSync = sync or NoSync()

    async def refresh(self) -> None:
        """Bring the local skill folders up to date with the database (see `SkillSync`).
        Never raises (but for cancellation): when the database cannot be read, the local
        copy is used and the failure logged."""
        try:
            await self.sync.refresh()
        except Exception as err:
            logger.warning("skills not refreshed (the local copy is used): %s", err)

    def index(self, owner: str | None) -> str:
        """The budgeted index of what a session of `owner` may use."""
        return build_index(self.store.visible(owner), self.settings.index_max_chars)

    def similar(self, name: str, description: str, owner: str | None) -> list[Skill]:
        """Visible skills close to this name or description."""
        return similar(name, description, self.store.visible(owner))

    # changes ----------------------------------------------------------------------------

    async def manage(self, request: Request, actor: Actor) -> str:
        """Plan, check and apply (or hold) one write; a sentence saying what happened.
        Raises SkillError (SkillFormatError is turned into it) with nothing written."""
        async with self.sync.writing():
            return await self._manage(request, actor)

    async def _manage(self, request: Request, actor: Actor) -> str:
        try:  # reading and scanning up to a megabyte of text: off the event loop
            change, skill = await asyncio.to_thread(self.plan, request, actor)
        except SkillFormatError as err:
            raise SkillError(str(err)) from err
        held = self.settings.write_approval and actor.author is not Author.OPERATOR
        if held:
            if self.journal is None:
                raise SkillError("skill writes need approval, but there is no journal to hold them")
            write_id = await self.journal.record(
                SkillWrite(change, str(actor.author), WriteStatus.PENDING, actor.session_id)
            )
            return (
                f"{change.action} of skill {change.skill!r} is waiting for the operator's "
                f"approval (write #{write_id}); it takes effect once approved"
            )
        self.store.apply(change, skill)
        await self._record(
            SkillWrite(change, str(actor.author), WriteStatus.APPLIED, actor.session_id)
        )
        return _done(change)

    async def _record(self, write: SkillWrite) -> None:
        if self.journal is None:
            return
        try:
            await self.journal.record(write)
        except Exception:  # the file is written; a lost record must not undo a reply
            logger.exception("skill write of %s could not be recorded", write.change.skill)

    def plan(self, request: Request, actor: Actor) -> tuple[SkillChange, Skill | None]:
        """The change a request makes, checked; (change, the skill it changes)."""
        name = check_name(request.name)
        if request.action is SkillAction.CREATE:
            return self._plan_create(request, actor), None
        skill = self._writable(name, actor)
        if request.action is SkillAction.DELETE:
            before = self.store.read(skill)
            return _change(request, skill, SKILL_FILE, before, None), skill
        if request.action is SkillAction.EDIT:
            content = _required(request.content, "content", "the whole new SKILL.md")
            self._check_skill_text(content, name)
            return _change(request, skill, SKILL_FILE, self.store.read(skill), content), skill
        if request.action is SkillAction.PATCH:
            return self._plan_patch(request, actor, skill), skill
        rel = support_path(_required(request.file_path, "file_path", "like references/notes.md"))
        inside(skill.path, rel)
        current = self._current(skill, rel)
        if request.action is SkillAction.WRITE_FILE:
            text = _required(request.file_content, "file_content", "the file's text")
            if len(text.encode("utf-8")) > MAX_FILE_BYTES:
                raise SkillError(f"a supporting file may hold at most {MAX_FILE_BYTES} bytes")
            _scan(text, rel)
            return _change(request, skill, rel, current, text), skill
        if current is None:
            files = ", ".join(supporting_files(skill.path)) or "none"
            raise SkillNotFound(f"skill {name!r} has no file {rel!r} (its files: {files})")
        return _change(request, skill, rel, current, None), skill

    def _plan_create(self, request: Request, actor: Actor) -> SkillChange:
        content = _required(request.content, "content", "the whole SKILL.md, front matter first")
        if actor.owner is None and actor.author is not Author.OPERATOR:
            raise SkillError(
                "this conversation belongs to no known person or group, so no skill can be "
                "saved from it"
            )
        category = check_category(request.category) if request.category else None
        doc = self._check_skill_text(content, request.name)
        taken = [s for s in self._all_for(actor.owner) if s.name == request.name]
        if taken:
            raise SkillError(
                f"a skill named {request.name!r} exists already; view it and patch or edit it "
                "instead, or choose another name"
            )
        if actor.author is Author.REVIEW:
            close = self.similar(doc.name, doc.description, actor.owner)
            if close:
                names = "; ".join(f"{s.name}: {s.description[:120]}" for s in close)
                raise SkillError(
                    f"similar skills exist ({names}). Do not add a near-duplicate: view the "
                    "closest one you wrote and patch it instead"
                )
        return SkillChange(
            SkillAction.CREATE, request.name, actor.owner, SKILL_FILE, None, content, category
        )

    def _plan_patch(self, request: Request, actor: Actor, skill: Skill) -> SkillChange:
        old = _required(request.old_string, "old_string", "the exact text to replace")
        new = request.new_string
        if new is None:
            raise SkillError("missing argument 'new_string' (the text to put instead)")
        rel = support_path(request.file_path) if request.file_path else SKILL_FILE
        before = self.store.read(skill, rel)
        count = before.count(old) if old else 0
        if count == 0:
            raise SkillError(
                f"old_string was not found in {rel}; view the skill and copy it exactly"
            )
        if count > 1:
            raise SkillError(f"old_string appears {count} times in {rel}; include more context")
        after = before.replace(old, new, 1)
        if rel == SKILL_FILE:
            self._check_skill_text(after, skill.name)
        else:
            _scan(after, rel)
        return _change(request, skill, rel, before, after)

    def _check_skill_text(self, content: str, name: str) -> SkillDoc:
        doc = parse_skill(content, expect_name=name)
        _refuse(scan_skill(content, doc.front))
        return doc

    def _current(self, skill: Skill, rel: str) -> str | None:
        try:
            return self.store.read(skill, rel)
        except SkillNotFound:
            return None

    def _all_for(self, owner: str | None) -> list[Skill]:
        found = self.store.shared()
        if owner:
            found.extend(self.store.personal(owner))
        return found

    def _writable(self, name: str, actor: Actor) -> Skill:
        """The skill of that name the actor may change. Raises SkillError / SkillNotFound."""
        if actor.author is Author.OPERATOR:
            mine = self.store.personal(actor.owner) if actor.owner else []
            for skill in [*mine, *self.store.shared()]:
                if skill.name == name and skill.source is not SkillSource.EXTERNAL:
                    if actor.owner is None and skill.source is SkillSource.PERSONAL:
                        continue
                    return skill
            raise SkillNotFound(f"there is no skill named {name!r} in the state directory")
        skill = self.store.find(name, actor.owner)
        if skill.source is SkillSource.PERSONAL and skill.owner == actor.owner:
            return skill
        if skill.source is SkillSource.EXTERNAL:
            raise SkillError(f"skill {name!r} comes from a read-only folder (skills.dirs)")
        if actor.author is Author.AGENT and actor.operator:
            return skill
        raise SkillError(
            f"skill {name!r} is a {skill.source} skill shared by everyone; only the operator "
            "changes it. Create a skill of your own with another name instead"
        )

    async def share(self, owner: str, name: str) -> Skill:
        """Move `owner`'s skill `name` into the shared skills (the operator's decision: it
        may carry that person's data). Raises SkillError / SkillNotFound."""
        async with self.sync.writing():
            return await self._share(owner, name)

    async def _share(self, owner: str, name: str) -> Skill:
        check_name(name)
        matches = [s for s in self.store.personal(owner) if s.name == name]
        if not matches:
            raise SkillNotFound(f"{owner} has no skill named {name!r}")
        skill = matches[0]
        if not skill.usable:
            raise SkillError(
                f"skill {name!r} cannot be shared: {skill.problem or skill.quarantine}"
            )
        if any(s.name == name for s in self.store.shared()):
            raise SkillError(f"a shared skill named {name!r} exists already")
        target = self.store.folder_for(name, None, skill.category)
        self.store.move(skill.path, target)
        shared = next(s for s in self.store.shared() if s.name == name)
        text = self.store.read(shared)
        change = SkillChange(SkillAction.CREATE, name, None, SKILL_FILE, None, text, skill.category)
        await self._record(SkillWrite(change, str(Author.OPERATOR), WriteStatus.APPLIED))
        return shared

    # approval ---------------------------------------------------------------------------

    async def approve(self, write_id: int) -> str:
        """Apply a pending write and mark it approved. Raises SkillError / LookupError."""
        async with self.sync.writing():
            return await self._approve(write_id)

    async def _approve(self, write_id: int) -> str:
        journal = self._journal()
        write = await journal.get(write_id)
        if write.status is not WriteStatus.PENDING:
            raise SkillError(f"write #{write_id} is {write.status}, not pending")
        change = write.change
        skill = None
        if change.action is not SkillAction.CREATE:
            matches = [s for s in self._all_for(change.owner) if s.name == change.skill]
            if not matches:
                raise SkillNotFound(f"skill {change.skill!r} is gone; reject write #{write_id}")
            skill = matches[0]
        if change.file_path == SKILL_FILE and change.after is not None:
            try:  # held before the scanner learnt more: checked again
                self._check_skill_text(change.after, change.skill)
            except SkillFormatError as err:
                raise SkillError(f"{err}; reject write #{write_id}") from err
        elif change.after is not None:
            _scan(change.after, change.file_path)
        self.store.apply(change, skill)
        await journal.decide(write_id, WriteStatus.APPROVED)
        return _done(change)

    async def reject(self, write_id: int) -> None:
        """Mark a pending write rejected (nothing is written)."""
        if not await self._journal().decide(write_id, WriteStatus.REJECTED):
            raise SkillError(f"write #{write_id} is not pending")

    def _journal(self) -> SkillJournal:
        if self.journal is None:
            raise SkillError("no skill journal is configured")
        return self.journal


def _required(value: str | None, name: str, hint: str) -> str:
    if value is None or value == "":
        raise SkillError(f"missing argument {name!r} ({hint})")
    return value


def _scan(text: str, where: str) -> None:
    _refuse(scan_text(text, where))


def _refuse(findings: list[Finding]) -> None:
    """Raise SkillError naming the findings, if there are any."""
    if any(f.refused for f in findings):
        raise SkillError(
            "refused: the text holds characters a reader cannot see ("
            + "; ".join(str(f) for f in findings)
            + "); write it again in plain visible text"
        )
    if findings:
        raise SkillError(
            "refused: the text looks like prompt injection or exfiltration ("
            + "; ".join(str(f) for f in findings)
            + "); write the procedure without it"
        )


def _change(
    request: Request,
    skill: Skill,
    rel: str,
    before: str | None,
    after: str | None,
) -> SkillChange:
    owner = skill.owner if skill.source is SkillSource.PERSONAL else None
    return SkillChange(request.action, skill.name, owner, rel, before, after, skill.category)


def _done(change: SkillChange) -> str:
    verbs = {
        SkillAction.CREATE: "created",
        SkillAction.PATCH: "patched",
        SkillAction.EDIT: "replaced",
        SkillAction.DELETE: "deleted",
        SkillAction.WRITE_FILE: f"wrote {change.file_path} of",
        SkillAction.REMOVE_FILE: f"removed {change.file_path} from",
    }
    return f"{verbs[change.action]} skill {change.skill!r}"
