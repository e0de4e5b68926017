"""Helpers of the skills tests: skill texts and folders."""

from __future__ import annotations

from pathlib import Path

from agent_core.skills.format import render_skill


def skill_text(name: str, description: str = "", body: str = "1. Do the thing.") -> str:
    """A valid SKILL.md."""
    return render_skill(name, description or f"How to {name.replace('-', ' ')}.", body)


def make_skill(root: Path, name: str, description: str = "", body: str = "1. Do it.") -> Path:
    """A skill folder `root/name` holding a valid SKILL.md; returns the folder."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "SKILL.md").write_text(skill_text(name, description, body), encoding="utf-8")
    return folder


def tree(root: Path) -> dict[str, str]:
    """Every file under `root` (relative path → text), to check nothing changed."""
    if not root.exists():
        return {}
    return {
        p.relative_to(root).as_posix(): p.read_text(encoding="utf-8", errors="replace")
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }
