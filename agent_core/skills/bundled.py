"""Bundled skills: a few shipped with Herald, installed into `<state_dir>/skills/`.

`skills/.bundled.json` maps each installed bundled skill to the hash of its folder as
installed. An upgrade replaces a bundled skill only while the user's copy still has that
hash (unchanged), never re-adds one the user deleted, and never overwrites a skill of the
same name the user made.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import shutil
import tempfile
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from agent_core.skills.format import SKILL_FILE
from agent_core.skills.store import read_manifest, write_manifest

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class InstallReport:
    """What one install pass did, by skill name."""

    installed: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    """Changed by the user: left as they are."""
    skipped: list[str] = field(default_factory=list)
    """Deleted by the user, or a skill of the user's under that name: not added."""


def bundled_source() -> Traversable:
    """The folder of bundled skills shipped in the package."""
    return resources.files("agent_core.skills").joinpath("bundled")


def folder_hash(folder: Path | Traversable) -> str:
    """A hash of every file of a skill folder (relative paths and contents)."""
    digest = hashlib.sha256()
    for rel, data in sorted(_files(folder)):
        digest.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()


def _files(folder: Path | Traversable, prefix: str = "") -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    for entry in folder.iterdir():
        if entry.name.startswith((".", "__")):
            continue
        rel = f"{prefix}{entry.name}"
        if entry.is_dir():
            out.extend(_files(entry, rel + "/"))
        elif entry.is_file():
            out.append((rel, entry.read_bytes()))
    return out


def install_bundled(skills_root: Path, source: Path | Traversable | None = None) -> InstallReport:
    """Install or upgrade the bundled skills under `skills_root` by the manifest's rules."""
    source = source if source is not None else bundled_source()
    skills_root.mkdir(parents=True, exist_ok=True)
    # One installer at a time: instances sharing the state directory start together.
    with (skills_root / ".lock").open("ab") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        return _install(skills_root, source)


def _install(skills_root: Path, source: Path | Traversable) -> InstallReport:
    report = InstallReport()
    manifest = read_manifest(skills_root)
    for entry in sorted(source.iterdir(), key=lambda e: e.name):
        if not entry.is_dir() or not entry.joinpath(SKILL_FILE).is_file():
            continue
        name = entry.name
        target = skills_root / name
        shipped = folder_hash(entry)
        recorded = manifest.get(name)
        if recorded is None:
            if target.exists():
                report.skipped.append(name)  # the user's own skill of that name
                continue
            _copy(entry, target)
            manifest[name] = shipped
            report.installed.append(name)
        elif not target.exists():
            report.skipped.append(name)  # deleted by the user: stays deleted
        elif recorded == shipped:
            continue
        elif folder_hash(target) == recorded:
            _copy(entry, target)
            manifest[name] = shipped
            report.updated.append(name)
        else:
            report.kept.append(name)
    if report.installed or report.updated:
        write_manifest(skills_root, manifest)
        logger.info(
            "bundled skills: installed %s, updated %s",
            report.installed or "none",
            report.updated or "none",
        )
    return report


def _copy(source: Path | Traversable, target: Path) -> None:
    """Copy a skill folder into place: staged beside it, then swapped in."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".staging-{target.name}-"))
    for rel, data in _files(source):
        path = staging / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    if target.exists():
        old = target.with_name(f".old-{target.name}")
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
        staging.rename(target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        staging.rename(target)
