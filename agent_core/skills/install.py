"""`herald skills install PATH`: copy a skill folder into the shared skills, scanned first.

A folder the scanner flags goes to `<state_dir>/skills/.quarantine/<name>/` instead, never
shown to the model; `herald skills list` shows it with the reason. A folder it refuses
(hidden characters, a file it cannot read) is not copied at all.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from agent_core.skills.format import (
    MAX_FILE_BYTES,
    SKILL_FILE,
    SkillFormatError,
    check_category,
    parse_skill,
)
from agent_core.skills.model import Skill, SkillAction, SkillChange, SkillError, SkillSource
from agent_core.skills.scanner import Finding, Verdict, scan_skill, verdict
from agent_core.skills.store import QUARANTINE, SkillStore, scan_folder_files


@dataclass(frozen=True, slots=True)
class Installed:
    """What an install did: the change to record, or the quarantine reason."""

    name: str
    path: Path
    change: SkillChange | None
    quarantine: str | None = None


def install_folder(store: SkillStore, source: Path, category: str | None = None) -> Installed:
    """Validate, scan and copy the skill folder `source`. Raises SkillError (nothing copied)
    for a folder that is not a valid skill, holds symlinks or oversized files, or whose name
    is taken."""
    source = source.expanduser()
    if source.is_file() and source.name == SKILL_FILE:
        source = source.parent
    if not source.is_dir() or source.is_symlink():
        raise SkillError(f"{source} is not a skill folder (a folder holding {SKILL_FILE})")
    skill_md = source / SKILL_FILE
    if not skill_md.is_file() or skill_md.is_symlink():
        raise SkillError(f"{source} has no {SKILL_FILE}")
    _check_tree(source)
    try:
        text = skill_md.read_text(encoding="utf-8")
        doc = parse_skill(text)
        cat = check_category(category) if category else None
    except UnicodeDecodeError as err:
        raise SkillError(f"{SKILL_FILE} is not UTF-8 text") from err
    except SkillFormatError as err:
        raise SkillError(str(err)) from err
    findings: list[Finding] = [*scan_skill(text, doc.front), *scan_folder_files(source)]
    if verdict(findings) is Verdict.REFUSED:
        raise SkillError(
            "refused, nothing installed: "
            + "; ".join(str(f) for f in findings if f.refused)
            + ". Remove the hidden characters or unreadable files and install it again"
        )
    if findings:
        target = store.shared_root / QUARANTINE / doc.name
        _copy_tree(source, target, replace=True)
        reason = "; ".join(str(f) for f in findings)
        return Installed(doc.name, target, None, reason)
    taken = [s for s in store.everything() if s.name == doc.name and s.shared]
    if taken:
        raise SkillError(
            f"a shared skill named {doc.name!r} exists already ({taken[0].path}); "
            f"remove it first with `herald skills rm {doc.name}`"
        )
    target = store.folder_for(doc.name, None, cat)
    _copy_tree(source, target, replace=False)
    change = SkillChange(SkillAction.CREATE, doc.name, None, SKILL_FILE, None, text, cat)
    return Installed(doc.name, target, change)


def quarantined(store: SkillStore) -> list[Skill]:
    """The skills held in quarantine, each with the reason (scanned again)."""
    root = store.shared_root / QUARANTINE
    if not root.is_dir():
        return []
    out: list[Skill] = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink()):
        try:
            text = (folder / SKILL_FILE).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            text = ""
        try:
            front = parse_skill(text).front
        except SkillFormatError:
            front = {}
        findings = [*scan_skill(text, front), *scan_folder_files(folder)]
        reason = "; ".join(str(f) for f in findings) or "held in quarantine"
        refused = verdict(findings) is Verdict.REFUSED
        out.append(
            Skill(folder.name, "", SkillSource.OPERATOR, folder, quarantine=reason, refused=refused)
        )
    return out


def _check_tree(source: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(source):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath, name)
            rel = path.relative_to(source)
            if path.is_symlink():
                raise SkillError(f"{rel} is a symlink; skills may not hold symlinks")
            if path.is_file() and path.stat().st_size > MAX_FILE_BYTES:
                raise SkillError(f"{rel} is larger than {MAX_FILE_BYTES} bytes")


def _copy_tree(source: Path, target: Path, *, replace: bool) -> None:
    """Copy through a staging folder beside the target, then rename into place."""
    if target.exists() and not replace:
        raise SkillError(f"{target} exists already")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".staging-{target.name}-"))
    shutil.rmtree(staging)
    shutil.copytree(source, staging, symlinks=True)
    if target.exists():
        shutil.rmtree(target)
    os.replace(staging, target)
