"""Moving an older install's state directory into the database (`herald state import`, and
at every start: cheap when there is nothing left to move).

Versions before this one kept the agent's files and skills in `state_dir`; now the database
holds them and `state_dir` is a cache. The import is idempotent and resumable: each memory
file is merged into its row (entries already there are not doubled), read back, and only
then deleted; each skill file is stored unless the database already has it (the skill
folders stay, as the cache). Files received and sent are moved by `gateway.media`'s import.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass, field
from pathlib import Path

from agent_core.memory import NO_OWNER, SOUL, FolderDocs
from gateway.store import Store
from gateway.store.memory_docs import SqlMemoryDocs
from gateway.store.skill_files import SkillMirror

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Imported:
    """What one import did: the files moved, and those left where they were, with why."""

    moved: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)


async def import_state(state_dir: Path, store: Store, *, skills: bool = True) -> Imported:
    """Move the memory files (and, with `skills`, store the skill files) of `state_dir`
    into `store`. Raises what the database raises (nothing is deleted then)."""
    out = Imported()
    await _import_memory(state_dir, store, out)
    if skills:
        out.moved += await SkillMirror(store, state_dir).import_local()
    return out


def _memory_files(state_dir: Path) -> list[tuple[str, str, Path]]:
    """(owner, name, path) of every memory file of the folder layout. Blocking."""
    docs = FolderDocs(state_dir)
    found: list[tuple[str, str, Path]] = []
    soul = docs.path(NO_OWNER, SOUL)
    if soul.is_file():
        found.append((NO_OWNER, SOUL, soul))
    root = state_dir / "memory"
    if root.is_dir():
        for folder in sorted(root.iterdir()):
            if not folder.is_dir() or folder.name.startswith("."):
                continue
            for name in ("user", "memory"):
                path = docs.path(folder.name, name)
                if path.is_file():
                    found.append((folder.name, name, path))
    return found


async def _import_memory(state_dir: Path, store: Store, out: Imported) -> None:
    docs = SqlMemoryDocs(store)
    for owner, name, path in await asyncio.to_thread(_memory_files, state_dir):
        text = await asyncio.to_thread(path.read_text, encoding="utf-8")
        shown = str(path.relative_to(state_dir))
        if owner == NO_OWNER:
            stored = await docs.get(owner, name)
            if stored.strip() and stored.strip() != text.strip():
                out.kept.append(
                    f"{shown}: the database holds another persona; this file is not read "
                    "(set it with `herald memory soul --set FILE`)"
                )
                continue
            if not stored.strip():
                await docs.edit(owner, name, functools.partial(_replaced, text))
        else:
            await docs.edit(owner, name, functools.partial(_union, local=text))
        if not _holds(await docs.get(owner, name), text):  # read back before deleting
            out.kept.append(f"{shown}: not found in the database after the import; kept")
            continue
        await asyncio.to_thread(path.unlink, missing_ok=True)
        out.moved.append(shown)


def _entries(text: str) -> list[str]:
    return [ln.removeprefix("- ").strip() for ln in text.splitlines() if ln.strip()]


def _replaced(text: str, _old: str) -> str:
    return text


def _union(stored: str, local: str) -> str:
    entries = _entries(stored)
    entries += [e for e in _entries(local) if e not in entries]
    return "".join(f"- {e}\n" for e in entries)


def _holds(stored: str, local: str) -> bool:
    """Whether every entry of the local file is in the stored text (SOUL.md: the whole)."""
    have = set(_entries(stored))
    return all(e in have for e in _entries(local)) if local.strip() else True
