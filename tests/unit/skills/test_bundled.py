"""Bundled skills: installed once, upgraded only where unchanged, never re-added."""

from __future__ import annotations

from pathlib import Path

from agent_core.skills.bundled import install_bundled
from agent_core.skills.model import SkillSource
from agent_core.skills.store import SkillStore, read_manifest
from tests.unit.skills.helpers import make_skill


def _ship(source: Path, version: str) -> None:
    for name in ("alpha", "beta", "gamma"):
        make_skill(source, name, body=f"{name} steps, version {version}")


def _text(root: Path, name: str) -> str:
    return (root / name / "SKILL.md").read_text("utf-8")


def test_the_upgrade_rules(tmp_path: Path) -> None:
    source, root = tmp_path / "v1", tmp_path / "state" / "skills"
    _ship(source, "1")
    first = install_bundled(root, source)
    assert first.installed == ["alpha", "beta", "gamma"]
    assert set(read_manifest(root)) == {"alpha", "beta", "gamma"}
    store = SkillStore(tmp_path / "state")
    assert {s.source for s in store.visible(None)} == {SkillSource.BUNDLED}
    # Started again with the same version: nothing to do.
    again = install_bundled(root, source)
    assert (again.installed, again.updated) == ([], [])
    # The user edits alpha and deletes beta; gamma is left alone.
    (root / "alpha" / "SKILL.md").write_text(_text(root, "alpha") + "\nMy own step.\n", "utf-8")
    (root / "beta" / "SKILL.md").unlink()
    (root / "beta").rmdir()
    # A new Herald ships version 2.
    source2 = tmp_path / "v2"
    _ship(source2, "2")
    report = install_bundled(root, source2)
    assert report.updated == ["gamma"]
    assert report.kept == ["alpha"]
    assert report.skipped == ["beta"]
    assert "version 2" in _text(root, "gamma")
    assert "My own step." in _text(root, "alpha")
    assert "version 1" in _text(root, "alpha")
    assert not (root / "beta").exists()


def test_a_users_skill_of_the_same_name_is_not_overwritten(tmp_path: Path) -> None:
    source, root = tmp_path / "v1", tmp_path / "state" / "skills"
    _ship(source, "1")
    make_skill(root, "alpha", body="the user's alpha")
    report = install_bundled(root, source)
    assert report.skipped == ["alpha"]
    assert "the user's alpha" in _text(root, "alpha")
    assert "alpha" not in read_manifest(root)


def test_the_shipped_bundle_installs(tmp_path: Path) -> None:
    root = tmp_path / "state" / "skills"
    report = install_bundled(root)
    assert "daily-briefing" in report.installed
    store = SkillStore(tmp_path / "state")
    names = {s.name for s in store.visible(None)}
    assert {"daily-briefing", "summarize-thread", "draft-email-reply"} <= names
    assert all(s.usable for s in store.everything())
