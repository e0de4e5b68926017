"""The skills tools, named as Hermes Agent names them: `skills_list`, `skill_view`,
`skill_manage`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent_core.skills.format import SkillFormatError
from agent_core.skills.model import SkillAction, SkillError
from agent_core.skills.service import Actor, Author, Request, Skills
from agent_core.skills.store import supporting_files
from agent_core.tools.base import ToolContext, ToolError, str_arg
from gateway.contracts.ids import SessionKey, UserId

OwnerOf = Callable[[SessionKey | None, UserId | None], str | None]
"""The memory owner of a session (MemoryFiles.owner): whose personal skills it sees."""


def owner_of_call(owner_of: OwnerOf, ctx: ToolContext) -> str | None:
    """The memory owner a tool call acts for."""
    return owner_of(None if ctx.session is None else ctx.session.key, ctx.user_id)


class SkillsListTool:
    """Lists the skills this session may use."""

    name = "skills_list"
    description = (
        "List the saved skills (procedures) you can use: name, category and description. "
        "Give `category` to list one category only."
    )
    schema: dict[str, Any] = {  # noqa: RUF012 - read-only schema
        "type": "object",
        "properties": {"category": {"type": "string", "description": "only this category"}},
    }

    def __init__(self, skills: Skills, owner_of: OwnerOf) -> None:
        self.skills = skills
        self.owner_of = owner_of

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments."""
        return self.schema

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> str:
        """The skills, one a line."""
        category = str_arg(args, "category", required=False) or None
        owner = owner_of_call(self.owner_of, ctx)
        await self.skills.refresh()
        found = [
            s
            for s in self.skills.store.visible(owner)
            if category is None or (s.category or "general") == category
        ]
        if not found:
            return "no skills" + (f" in category {category!r}" if category else "")
        return "\n".join(
            f"- {s.name} [{s.category or 'general'}; {s.source}]: {s.description}" for s in found
        )


class SkillViewTool:
    """Shows a skill's `SKILL.md` or one of its supporting files."""

    name = "skill_view"
    description = (
        "Read a skill: the whole SKILL.md, or with `file_path` one of its supporting files "
        "(references/, templates/, scripts/, assets/). Read a skill before following or "
        "changing it."
    )
    schema: dict[str, Any] = {  # noqa: RUF012 - read-only schema
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "file_path": {"type": "string", "description": "a supporting file, relative"},
        },
        "required": ["name"],
    }

    def __init__(self, skills: Skills, owner_of: OwnerOf, viewed: set[str] | None = None) -> None:
        self.skills = skills
        self.owner_of = owner_of
        self.viewed = viewed
        """Names viewed so far (the review may change only those)."""

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments."""
        return self.schema

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> str:
        """The file's text; SKILL.md ends with the list of supporting files."""
        name = str_arg(args, "name")
        file_path = str_arg(args, "file_path", required=False) or None
        await self.skills.refresh()
        try:
            skill = self.skills.store.find(name, owner_of_call(self.owner_of, ctx))
            text = self.skills.store.read(skill, file_path)
        except (SkillError, SkillFormatError) as err:
            raise ToolError(str(err)) from err
        if self.viewed is not None:
            self.viewed.add(skill.name)
        if file_path:
            return text
        files = supporting_files(skill.path)
        if files:
            text += "\n\n[supporting files: " + ", ".join(files) + "]"
        return text


class SkillManageTool:
    """Creates, changes and deletes the skills of the session's person (or group)."""

    name = "skill_manage"
    description = (
        "Save or improve a skill (a reusable procedure), only once it has been shown to work. "
        "action 'create': `content` is the whole SKILL.md (front matter with name and "
        "description, then the steps), optional `category`; 'patch': replace `old_string` by "
        "`new_string` (in SKILL.md, or in `file_path`); 'edit': `content` replaces SKILL.md; "
        "'delete': remove the skill; 'write_file' / 'remove_file': a supporting file at "
        "`file_path` under references/, templates/, scripts/ or assets/ (`file_content`). "
        "Names: lowercase letters, digits, hyphens."
    )
    schema: dict[str, Any] = {  # noqa: RUF012 - read-only schema
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": [str(a) for a in SkillAction]},
            "name": {"type": "string"},
            "content": {"type": "string"},
            "category": {"type": "string"},
            "file_path": {"type": "string"},
            "file_content": {"type": "string"},
            "old_string": {"type": "string"},
            "new_string": {"type": "string"},
        },
        "required": ["action", "name"],
    }

    def __init__(
        self,
        skills: Skills,
        owner_of: OwnerOf,
        *,
        author: Author = Author.AGENT,
        viewed: set[str] | None = None,
    ) -> None:
        self.skills = skills
        self.owner_of = owner_of
        self.author = author
        self.viewed = viewed
        """When set, only skills viewed first may be changed (the review)."""

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments."""
        return self.schema

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> str:
        """Apply (or hold for approval) one write; ToolError when refused, nothing written."""
        try:
            action = SkillAction(str_arg(args, "action"))
        except ValueError as err:
            raise ToolError(
                "action must be one of " + ", ".join(str(a) for a in SkillAction)
            ) from err
        name = str_arg(args, "name")
        if self.viewed is not None and action is not SkillAction.CREATE and name not in self.viewed:
            raise ToolError(f"view skill {name!r} with skill_view before changing it")
        if action is not SkillAction.CREATE and shared_chat(ctx) and not ctx.operator:
            # A group's skills are everyone's there, and who made one is not recorded: only
            # an operator (with nobody else's words in the turn) changes an existing one.
            raise ToolError(
                f"in a group chat only Herald's operator changes an existing skill; {name!r} "
                "stays as it is. Create a skill with another name instead"
            )
        request = Request(
            action,
            name,
            content=_opt(args, "content"),
            category=_opt(args, "category"),
            file_path=_opt(args, "file_path"),
            file_content=_opt(args, "file_content"),
            old_string=_opt(args, "old_string"),
            new_string=_opt(args, "new_string"),
        )
        actor = Actor(
            owner_of_call(self.owner_of, ctx),
            self.author,
            operator=ctx.operator and self.author is Author.AGENT,
            session_id=None if ctx.session is None else ctx.session.id,
        )
        try:
            return await self.skills.manage(request, actor)
        except (SkillError, SkillFormatError) as err:
            raise ToolError(str(err)) from err


def shared_chat(ctx: ToolContext) -> bool:
    """Whether the call comes from a group's shared session (no one person's)."""
    return ctx.group and ctx.user_id is None


def _opt(args: dict[str, Any], name: str) -> str | None:
    if args.get(name) is None:
        return None
    return str_arg(args, name)
