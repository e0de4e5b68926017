"""Skills in SQL (`skill_files`): every file of every skill, shared and personal, with the
bundled-skills record. Implements `agent_core.skills.sync.SkillSync`: the skill folders
under `state_dir` (`skills/`, `memory/<owner>/skills/`) are a cache of these rows.

- `refresh` reads one setting (`skills.generation`) and, when it differs from the stamp of
  the local folders (`state_dir/cache/skills.generation`; none when the state directory was
  wiped), rewrites the local files whose content hash differs and deletes those the
  database does not hold. Folders without a stamp were written by an older version: they
  lose nothing until `import_local` (`herald state import`, and every start) stored them.
- `writing` holds the cluster's skills lock (PostgreSQL: an advisory lock; SQLite: a lock
  file, one machine), refreshes, runs the block, and stores what the block changed in the
  local folders (by content hash, in one transaction that moves the generation).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import re
import secrets
import stat
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select, text, tuple_
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_core.skills.model import SkillError
from gateway.contracts.messages import utcnow
from gateway.store import Store
from gateway.store.tables import settings, skill_files

logger = logging.getLogger(__name__)

GENERATION = "skills.generation"
"""The setting that moves with every stored skill write."""
NEVER = "-"
"""The generation of a database no skill was ever stored in."""
IMPORTED = "imported"
"""The stamp of folders just imported: a cache, to be read whole at the next refresh."""
SHARED = ""
"""The owner of the shared skills (`state_dir/skills`)."""
_LOCKED = {"id": 0x48455241_4C44534B}  # "HERALDSK": the advisory lock of skill writes
_LOCK = Path(".lock")
"""SkillStore's own lock file at the root of the shared skills: not a skill's."""
LOCK_WAIT = 30.0
"""Seconds a skill write waits for another writer before it gives up."""
LOCK_POLL = 0.05
STALE = "stale"
"""The stamp of folders that may differ from the database (a write failed halfway)."""
_OWNER = re.compile(r"(p-[a-z0-9_-]+\.)?[ug]-[A-Za-z0-9%._~-]+")
"""A memory scope's name (`memory_owner`, in a profile's namespace `p-<namespace>.`): the
only personal owners a row may name."""

Key = tuple[str, str, str]
"""(owner, folder, path): a file's row."""


@dataclass(frozen=True, slots=True)
class Local:
    """A local file as the mirror sees it."""

    sha256: str
    mode: int


class SkillMirror:
    """`SkillSync` over a `Store`, for the skill folders under `state_dir`."""

    def __init__(self, store: Store, state_dir: Path, *, lock_wait: float = LOCK_WAIT) -> None:
        self.store = store
        self.state_dir = state_dir
        self.lock_wait = lock_wait
        self._lock = asyncio.Lock()
        self._told = False

    # the local side -----------------------------------------------------------------------

    def root(self, owner: str) -> Path:
        """The folder of `owner`'s skills (SHARED: the shared ones)."""
        if owner == SHARED:
            return self.state_dir / "skills"
        return self.state_dir / "memory" / owner / "skills"

    def local(self) -> dict[Key, Local]:
        """Every regular file under the skill folders, reached through no symlink (but for
        SkillStore's lock file and half-written files). Blocking."""
        out: dict[Key, Local] = {}
        roots = [(SHARED, self.root(SHARED))]
        memory = self.state_dir / "memory"
        if memory.is_dir() and not memory.is_symlink():
            roots += [
                (p.name, p / "skills")
                for p in sorted(memory.iterdir())
                if p.is_dir() and not p.is_symlink() and _OWNER.fullmatch(p.name)
            ]
        for owner, root in roots:
            if not root.is_dir() or root.is_symlink():
                continue
            for path in sorted(root.rglob("*")):
                rel = path.relative_to(root)
                if rel == _LOCK or _temporary(path.name) or not _plain(root, rel):
                    continue
                key = _key(owner, rel)
                out[key] = Local(_sha256(path), stat.S_IMODE(path.stat().st_mode))
        return out

    def _path(self, key: Key) -> Path | None:
        """Where the file of row `key` goes; None for a row no writer of ours makes (an owner
        that is not a memory scope, a path leaving its folder): never written or deleted."""
        owner, folder, rel = key
        if owner != SHARED and not _OWNER.fullmatch(owner):
            return None
        parts = [*(folder.split("/") if folder else []), *rel.split("/")]
        if any(p in ("", ".", "..") or "\\" in p or "\x00" in p for p in parts):
            return None
        path = self.root(owner).joinpath(*parts)
        if not path.resolve().is_relative_to(self.state_dir.resolve()):
            return None
        return path

    def _display_of(self, path: Path) -> str:
        return path.relative_to(self.state_dir).as_posix()

    # SkillSync ---------------------------------------------------------------------------

    async def refresh(self) -> None:
        """Bring the local folders up to date (one indexed read when nothing changed)."""
        async with self._lock:
            await self._refresh()

    @contextlib.asynccontextmanager
    async def writing(self, touched: Callable[[], Iterable[Path]]) -> AsyncIterator[None]:
        """One skills writer at a time across instances (waiting at most `LOCK_WAIT`, then
        SkillError: try again later). After the block, `touched()` names the skill folders
        (or files) it may have changed: only what changed under them is stored, whatever
        else happened to the local folders meanwhile. A block that raises (or is cancelled),
        or a store that fails, leaves the folders marked stale: the next refresh rewrites
        them from the database."""
        async with self._cluster_lock(), self._lock:
            await self._refresh()
            before = await asyncio.to_thread(self.local)
            ok = False
            try:
                yield
                prefixes = [self._display_of(p) for p in touched()]
                after = await asyncio.to_thread(self.local)

                def mine(key: Key) -> bool:
                    shown = _display(key)
                    return any(shown == p or shown.startswith(p + "/") for p in prefixes)

                changed = {k: v for k, v in after.items() if mine(k) and before.get(k) != v}
                removed = [k for k in before if mine(k) and k not in after]
                if changed or removed:
                    await self._store(changed, removed)
                ok = True
            finally:
                if not ok:
                    self._mark_stale()

    def _mark_stale(self) -> None:
        """The local folders may differ from the database: the next refresh reads them whole
        (a stamp no generation matches; still a cache, so nothing is imported from it)."""
        with contextlib.suppress(OSError):
            if self._stamp() is not None:
                self._set_stamp(STALE)

    async def import_local(self) -> list[str]:
        """Store every skill file of folders an older version wrote (not yet a cache) that
        the database lacks, and mark the folders a cache; the paths stored. A file the
        database holds other content of keeps the database's (the next refresh writes it).
        Nothing when the folders are a cache already."""
        async with self._cluster_lock(), self._lock:
            if await asyncio.to_thread(self.is_cache):
                return []
            local = await asyncio.to_thread(self.local)
            rows = await self._rows()
            todo = {k: v for k, v in local.items() if k not in rows}
            if todo:
                await self._store(todo, [])
            # A cache from now on, not yet up to date: the next refresh reads everything.
            await asyncio.to_thread(self._set_stamp, IMPORTED)
            return [_display(k) for k in sorted(todo)]

    # the database side -----------------------------------------------------------------

    async def _refresh(self) -> None:
        generation = await self.store.unit(_read_generation, write=False) or NEVER
        stamp = await asyncio.to_thread(self._stamp)
        if generation == stamp:
            return
        rows = await self._rows()
        local = await asyncio.to_thread(self.local)
        stale = [k for k, (sha, mode) in rows.items() if local.get(k) != Local(sha, mode)]
        data = await self._data(stale) if stale else {}
        extra = [k for k in local if k not in rows]
        # Only a folder known to be a cache loses what the database does not hold; one of an
        # older version keeps it until `herald state import` has stored it.
        gone = extra if stamp is not None else []
        await asyncio.to_thread(self._materialise, data, rows, gone)
        if stamp is not None or not extra:
            await asyncio.to_thread(self._set_stamp, generation)
        elif not self._told:
            self._told = True
            logger.warning(
                "skill files in %s are not in the database yet; run `herald state import`",
                self.state_dir,
            )

    def is_cache(self) -> bool:
        """Whether the local folders are known to be a cache of the database (else they may
        hold an older version's skills, to import). Blocking."""
        return self._stamp() is not None

    @property
    def _stamp_path(self) -> Path:
        return self.state_dir / "cache" / "skills.generation"

    def _stamp(self) -> str | None:
        """The generation the local folders were last brought to (None: unknown, e.g. the
        state directory was wiped)."""
        try:
            return self._stamp_path.read_text(encoding="utf-8").strip() or None
        except OSError:
            return None

    def _set_stamp(self, generation: str) -> None:
        self._stamp_path.parent.mkdir(parents=True, exist_ok=True)
        self._stamp_path.write_text(generation, encoding="utf-8")

    def _materialise(
        self, data: Mapping[Key, bytes], rows: Mapping[Key, tuple[str, int]], gone: Iterable[Key]
    ) -> None:
        for key, blob in data.items():
            sha, mode = rows[key]
            path = self._path(key)
            if path is None:
                logger.warning("skill file row %r is not a path of a skill; skipped", key)
                continue
            if hashlib.sha256(blob).hexdigest() != sha:  # checked before it is used
                logger.warning("skill file %s does not match its hash; not written", _display(key))
                continue
            if not _plain(self.state_dir, path.relative_to(self.state_dir), file=False):
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
            tmp.write_bytes(blob)
            tmp.chmod(mode & 0o755)
            os.replace(tmp, path)
        for key in gone:
            path = self._path(key)
            if path is None or not _plain(self.state_dir, path.relative_to(self.state_dir)):
                continue
            path.unlink(missing_ok=True)
            _prune_empty(path.parent, self.root(key[0]))

    async def _rows(self) -> dict[Key, tuple[str, int]]:
        async def work(conn: AsyncConnection) -> dict[Key, tuple[str, int]]:
            result = await conn.execute(
                select(
                    skill_files.c.owner,
                    skill_files.c.folder,
                    skill_files.c.path,
                    skill_files.c.sha256,
                    skill_files.c.mode,
                )
            )
            return {(r.owner, r.folder, r.path): (r.sha256, r.mode) for r in result}

        return await self.store.unit(work, write=False)

    async def _data(self, keys: list[Key]) -> dict[Key, bytes]:
        async def work(conn: AsyncConnection) -> dict[Key, bytes]:
            out: dict[Key, bytes] = {}
            for start in range(0, len(keys), 200):
                part = keys[start : start + 200]
                result = await conn.execute(
                    select(
                        skill_files.c.owner,
                        skill_files.c.folder,
                        skill_files.c.path,
                        skill_files.c.data,
                    ).where(
                        tuple_(skill_files.c.owner, skill_files.c.folder, skill_files.c.path).in_(
                            part
                        )
                    )
                )
                out.update({(r.owner, r.folder, r.path): bytes(r.data) for r in result})
            return out

        return await self.store.unit(work, write=False)

    async def _store(self, changed: Mapping[Key, Local], removed: Iterable[Key]) -> None:
        """Store `changed`, delete `removed`, move the generation; the local folders, if a
        cache already, are then marked as at that generation (they were up to date before:
        `writing` refreshed them under the lock)."""
        contents = await asyncio.to_thread(
            lambda: {k: (self.root(k[0]) / _rel(k)).read_bytes() for k in changed}
        )
        removed = list(removed)
        generation = secrets.token_hex(8)

        async def work(conn: AsyncConnection) -> None:
            now = utcnow()
            for key, blob in contents.items():
                owner, folder, rel = key
                values = {
                    "owner": owner,
                    "folder": folder,
                    "path": rel,
                    "data": blob,
                    "sha256": hashlib.sha256(blob).hexdigest(),
                    "mode": changed[key].mode,
                    "updated_at": now,
                }
                await conn.execute(_upsert(conn, values))
            for owner, folder, rel in removed:
                await conn.execute(
                    delete(skill_files).where(
                        skill_files.c.owner == owner,
                        skill_files.c.folder == folder,
                        skill_files.c.path == rel,
                    )
                )
            await conn.execute(
                _upsert_setting(conn, {"key": GENERATION, "value": generation, "updated_at": now})
            )

        await self.store.unit(work)
        if await asyncio.to_thread(self.is_cache):
            await asyncio.to_thread(self._set_stamp, generation)

    @contextlib.asynccontextmanager
    async def _cluster_lock(self) -> AsyncIterator[None]:
        """The skills lock of every instance on this database: a PostgreSQL advisory lock,
        or on SQLite a lock file beside the database file. Waits at most `LOCK_WAIT`."""
        deadline = time.monotonic() + self.lock_wait
        if self.store.dialect == "postgresql":
            async with self.store.engine.connect() as conn:
                while not await conn.scalar(text("SELECT pg_try_advisory_lock(:id)"), _LOCKED):
                    await conn.commit()
                    _wait_or_give_up(deadline)
                    await asyncio.sleep(LOCK_POLL)
                try:
                    yield
                finally:
                    await conn.execute(text("SELECT pg_advisory_unlock(:id)"), _LOCKED)
                    await conn.commit()
            return
        database = self.store.engine.url.database
        lock = Path(f"{database}.skills.lock") if database else self.state_dir / ".skills.lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        with lock.open("ab") as handle:
            while True:
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    _wait_or_give_up(deadline)
                    await asyncio.sleep(LOCK_POLL)
            yield


def _wait_or_give_up(deadline: float) -> None:
    if time.monotonic() > deadline:
        raise SkillError(
            "skills are being written elsewhere (another instance or `herald skills`); "
            "try again in a minute"
        )


async def _read_generation(conn: AsyncConnection) -> str | None:
    return await conn.scalar(select(settings.c.value).where(settings.c.key == GENERATION))


def _upsert(conn: AsyncConnection, values: dict[str, Any]) -> Any:
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(skill_files).values(**values)
    return stmt.on_conflict_do_update(
        index_elements=["owner", "folder", "path"],
        set_={k: stmt.excluded[k] for k in ("data", "sha256", "mode", "updated_at")},
    )


def _upsert_setting(conn: AsyncConnection, values: dict[str, Any]) -> Any:
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(settings).values(**values)
    return stmt.on_conflict_do_update(
        index_elements=["key"],
        set_={"value": stmt.excluded.value, "updated_at": stmt.excluded.updated_at},
    )


def _key(owner: str, rel: Path) -> Key:
    parts = rel.parts
    if len(parts) == 1:
        return (owner, "", parts[0])
    return (owner, parts[0], "/".join(parts[1:]))


def _display(key: Key) -> str:
    owner, folder, rel = key
    root = "skills" if owner == SHARED else f"memory/{owner}/skills"
    return "/".join(p for p in (root, folder, rel) if p)


def _plain(root: Path, rel: Path, *, file: bool = True) -> bool:
    """`root / rel` reached through no symlink (SkillStore refuses symlinks too); with
    `file`, a regular file that exists."""
    path = root / rel
    if path.is_symlink() or (file and not path.is_file()):
        return False
    return not any((root / p).is_symlink() for p in rel.parents if p != Path("."))


def _rel(key: Key) -> str:
    _owner, folder, rel = key
    return f"{folder}/{rel}" if folder else rel


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def _prune_empty(folder: Path, stop: Path) -> None:
    while folder != stop and folder.is_relative_to(stop):
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


def _temporary(name: str) -> bool:
    """A half-written file (SkillStore's `.tmp-…`, the mirror's `.….tmp`)."""
    return name.startswith(".tmp-") or name.endswith(".tmp")
