"""The Agent Skills format: a folder holding `SKILL.md` (YAML front matter + Markdown body)
and optional `references/`, `templates/`, `scripts/`, `assets/`.

Front matter: `name` (at most 64 characters: lowercase letters, digits and single hyphens)
and `description` (at most 1,024 characters) are required; `license`, `compatibility` and
`metadata` are optional; any other key is kept as it is (Hermes Agent adds its own).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

SKILL_FILE = "SKILL.md"
MAX_NAME = 64
MAX_DESCRIPTION = 1_024
MAX_COMPATIBILITY = 500
MAX_SKILL_CHARS = 100_000
"""`SKILL.md` at most this many characters."""
MAX_FILE_BYTES = 1024 * 1024
"""A supporting file at most this many bytes."""
SUPPORT_DIRS = ("references", "templates", "scripts", "assets")
"""Where supporting files live inside a skill folder."""

_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_FRONT = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|\Z)", re.DOTALL)


class SkillFormatError(ValueError):
    """A skill's text or name breaks the format; the message says what to fix."""


@dataclass(frozen=True, slots=True)
class SkillDoc:
    """A parsed `SKILL.md`."""

    name: str
    description: str
    body: str
    front: dict[str, Any] = field(default_factory=dict)
    """Every front-matter key, unknown ones included."""


def check_name(name: object) -> str:
    """`name` when it is a valid skill name, else SkillFormatError saying why."""
    if not isinstance(name, str) or not name:
        raise SkillFormatError("a skill needs a name: lowercase letters, digits and hyphens")
    if len(name) > MAX_NAME:
        raise SkillFormatError(f"skill name {name[:80]!r} is longer than {MAX_NAME} characters")
    if not _NAME.fullmatch(name):
        raise SkillFormatError(
            f"skill name {name[:80]!r} is not valid: use lowercase letters, digits and single "
            "hyphens (not at the start or end), like 'daily-briefing'"
        )
    return name


def check_category(category: object) -> str:
    """A category folder name: the same rules as a skill name."""
    try:
        return check_name(category)
    except SkillFormatError as err:
        raise SkillFormatError(f"category: {err}") from err


def parse_skill(text: str, *, expect_name: str | None = None) -> SkillDoc:
    """Parse and validate the text of a `SKILL.md`. Raises SkillFormatError.

    `expect_name`: the folder's name, which the front matter's `name` must equal.
    """
    if len(text) > MAX_SKILL_CHARS:
        raise SkillFormatError(
            f"SKILL.md has {len(text)} characters; at most {MAX_SKILL_CHARS} are allowed "
            "(move details into references/ files)"
        )
    match = _FRONT.match(text.lstrip("\ufeff"))
    if match is None:
        raise SkillFormatError(
            "SKILL.md must start with YAML front matter between '---' lines, holding at least "
            "'name' and 'description'"
        )
    try:
        front = yaml.safe_load(match.group(1))
    except yaml.YAMLError as err:
        raise SkillFormatError(f"the front matter is not valid YAML: {err}") from err
    if not isinstance(front, dict):
        raise SkillFormatError("the front matter must be a YAML mapping (key: value lines)")
    front = {str(k): v for k, v in front.items()}
    name = check_name(front.get("name"))
    if expect_name is not None and name != expect_name:
        raise SkillFormatError(
            f"the front matter names the skill {name!r} but its folder is {expect_name!r}; "
            "they must be the same"
        )
    description = front.get("description")
    if not isinstance(description, str) or not description.strip():
        raise SkillFormatError("the front matter needs a 'description': what the skill is for")
    if len(description) > MAX_DESCRIPTION:
        raise SkillFormatError(
            f"the description has {len(description)} characters; at most {MAX_DESCRIPTION}"
        )
    _check_optional(front)
    return SkillDoc(name, " ".join(description.split()), text[match.end() :], front)


def _check_optional(front: dict[str, Any]) -> None:
    for key in ("license", "compatibility"):
        value = front.get(key)
        if value is not None and not isinstance(value, str):
            raise SkillFormatError(f"'{key}' must be a string")
    compatibility = front.get("compatibility")
    if isinstance(compatibility, str) and len(compatibility) > MAX_COMPATIBILITY:
        raise SkillFormatError(f"'compatibility' is longer than {MAX_COMPATIBILITY} characters")
    metadata = front.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        # Values are strings in the standard; Hermes nests maps there, which is kept.
        raise SkillFormatError("'metadata' must be a mapping of keys to strings")


def render_skill(name: str, description: str, body: str, **extra: Any) -> str:
    """A `SKILL.md` text from its parts (front matter written by PyYAML)."""
    front: dict[str, Any] = {"name": name, "description": description, **extra}
    head = yaml.safe_dump(front, sort_keys=False, allow_unicode=True, width=1_000).strip()
    return f"---\n{head}\n---\n\n{body.strip()}\n"
