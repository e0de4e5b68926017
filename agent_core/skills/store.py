"""Skills on disk: discovery, paths that never leave a skill's folder, atomic writes.

Layout under the state directory:
- `skills/<name>/` or `skills/<category>/<name>/`: operator and bundled skills (shared);
  `skills/.bundled.json` is the hash manifest of the bundled ones, `skills/.quarantine/`
  holds installed skills the scanner flagged.
- `memory/<owner>/skills/[<category>/]<name>/`: skills the agent wrote in the conversations
  of that memory owner (a person, or a group chat), beside their USER.md and MEMORY.md.
- each folder of `skills.dirs`: read-only shared skills, scanned before use.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath

from agent_core.skills.format import (
    MAX_FILE_BYTES,
    MAX_SKILL_CHARS,
    SKILL_FILE,
    SUPPORT_DIRS,
    SkillFormatError,
    check_category,
    check_name,
    parse_skill,
)
from agent_core.skills.model import (
    Skill,
    SkillAction,
    SkillChange,
    SkillError,
    SkillNotFound,
    SkillSource,
)
from agent_core.skills.scanner import (
    Finding,
    hidden_characters,
    scan_bytes,
    scan_skill,
    sniff_text,
)

MANIFEST = ".bundled.json"
MAX_PATH_CHARS = 200
"""The longest path of a supporting file inside its skill folder."""
QUARANTINE = ".quarantine"

_Stamp = tuple[int, ...]


class SkillStore:
    """Finds, reads and writes skills. Holds no state but a cache of parsed folders (keyed
    by each `SKILL.md`'s inode, size and modification time), so instances sharing the state
    directory always see each other's writes."""

    def __init__(self, state_dir: Path, dirs: Sequence[Path] = ()) -> None:
        self.state_dir = state_dir
        self.shared_root = state_dir / "skills"
        self.dirs = tuple(dirs)
        self._cache: dict[Path, tuple[_Stamp, Skill]] = {}

    # discovery --------------------------------------------------------------------------

    def personal_root(self, owner: str) -> Path:
        """Where the skills of a memory owner live."""
        if not owner or "/" in owner or owner.startswith("."):
            raise SkillError(f"not a memory owner: {owner!r}")
        return self.state_dir / "memory" / owner / "skills"

    def bundled_names(self) -> set[str]:
        """The skills the bundled manifest lists."""
        return set(read_manifest(self.shared_root))

    def shared(self) -> list[Skill]:
        """Every shared skill folder (state directory, then `skills.dirs`), valid or not."""
        bundled = self.bundled_names()
        out = [
            _with_source(s, SkillSource.BUNDLED) if s.name in bundled else s
            for s in self._walk(self.shared_root, SkillSource.OPERATOR, None)
        ]
        for folder in self.dirs:
            out.extend(self._walk(folder, SkillSource.EXTERNAL, None))
        return out

    def personal(self, owner: str) -> list[Skill]:
        """The skills written in the conversations of `owner`, valid or not."""
        return list(self._walk(self.personal_root(owner), SkillSource.PERSONAL, owner))

    def owners(self) -> list[str]:
        """The memory owners that have a skills folder."""
        root = self.state_dir / "memory"
        if not root.is_dir():
            return []
        return sorted(p.name for p in root.iterdir() if (p / "skills").is_dir())

    def everything(self) -> list[Skill]:
        """Every skill folder of every source and owner (for the operator's CLI)."""
        out = self.shared()
        for owner in self.owners():
            out.extend(self.personal(owner))
        return out

    def visible(self, owner: str | None) -> list[Skill]:
        """What the model may see in a session of `owner`: usable shared skills, then the
        owner's own; a name already taken by an earlier one is skipped."""
        seen: set[str] = set()
        out: list[Skill] = []
        candidates = self.shared() + (self.personal(owner) if owner else [])
        for skill in candidates:
            if skill.usable and skill.name not in seen:
                seen.add(skill.name)
                out.append(skill)
        return sorted(out, key=lambda s: (s.category or "", s.name))

    def find(self, name: str, owner: str | None) -> Skill:
        """The visible skill of that name. Raises SkillNotFound (saying what exists)."""
        check_name(name)
        for skill in self.visible(owner):
            if skill.name == name:
                return skill
        raise SkillNotFound(f"there is no skill named {name!r}; skills_list shows those there are")

    def _walk(self, root: Path, source: SkillSource, owner: str | None) -> Iterator[Skill]:
        if not _is_real_dir(root):
            return
        for entry in sorted(root.iterdir()):
            if entry.name.startswith(".") or not _is_real_dir(entry):
                continue
            if (entry / SKILL_FILE).exists() or (entry / SKILL_FILE).is_symlink():
                yield self._load(entry, source, owner, None)
                continue
            for inner in sorted(entry.iterdir()):  # a category folder
                if inner.name.startswith(".") or not _is_real_dir(inner):
                    continue
                if (inner / SKILL_FILE).exists() or (inner / SKILL_FILE).is_symlink():
                    yield self._load(inner, source, owner, entry.name)

    def _load(self, folder: Path, source: SkillSource, owner: str | None, cat: str | None) -> Skill:
        path = folder / SKILL_FILE
        try:
            st = path.lstat()
        except OSError as err:
            return Skill(folder.name, "", source, folder, cat, owner, problem=str(err))
        # Supporting files are scanned too: a changed one is read and scanned again.
        stamp: _Stamp = (st.st_ino, st.st_size, st.st_mtime_ns, *_files_stamp(folder))
        cached = self._cache.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        skill = _read_folder(folder, source, owner, cat, st)
        self._cache[path] = (stamp, skill)
        return skill

    # reading ----------------------------------------------------------------------------

    def read(self, skill: Skill, file_path: str | None = None) -> str:
        """The whole `SKILL.md`, or one file inside the skill's folder. Raises SkillError
        (a path leaving the folder, a symlink, a file that is not text: the scanner lets
        small binary files pass unread, so they are never handed out) or SkillNotFound."""
        rel = file_path or SKILL_FILE
        path = inside(skill.path, rel)
        if not path.is_file():
            present = ", ".join(supporting_files(skill.path)) or "none"
            raise SkillNotFound(
                f"skill {skill.name!r} has no file {rel!r} (its supporting files: {present})"
            )
        if path.stat().st_size > MAX_FILE_BYTES:
            raise SkillError(f"{rel} is larger than {MAX_FILE_BYTES} bytes")
        return _text_of(path, rel)

    # writing ----------------------------------------------------------------------------

    def folder_for(self, name: str, owner: str | None, category: str | None) -> Path:
        """Where a new skill of that name goes (owner None: the shared folder)."""
        root = self.shared_root if owner is None else self.personal_root(owner)
        check_name(name)
        return root / check_category(category) / name if category else root / name

    def apply(self, change: SkillChange, skill: Skill | None) -> None:
        """Write `change` atomically, refusing when the file changed since it was read
        (`change.before`). `skill`: the existing skill (None for `create`)."""
        with self._locked():
            if change.action is SkillAction.CREATE:
                folder = self.folder_for(change.skill, change.owner, change.category)
                if folder.exists():
                    raise SkillError(f"a skill folder {change.skill!r} exists already")
            else:
                if skill is None:
                    raise SkillNotFound(f"there is no skill named {change.skill!r}")
                folder = skill.path
            path = inside(folder, change.file_path)
            current = _text_of(path, change.file_path) if path.is_file() else None
            if change.action is not SkillAction.CREATE and current != change.before:
                raise SkillError(
                    f"{change.skill}/{change.file_path} changed since this write was planned; "
                    "view it again and redo the change"
                )
            if change.action is SkillAction.DELETE:
                _remove_tree(folder)
            elif change.after is None:
                path.unlink(missing_ok=True)
                _prune(path.parent, folder)
            else:
                atomic_write(path, change.after)

    def move(self, folder: Path, target: Path) -> None:
        """Move a skill folder (to share it); refuses when `target` exists."""
        with self._locked():
            if target.exists():
                raise SkillError(f"{target} exists already")
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(folder, target)
            _prune(folder.parent, self.state_dir)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One writer at a time across processes sharing the state directory."""
        self.shared_root.mkdir(parents=True, exist_ok=True)
        with (self.shared_root / ".lock").open("ab") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            yield


def _read_folder(
    folder: Path, source: SkillSource, owner: str | None, cat: str | None, st: os.stat_result
) -> Skill:
    def broken(problem: str) -> Skill:
        return Skill(folder.name, "", source, folder, cat, owner, problem=problem)

    if stat.S_ISLNK(st.st_mode):
        return broken("SKILL.md is a symlink (refused)")
    if st.st_size > MAX_SKILL_CHARS * 4:
        return broken(f"SKILL.md is larger than {MAX_SKILL_CHARS} characters")
    try:
        text = (folder / SKILL_FILE).read_text(encoding="utf-8")
        doc = parse_skill(text, expect_name=folder.name)
        if cat is not None:
            check_category(cat)
    except (OSError, UnicodeDecodeError) as err:
        return broken(f"SKILL.md cannot be read: {err}")
    except SkillFormatError as err:
        return broken(str(err))
    findings = [*scan_skill(text, doc.front), *scan_folder_files(folder)]
    quarantine = "; ".join(str(f) for f in findings) or None
    refused = any(f.refused for f in findings)
    return Skill(
        doc.name, doc.description, source, folder, cat, owner, doc.front, None, quarantine, refused
    )


def _text_of(path: Path, rel: str) -> str:
    """A file's text, newlines as `read_text` gives them. Raises SkillError when it is not
    text (see `sniff_text`)."""
    text = sniff_text(path.read_bytes())
    if text is None:
        raise SkillError(f"{rel} is not a text file")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _with_source(skill: Skill, source: SkillSource) -> Skill:
    return Skill(
        skill.name,
        skill.description,
        source,
        skill.path,
        skill.category,
        skill.owner,
        skill.front,
        skill.problem,
        skill.quarantine,
        skill.refused,
    )


def scan_folder_files(folder: Path) -> list[Finding]:
    """Scanner findings in every file of a skill folder besides `SKILL.md`, wherever it lies
    and whatever its name: text is scanned; a file that cannot be read, is too large, or
    whose name hides characters is refused."""
    found: list[Finding] = []
    for rel in _every_file(folder):
        path = folder / rel
        if hidden_characters(rel):
            found.append(Finding("the file name holds hidden characters", "name", ascii(rel), True))
            continue
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                found.append(Finding(f"is larger than {MAX_FILE_BYTES} bytes", "size", rel, True))
                continue
            data = path.read_bytes()
        except OSError as err:
            found.append(Finding("cannot be read", str(err)[:80], rel, True))
            continue
        found.extend(scan_bytes(data, rel))
    return found


def _files_stamp(folder: Path) -> _Stamp:
    """Names, inodes, sizes and modification times of a folder's other files (a changed
    file is read and scanned again)."""
    out: list[int] = []
    for rel in _every_file(folder):
        try:
            st = (folder / rel).stat()
        except OSError:
            continue
        out += [hash(rel), st.st_ino, st.st_size, st.st_mtime_ns]
    return tuple(out)


def _every_file(folder: Path) -> list[str]:
    """Every file of a skill folder besides `SKILL.md`, relative, sorted (symlinks, which
    are never read, left out)."""
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not Path(dirpath, d).is_symlink()]
        for name in filenames:
            path = Path(dirpath, name)
            rel = path.relative_to(folder).as_posix()
            if rel != SKILL_FILE and not path.is_symlink():
                out.append(rel)
    return sorted(out)


def supporting_files(folder: Path) -> list[str]:
    """The files of a skill folder besides `SKILL.md`, relative, sorted (symlinks left out)."""
    out: list[str] = []
    for sub in SUPPORT_DIRS:
        base = folder / sub
        if not _is_real_dir(base):
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if not Path(dirpath, d).is_symlink()]
            for name in filenames:
                path = Path(dirpath, name)
                if not path.is_symlink():
                    out.append(path.relative_to(folder).as_posix())
    return sorted(out)


def inside(folder: Path, rel: str) -> Path:
    """`folder / rel`, refusing absolute paths, `..`, and symlinks on the way. Raises
    SkillError."""
    if not rel or "\x00" in rel or "\\" in rel:
        raise SkillError(f"not a usable file path: {rel!r}")
    if hidden_characters(rel):
        raise SkillError(f"{rel!a} holds hidden characters; name the file in plain text")
    pure = PurePosixPath(rel)
    if pure.is_absolute() or rel.startswith("~"):
        raise SkillError(f"{rel!r} is absolute; give a path inside the skill, like references/x.md")
    if any(part in ("..", ".") for part in pure.parts) or not pure.parts:
        raise SkillError(f"{rel!r} leaves the skill's folder ('..' is not allowed)")
    path = folder
    for part in (*pure.parts,):
        if path.is_symlink():
            raise SkillError(f"{rel!r} goes through a symlink (refused)")
        path = path / part
    if path.is_symlink():
        raise SkillError(f"{rel!r} is a symlink (refused)")
    if folder.is_symlink():
        raise SkillError("the skill's folder is a symlink (refused)")
    return path


def support_path(rel: str) -> str:
    """A supporting file's path as given, when it lies under one of the standard folders."""
    pure = PurePosixPath(rel)
    if len(pure.as_posix()) > MAX_PATH_CHARS:
        raise SkillError(f"a supporting file's path has at most {MAX_PATH_CHARS} characters")
    if len(pure.parts) < 2 or pure.parts[0] not in SUPPORT_DIRS:
        raise SkillError(
            f"supporting files go under {', '.join(d + '/' for d in SUPPORT_DIRS)} (got {rel!r})"
        )
    return pure.as_posix()


def atomic_write(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _remove_tree(folder: Path) -> None:
    """Remove a skill folder: renamed away first, so no reader sees half of it."""
    doomed = folder.with_name(f".deleted-{folder.name}-{os.getpid()}")
    os.replace(folder, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _prune(directory: Path, stop: Path) -> None:
    """Remove now-empty folders from `directory` up to (not including) `stop`."""
    while directory != stop and stop in directory.parents:
        try:
            directory.rmdir()
        except OSError:
            return
        directory = directory.parent


def _is_real_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def read_manifest(root: Path) -> dict[str, str]:
    """The bundled manifest: skill name → the hash of the folder as installed."""
    try:
        data = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): str(v) for k, v in data.items()}


def write_manifest(root: Path, manifest: dict[str, str]) -> None:
    """Replace the bundled manifest."""
    atomic_write(root / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
