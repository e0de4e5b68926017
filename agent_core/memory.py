"""The agent's files: SOUL.md (persona), and per memory scope USER.md and MEMORY.md.

A memory scope is a person (their Herald user, shared by linked identities) or, for a
session that belongs to no one person, its group chat: each group has its own files, never
shared with another group or with the people in it. A session with neither (a stateless call,
a job without an owner) has no memory at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import NewType
from urllib.parse import quote

from gateway.contracts.ids import SessionKey, UserId

MemoryOwner = NewType("MemoryOwner", str)
"""Whose memory files: `u-<user>` for a person, `g-<chat>` for a group chat (path-safe)."""

EditListener = Callable[[MemoryOwner, str, str, str], Awaitable[None]]
"""Told of each edit after it is written: (owner, `user`|`memory`, `add`|`replace`|`remove`,
the entry written or removed). The external memory provider mirrors edits through it."""

logger = logging.getLogger(__name__)


def memory_owner(
    key: SessionKey | str | None, user_id: UserId | None, *, groups: bool = True
) -> MemoryOwner | None:
    """The memory scope of a session: its person's, else its group chat's (`groups`), else
    None (no memory)."""
    if user_id:
        return person(user_id)
    if not groups or not key:
        return None
    parts = str(key).split(":")
    if len(parts) < 3 or parts[0] in ("api", "cron", "cli"):
        return None
    # platform:account:chat — the whole group, whichever of its threads the session is.
    return MemoryOwner("g-" + quote(":".join(parts[:3]), safe=""))


def person(user_id: UserId) -> MemoryOwner:
    """The memory scope of a person (shared by their linked identities)."""
    return MemoryOwner("u-" + quote(user_id, safe=""))


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

    Layout: `SOUL.md`, and `memory/<owner>/USER.md` + `memory/<owner>/MEMORY.md` (see
    `memory_owner`). A file holds one entry per line, written as a Markdown list item. Writes
    are atomic (temp file + rename), and edits are serialized across processes (a lock file),
    so instances sharing a state directory never lose each other's edits. `group_memory`:
    whether group chats get memory files of their own (else they have none).
    """

    def __init__(
        self,
        root: Path,
        limits: MemoryLimits = MemoryLimits(),
        *,
        group_memory: bool = True,
        on_edit: EditListener | None = None,
    ) -> None:
        self.root = root
        self.on_edit = on_edit
        self.limits = limits
        self.group_memory = group_memory
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

    def owner(self, key: SessionKey | str | None, user_id: UserId | None) -> MemoryOwner | None:
        """The memory scope of a session of `key` belonging to `user_id` (None: no memory)."""
        return memory_owner(key, user_id, groups=self.group_memory)

    def path(self, scope: MemoryScope, owner: MemoryOwner) -> Path:
        """Where the file of `scope` for `owner` lives."""
        name = "USER.md" if scope is MemoryScope.USER else "MEMORY.md"
        return self.root / "memory" / owner / name

    def read(self, scope: MemoryScope, owner: MemoryOwner | None) -> str:
        """The file's text ("" when it does not exist yet, or there is no scope)."""
        if owner is None:
            return ""
        try:
            return self.path(scope, owner).read_text(encoding="utf-8")
        except FileNotFoundError:
            return ""

    async def snapshot(self, key: SessionKey, user_id: UserId | None) -> tuple[str, str]:
        """(USER.md, MEMORY.md) of the session's scope as they are now; taken when a
        session starts."""
        owner = self.owner(key, user_id)
        return self.read(MemoryScope.USER, owner), self.read(MemoryScope.MEMORY, owner)

    async def add(
        self, scope: MemoryScope, owner: MemoryOwner | None, entry: str, *, mirror: bool = True
    ) -> str:
        """Append an entry. Raises MemoryEditError when empty, duplicate or over the cap.
        `mirror=False`: the listener is not told (an edit made in a group turn)."""
        target = _writable(owner)
        entry = _one_line(entry)
        async with self._exclusive():
            entries = self._entries(scope, target)
            if entry in entries:
                raise MemoryEditError("that entry is already saved")
            entries.append(entry)
            self._write(scope, target, entries)
        await self._edited(target, scope, "add", entry, mirror=mirror)
        return f"saved to {scope}"

    async def replace(
        self,
        scope: MemoryScope,
        owner: MemoryOwner | None,
        old: str,
        new: str,
        *,
        mirror: bool = True,
    ) -> str:
        """Replace the one entry containing `old` by `new` (`mirror`: as `add`)."""
        target = _writable(owner)
        new = _one_line(new)
        async with self._exclusive():
            entries = self._entries(scope, target)
            index = _find(entries, old)
            entries[index] = new
            self._write(scope, target, entries)
        await self._edited(target, scope, "replace", new, mirror=mirror)
        return f"replaced in {scope}"

    async def remove(
        self, scope: MemoryScope, owner: MemoryOwner | None, old: str, *, mirror: bool = True
    ) -> str:
        """Remove the one entry containing `old` (`mirror`: as `add`)."""
        target = _writable(owner)
        async with self._exclusive():
            entries = self._entries(scope, target)
            index = _find(entries, old)
            removed = entries.pop(index)
            self._write(scope, target, entries)
        await self._edited(target, scope, "remove", removed, mirror=mirror)
        return f"removed from {scope}"

    async def _edited(
        self, owner: MemoryOwner, scope: MemoryScope, action: str, text: str, *, mirror: bool
    ) -> None:
        """Tell the listener; its failure is logged, never the edit's (the file is written)."""
        if self.on_edit is None or not mirror:
            return
        try:
            await self.on_edit(owner, str(scope), action, text)
        except Exception:
            logger.exception("memory edit of %s not mirrored to the memory provider", owner)

    async def merge(self, source: UserId, into: UserId) -> None:
        """Move `source`'s entries into `into`'s files (no duplicates; caps not enforced, so
        nothing is lost) and delete `source`'s folder. Used when two identities are linked."""
        old, new = person(source), person(into)
        async with self._exclusive():
            for scope in MemoryScope:
                moved = self._entries(scope, old)
                if not moved:
                    continue
                entries = self._entries(scope, new)
                entries.extend(e for e in moved if e not in entries)
                self._write(scope, new, entries, enforce_cap=False)
            folder = self.path(MemoryScope.USER, old).parent
            for scope in MemoryScope:
                self.path(scope, old).unlink(missing_ok=True)
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

    def _entries(self, scope: MemoryScope, owner: MemoryOwner) -> list[str]:
        lines = self.read(scope, owner).splitlines()
        return [ln.removeprefix("- ").strip() for ln in lines if ln.strip()]

    def _write(
        self,
        scope: MemoryScope,
        owner: MemoryOwner,
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
        path = self.path(scope, owner)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)


def _writable(owner: MemoryOwner | None) -> MemoryOwner:
    if owner is None:
        raise MemoryEditError(
            "this conversation has no memory (it belongs to no known person or group)"
        )
    return owner


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
