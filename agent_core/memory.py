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
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import NewType, Protocol
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
    if len(parts) < 3 or parts[0] in ("api", "cron", "cli", "trigger"):
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


SOUL = "soul"
"""The document name of SOUL.md (its owner is `NO_OWNER`)."""
NO_OWNER = ""
"""The owner of documents that belong to no scope (SOUL.md)."""
SOUL_CACHE_SECONDS = 2.0
"""How long a read of SOUL.md is reused: every turn asks for it; an edit through this
process shows at once, one made elsewhere (another instance, the CLI) within this."""


class MemoryDocs(Protocol):
    """Where the agent's files are kept: documents by (owner, name), `name` one of `soul`,
    `user`, `memory`. Implementations: `FolderDocs` (files under a folder: the layout of
    earlier versions, kept for tests and for `herald state import`) and the database's
    (`gateway.store.memory_docs.SqlMemoryDocs`)."""

    async def get(self, owner: str, name: str) -> str:
        """The document's text, "" when it does not exist."""
        ...

    async def edit(self, owner: str, name: str, change: Callable[[str], str]) -> str:
        """Replace the text by `change(text)`, one editor of a document at a time across
        every process (a read-modify-write never loses another's edit). When `change`
        raises, nothing is written and the error propagates. Returns the new text."""
        ...

    async def drop(self, owner: str) -> None:
        """Delete every document of `owner`."""
        ...


def namespaced(namespace: str | None, owner: str) -> str:
    """The owner `owner` has inside a profile's memory namespace (None: the default
    namespace, today's rows): `p-<namespace>.<owner>`; SOUL.md's is `p-<namespace>.`."""
    return owner if namespace is None else f"p-{namespace}.{owner}"


class NamespacedDocs:
    """`MemoryDocs` of one memory namespace inside `inner`: every owner prefixed (see
    `namespaced`), so the same person has other files in another namespace. `soul`: the
    persona set in config, which SOUL.md reads as (edits to it are refused)."""

    def __init__(self, inner: MemoryDocs, namespace: str | None, soul: str | None = None) -> None:
        self.inner = inner
        self.namespace = namespace
        self.soul = soul

    async def get(self, owner: str, name: str) -> str:
        """The document's text in this namespace ("" when absent)."""
        if name == SOUL and owner == NO_OWNER and self.soul is not None:
            return self.soul
        return await self.inner.get(namespaced(self.namespace, owner), name)

    async def edit(self, owner: str, name: str, change: Callable[[str], str]) -> str:
        """Edit the document in this namespace (a configured SOUL is not editable here:
        ValueError saying where it is set)."""
        if name == SOUL and owner == NO_OWNER and self.soul is not None:
            raise ValueError("this profile's SOUL is set in the config file (soul / soul_file)")
        return await self.inner.edit(namespaced(self.namespace, owner), name, change)

    async def drop(self, owner: str) -> None:
        """Delete every document of `owner` in this namespace."""
        await self.inner.drop(namespaced(self.namespace, owner))


class FolderDocs:
    """`MemoryDocs` as files under `root`: `SOUL.md` and `memory/<owner>/USER.md` /
    `MEMORY.md`. Writes are atomic (temp file + rename) and edits serialized across processes
    by a lock file."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = asyncio.Lock()

    def path(self, owner: str, name: str) -> Path:
        """The file of document (`owner`, `name`)."""
        if name == SOUL:
            return self.root / "SOUL.md"
        return self.root / "memory" / owner / ("USER.md" if name == "user" else "MEMORY.md")

    async def get(self, owner: str, name: str) -> str:
        try:
            return self.path(owner, name).read_text(encoding="utf-8")
        except FileNotFoundError:
            return ""

    async def edit(self, owner: str, name: str, change: Callable[[str], str]) -> str:
        async with self._exclusive():
            text = change(await self.get(owner, name))
            path = self.path(owner, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
            return text

    async def drop(self, owner: str) -> None:
        async with self._exclusive():
            for name in ("user", "memory"):
                self.path(owner, name).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                (self.root / "memory" / owner).rmdir()

    @contextlib.asynccontextmanager
    async def _exclusive(self) -> AsyncIterator[None]:
        async with self._lock:
            lock_path = self.root / "memory" / ".lock"
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            with lock_path.open("ab") as handle:
                # Waiting for another process happens off the event loop.
                await asyncio.to_thread(fcntl.flock, handle.fileno(), fcntl.LOCK_EX)
                yield  # closing the file releases the lock


class MemoryFiles:
    """Reads and edits the agent's files: SOUL.md, and per memory scope (see `memory_owner`)
    USER.md and MEMORY.md, kept in `docs` (a `MemoryDocs`; a `Path` means `FolderDocs` of
    it). A file holds one entry per line, written as a Markdown list item. `group_memory`:
    whether group chats get memory files of their own (else they have none).
    """

    def __init__(
        self,
        docs: MemoryDocs | Path,
        limits: MemoryLimits = MemoryLimits(),
        *,
        group_memory: bool = True,
        on_edit: EditListener | None = None,
        clock: Callable[[], float] = time.monotonic,
        namespace: str | None = None,
    ) -> None:
        self.docs: MemoryDocs = FolderDocs(docs) if isinstance(docs, Path) else docs
        self.namespace = namespace
        """The profile's memory namespace (None: the default one); `docs` is already
        narrowed to it (`NamespacedDocs`), and agent-written skills follow it."""
        self.on_edit = on_edit
        self.limits = limits
        self.group_memory = group_memory
        self._clock = clock
        self._soul: tuple[float, str] | None = None

    async def soul(self) -> str:
        """SOUL.md, or the built-in default persona when it is absent or empty (read again
        after `SOUL_CACHE_SECONDS`, or at once after `set_soul`)."""
        now = self._clock()
        if self._soul is not None and now - self._soul[0] < SOUL_CACHE_SECONDS:
            return self._soul[1]
        text = (await self.docs.get(NO_OWNER, SOUL)).strip()
        if not text:
            text = default_soul()
        self._soul = (now, text)
        return text

    async def set_soul(self, text: str) -> None:
        """Replace SOUL.md ("" brings back the built-in default)."""
        await self.docs.edit(NO_OWNER, SOUL, lambda _old: text)
        self._soul = None

    def owner(self, key: SessionKey | str | None, user_id: UserId | None) -> MemoryOwner | None:
        """The memory scope of a session of `key` belonging to `user_id` (None: no memory)."""
        return memory_owner(key, user_id, groups=self.group_memory)

    def skill_owner(
        self, key: SessionKey | str | None, user_id: UserId | None
    ) -> MemoryOwner | None:
        """Whose agent-written skills a session of `key` and `user_id` sees and writes: its
        memory scope, inside the profile's namespace."""
        owner = self.owner(key, user_id)
        return None if owner is None else MemoryOwner(namespaced(self.namespace, owner))

    async def read(self, scope: MemoryScope, owner: MemoryOwner | None) -> str:
        """The file's text ("" when it does not exist yet, or there is no scope)."""
        if owner is None:
            return ""
        return await self.docs.get(owner, str(scope))

    async def snapshot(self, key: SessionKey, user_id: UserId | None) -> tuple[str, str]:
        """(USER.md, MEMORY.md) of the session's scope as they are now; taken when a
        session starts."""
        owner = self.owner(key, user_id)
        return await self.read(MemoryScope.USER, owner), await self.read(MemoryScope.MEMORY, owner)

    async def add(
        self, scope: MemoryScope, owner: MemoryOwner | None, entry: str, *, mirror: bool = True
    ) -> str:
        """Append an entry. Raises MemoryEditError when empty, duplicate or over the cap.
        `mirror=False`: the listener is not told (an edit made in a group turn)."""
        target = _writable(owner)
        entry = _one_line(entry)

        def change(text: str) -> str:
            entries = _entries(text)
            if entry in entries:
                raise MemoryEditError("that entry is already saved")
            entries.append(entry)
            return self._text(scope, entries)

        await self.docs.edit(target, str(scope), change)
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

        def change(text: str) -> str:
            entries = _entries(text)
            entries[_find(entries, old)] = new
            return self._text(scope, entries)

        await self.docs.edit(target, str(scope), change)
        await self._edited(target, scope, "replace", new, mirror=mirror)
        return f"replaced in {scope}"

    async def remove(
        self, scope: MemoryScope, owner: MemoryOwner | None, old: str, *, mirror: bool = True
    ) -> str:
        """Remove the one entry containing `old` (`mirror`: as `add`)."""
        target = _writable(owner)
        removed: list[str] = []

        def change(text: str) -> str:
            entries = _entries(text)
            removed[:] = [entries.pop(_find(entries, old))]
            return self._text(scope, entries)

        await self.docs.edit(target, str(scope), change)
        await self._edited(target, scope, "remove", removed[0], mirror=mirror)
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
        nothing is lost) and delete `source`'s. Used when two identities are linked; run
        again after a crash halfway, it finishes the move (entries are not doubled)."""
        old, new = person(source), person(into)
        for scope in MemoryScope:
            moved = _entries(await self.docs.get(old, str(scope)))
            if not moved:
                continue

            def change(text: str, moved: list[str] = moved) -> str:
                entries = _entries(text)
                entries.extend(e for e in moved if e not in entries)
                return "".join(f"- {e}\n" for e in entries)

            await self.docs.edit(new, str(scope), change)
        await self.docs.drop(old)

    def _text(self, scope: MemoryScope, entries: list[str]) -> str:
        text = "".join(f"- {e}\n" for e in entries)
        cap = (
            self.limits.user_max_chars
            if scope is MemoryScope.USER
            else self.limits.memory_max_chars
        )
        if len(text) > cap:
            raise MemoryEditError(
                f"{scope} memory is full ({len(text)} of {cap} characters); "
                "replace or remove an entry first"
            )
        return text


def default_soul() -> str:
    """The built-in persona."""
    return resources.files("agent_core").joinpath("default_soul.md").read_text("utf-8").strip()


def _entries(text: str) -> list[str]:
    return [ln.removeprefix("- ").strip() for ln in text.splitlines() if ln.strip()]


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
