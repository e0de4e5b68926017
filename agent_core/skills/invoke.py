"""`/<skill-name> text` in chat: the turn's user message carries the skill's text."""

from __future__ import annotations

import re

from agent_core.skills.model import SkillError
from agent_core.skills.service import Skills
from agent_core.skills.store import supporting_files

_COMMAND = re.compile(r"\A\s*/([A-Za-z0-9_-]{1,64})(?:@\S+)?(?:[ \t]+|\n|\Z)")
MENU_MAX = 100
"""Telegram shows at most 100 commands."""


def command_name(skill_name: str) -> str:
    """How a skill is written as a command in menus (Telegram allows no hyphens)."""
    return skill_name.replace("-", "_")[:32]


def invocation(skills: Skills, text: str, owner: str | None) -> str | None:
    """The user message for `/<skill> rest` when such a skill is visible to `owner`, else
    None (the text is an ordinary message). `_` stands for `-` (menu commands)."""
    match = _COMMAND.match(text)
    if match is None:
        return None
    wanted = match.group(1).lower().replace("_", "-")
    try:
        skill = skills.store.find(wanted, owner)
        body = skills.store.read(skill)
    except (SkillError, ValueError):
        return None
    rest = text[match.end() :].strip()
    files = supporting_files(skill.path)
    lines = [
        f'[The person invoked the skill "{skill.name}". Follow it for this request.]',
        "",
        f'<skill name="{skill.name}">',
        body.strip(),
        "</skill>",
    ]
    if files:
        lines.append(f"(supporting files, read with skill_view: {', '.join(files)})")
    lines += ["", rest or "(no further text: start the procedure)"]
    return "\n".join(lines)


def menu(skills: Skills) -> list[tuple[str, str]]:
    """(command, description) of the shared skills, for a platform's command menu. Personal
    skills are left out: a menu is the same for everyone who talks to the bot."""
    out: list[tuple[str, str]] = []
    for skill in skills.store.visible(None):
        description = " ".join(skill.description.split())
        out.append(
            (command_name(skill.name), description[:253] + ("…" if len(description) > 253 else ""))
        )
    return out[:MENU_MAX]
