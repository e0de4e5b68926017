"""The command menu: built-in commands, then shared skills, in Telegram's rules."""

from __future__ import annotations

from pathlib import Path

from adapters.telegram.convert import menu_entries
from agent_core.skills.service import Skills
from agent_core.skills.store import SkillStore
from gateway.commands import chat_menu
from tests.unit.skills.helpers import make_skill


def test_the_menu_holds_shared_skills_only(tmp_path: Path) -> None:
    make_skill(tmp_path / "skills", "daily-briefing", "A morning briefing. " * 30)
    make_skill(tmp_path / "skills", "help", "Shadows a built-in command.")
    make_skill(tmp_path / "memory" / "u-ada" / "skills", "adas-secret", "Private.")
    entries = chat_menu(Skills(SkillStore(tmp_path)))
    names = [n for n, _ in entries]
    assert names[:2] == ["new", "stop"]
    assert "daily_briefing" in names
    assert "adas_secret" not in names
    assert names.count("help") == 1
    assert chat_menu(None) == chat_menu(Skills(SkillStore(tmp_path / "none")))


def test_menu_entries_follow_telegrams_rules() -> None:
    entries = menu_entries(
        [
            ("daily-briefing", "  x  "),
            ("DAILY_BRIEFING", "a repeat"),
            ("way-too-long-" + "x" * 40, "d"),
            ("ok", "d" * 300),
            ("empty", ""),
        ]
    )
    assert entries[0] == ("daily_briefing", "x")
    assert [n for n, _ in entries] == ["daily_briefing", "ok", "empty"]
    assert len(entries[1][1]) == 256
    assert entries[2][1] == "empty"
    assert len(menu_entries((f"c{i}", "d") for i in range(150))) == 100
