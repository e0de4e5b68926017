"""The agent's files: SOUL.md (persona), and per user USER.md and MEMORY.md (size-capped)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from pathlib import Path
from urllib.parse import quote

from gateway.contracts.ids import UserId

SHARED_SCOPE = "_shared"


class MemoryScope(StrEnum):
    """Which file a memory edit goes to."""

    USER = "user"
    """USER.md: who the person is and what they prefer."""
    MEMORY = "memory"
    """MEMORY.md: the agent's own notes about ongoing work."""


class MemoryEditError(ValueError):
    """A memory edit was refused; the message tells the model what to do instead."""


@dataclass(frozen=True, slots=True)
class MemoryLimits:
    """Size caps, in characters, of each file."""

    user_max_chars: int = 4_000
    memory_max_chars: int = 8_000


class MemoryFiles:
    """Reads and edits the memory files under `root` (the state directory).

    Layout: `SOUL.md`, and `memory/<user>/USER.md` + `memory/<user>/MEMORY.md`. A file holds one
    entry per line, written as a Markdown list item. Writes are atomic (temp file + rename),
    and edits are serialized across processes (a lock file), so instances sharing a state
    directory never lose each other's edits.
    """

    def __init__(self, root: Path, limits: MemoryLimits = MemoryLimits()) -> None:
        self.root = root
        self.limits = limits
        self._lock = asyncio.Lock()
        self._soul: tuple[tuple[int, int, int] | None, str] | None = None

    def soul(self) -> str:
        """SOUL.md, or the built-in default persona when the file is absent or empty.

        Read again only when the file's inode, size or modification time changed: every turn
        asks for it, and an edit (or a replacement by rename) shows on the next turn.
        """
        path = self.root / "SOUL.md"
        try:
            st = path.stat()
            stamp: tuple[int, int, int] | None = (st.st_ino, st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            stamp = None
        if self._soul is not None and self._soul[0] == stamp:
            return self._soul[1]
        try:
            text = path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            text = ""
        if not text:
            default = resources.files("agent_core").joinpath("default_soul.md")
            text = default.read_text("utf-8").strip()
        self._soul = (stamp, text)
        return text

    def path(self, scope: MemoryScope, user_id: UserId | None) -> Path:
        """Where the file of `scope` for `user_id` lives."""
        # One-to-one and path-safe: every user folder has a prefix the shared one lacks.
        folder = "u-" + quote(user_id, safe="") if user_id else SHARED_SCOPE
        name = "USER.md" if scope is MemoryScope.USER else "MEMORY.md"
        return self.root / "memory" / folder / name

    def read(self, scope: MemoryScope, user_id: UserId | None) -> str:
        """The file's text ("" when it does not exist yet)."""
        try:
            return self.path(scope, user_id).read_text(encoding="utf-8")
        except FileNotFoundError:
            return ""

    async def snapshot(self, user_id: UserId | None) -> tuple[str, str]:
        """(USER.md, MEMORY.md) as they are now; taken when a session starts."""
        return self.read(MemoryScope.USER, user_id), self.read(MemoryScope.MEMORY, user_id)

    async def add(self, scope: MemoryScope, user_id: UserId | None, entry: str) -> str:
        """Append an entry. Raises MemoryEditError when empty, duplicate or over the cap."""
        entry = _one_line(entry)
        async with self._exclusive():
            entries = self._entries(scope, user_id)
            if entry in entries:
                raise MemoryEditError("that entry is already saved")
            entries.append(entry)
            self._write(scope, user_id, entries)
        return f"saved to {scope}"

    async def replace(self, scope: MemoryScope, user_id: UserId | None, old: str, new: str) -> str:
        """Replace the one entry containing `old` by `new`."""
        new = _one_line(new)
        async with self._exclusive():
            entries = self._entries(scope, user_id)
            index = _find(entries, old)
            entries[index] = new
            self._write(scope, user_id, entries)
        return f"replaced in {scope}"

    async def remove(self, scope: MemoryScope, user_id: UserId | None, old: str) -> str:
        """Remove the one entry containing `old`."""
        async with self._exclusive():
            entries = self._entries(scope, user_id)
            del entries[_find(entries, old)]
            self._write(scope, user_id, entries)
        return f"removed from {scope}"

    async def merge(self, source: UserId, into: UserId) -> None:
        """Move `source`'s entries into `into`'s files (no duplicates; caps not enforced, so
        nothing is lost) and delete `source`'s folder. Used when two identities are linked."""
        async with self._exclusive():
            for scope in MemoryScope:
                moved = self._entries(scope, source)
                if not moved:
                    continue
                entries = self._entries(scope, into)
                entries.extend(e for e in moved if e not in entries)
                self._write(scope, into, entries, enforce_cap=False)
            folder = self.path(MemoryScope.USER, source).parent
            for scope in MemoryScope:
                self.path(scope, source).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                folder.rmdir()

    @contextlib.asynccontextmanager
    async def _exclusive(self) -> AsyncIterator[None]:
        """One editor at a time, across tasks and across processes sharing the state
        directory (several instances): a read-modify-write never loses another's edit."""
        async with self._lock:
            lock_path = self.root / "memory" / ".lock"
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            with lock_path.open("ab") as handle:
                # Waiting for another process happens off the event loop.
                await asyncio.to_thread(fcntl.flock, handle.fileno(), fcntl.LOCK_EX)
                yield  # closing the file releases the lock

    def _entries(self, scope: MemoryScope, user_id: UserId | None) -> list[str]:
        lines = self.read(scope, user_id).splitlines()
        return [ln.removeprefix("- ").strip() for ln in lines if ln.strip()]

    def _write(
        self,
        scope: MemoryScope,
        user_id: UserId | None,
        entries: list[str],
        *,
        enforce_cap: bool = True,
    ) -> None:
        text = "".join(f"- {e}\n" for e in entries)
        cap = (
            self.limits.user_max_chars
            if scope is MemoryScope.USER
            else self.limits.memory_max_chars
        )
        if enforce_cap and len(text) > cap:
            raise MemoryEditError(
                f"{scope} memory is full ({len(text)} of {cap} characters); "
                "replace or remove an entry first"
            )
        path = self.path(scope, user_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)


def _one_line(entry: str) -> str:
    entry = " ".join(entry.split())
    if not entry:
        raise MemoryEditError("the entry is empty")
    return entry


def _find(entries: list[str], needle: str) -> int:
    needle = " ".join(needle.split())
    if not needle:
        raise MemoryEditError("say which entry: give a part of its text")
    hits = [i for i, e in enumerate(entries) if needle in e]
    if not hits:
        raise MemoryEditError(f"no entry contains {needle!r}")
    if len(hits) > 1:
        raise MemoryEditError(f"{len(hits)} entries contain {needle!r}; give more of the text")
    return hits[0]
