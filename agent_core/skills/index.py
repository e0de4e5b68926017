"""The skills index in the system prompt: names and descriptions, grouped by category,
within a character budget (past it, how many more there are and where to see them)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

from agent_core.skills.model import Skill
from agent_core.skills.scanner import hidden_characters, strip_hidden

INDEX_HEADER = (
    "# Skills\n"
    "Saved procedures you can follow. When a request matches one, read it first with "
    "skill_view(name) and follow it; skills_list shows them all."
)
MAX_LINE_DESCRIPTION = 160
"""A description in the index is cut to this many characters (skill_view has it whole)."""
GENERAL = "general"


def build_index(skills: Sequence[Skill], max_chars: int) -> str:
    """The index text, at most `max_chars` characters ("" when there are no skills). Skills
    that are not usable, or whose name, category or description hide characters, are left
    out whatever the caller passed."""
    skills = [s for s in skills if s.usable and not _hides(s)]
    if not skills:
        return ""
    groups: dict[str, list[Skill]] = {}
    for skill in sorted(skills, key=lambda s: (s.category or GENERAL, s.name)):
        groups.setdefault(skill.category or GENERAL, []).append(skill)
    lines = [INDEX_HEADER]
    shown = 0
    for category, members in groups.items():
        heading = f"{category}:"
        for i, skill in enumerate(members):
            line = f"- {skill.name}: {_short(skill.description)}"
            extra = [heading, line] if i == 0 else [line]
            remaining = len(skills) - shown - 1
            tail = len(_more(remaining)) + 1 if remaining else 0
            if _length([*lines, *extra]) + tail > max_chars:
                return _finish(lines, len(skills) - shown, max_chars)
            lines.extend(extra)
            shown += 1
    return "\n".join(lines)


def _finish(lines: list[str], hidden: int, max_chars: int) -> str:
    text = "\n".join([*lines, _more(hidden)])
    return text if len(text) <= max_chars else _more(hidden)[:max_chars]


def _more(n: int) -> str:
    return f"(and {n} more skill{'s' if n != 1 else ''}: call skills_list to see them)"


def _length(lines: list[str]) -> int:
    return sum(len(line) for line in lines) + len(lines) - 1


def _hides(skill: Skill) -> bool:
    return bool(hidden_characters(f"{skill.name}{skill.category or ''}{skill.description}"))


def _short(description: str) -> str:
    text = " ".join(strip_hidden(description).split())
    if len(text) <= MAX_LINE_DESCRIPTION:
        return text
    return text[: MAX_LINE_DESCRIPTION - 1].rstrip() + "…"


_WORDS = re.compile(r"[a-z0-9]+")
_STOP = frozenset(
    {
        "a",
        "an",
        "and",
        "the",
        "of",
        "to",
        "for",
        "in",
        "on",
        "with",
        "by",
        "from",
        "or",
        "at",
        "is",
        "are",
        "be",
        "as",
        "it",
        "this",
        "that",
        "how",
        "when",
        "what",
        "your",
        "you",
        "my",
    }
)


def similar(name: str, description: str, skills: Sequence[Skill]) -> list[Skill]:
    """The skills whose name or description is close to these (near-duplicates)."""
    words = _words(description) | _words(name.replace("-", " "))
    out: list[Skill] = []
    for skill in skills:
        if skill.name == name:
            out.append(skill)
            continue
        ratio = difflib.SequenceMatcher(None, name, skill.name).ratio()
        theirs = _words(skill.description) | _words(skill.name.replace("-", " "))
        overlap = len(words & theirs) / max(1, min(len(words), len(theirs)))
        if ratio >= 0.7 or (len(words & theirs) >= 3 and overlap >= 0.5):
            out.append(skill)
    return out


def _words(text: str) -> set[str]:
    return {w for w in _WORDS.findall(text.lower()) if w not in _STOP and len(w) > 2}
