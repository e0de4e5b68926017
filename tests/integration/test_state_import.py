"""`herald state import` and the skill folders as a cache of the database: an older
install's state directory (made by the code of earlier versions: files under `state_dir`)
moves into the database once, even when stopped halfway; a cache never brings back what the
database no longer holds; a wiped state directory loses nothing (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest
import yaml
from sqlalchemy import func, select

from agent_core.memory import FolderDocs, MemoryFiles, MemoryOwner, MemoryScope
from agent_core.skills.model import SkillAction
from agent_core.skills.service import Actor, Author, Request, Skills
from agent_core.skills.store import SkillStore
from gateway.state import import_state
from gateway.store import Store
from gateway.store.memory_docs import SqlMemoryDocs
from gateway.store.skill_files import SkillMirror
from gateway.store.tables import memory_docs, skill_files
from tests.unit.skills.helpers import make_skill, skill_text

pytestmark = pytest.mark.timeout(120)

ANN = MemoryOwner("u-ann")


async def old_state(root: Path, people: int = 2) -> None:
    """A state directory as earlier versions left it: SOUL.md, memory files, a shared and
    a personal skill."""
    old = MemoryFiles(root)
    await old.add(MemoryScope.USER, ANN, "Ann takes tea")
    await old.add(MemoryScope.MEMORY, ANN, "budget due Friday")
    for i in range(people - 1):
        await old.add(MemoryScope.USER, MemoryOwner(f"u-p{i}"), f"person {i} likes jazz")
    _old_files(root)


def _old_files(root: Path) -> None:
    (root / "SOUL.md").write_text("You are Jeeves.\n", encoding="utf-8")
    make_skill(root / "skills", "standup", "Run the standup.")
    make_skill(root / "memory" / ANN / "skills", "tea-ritual", "How Ann likes tea.")
    (root / "skills" / "standup" / "scripts").mkdir()
    (root / "skills" / "standup" / "scripts" / "notes.py").write_text("print('hi')\n")


async def test_an_older_state_directory_moves_in_once(store: Store, tmp_path: Path) -> None:
    state = tmp_path / "state"
    await old_state(state)
    # Ann already has a memory in the database (another machine imported first).
    memory = MemoryFiles(SqlMemoryDocs(store))
    await memory.add(MemoryScope.USER, ANN, "Ann lives in Lyon")

    done = await import_state(state, store)

    assert "SOUL.md" in done.moved
    assert f"memory/{ANN}/USER.md" in done.moved
    assert "skills/standup/SKILL.md" in done.moved
    assert "skills/standup/scripts/notes.py" in done.moved
    assert f"memory/{ANN}/skills/tea-ritual/SKILL.md" in done.moved
    assert done.kept == []
    assert await memory.soul() == "You are Jeeves."
    assert await memory.read(MemoryScope.USER, ANN) == "- Ann lives in Lyon\n- Ann takes tea\n"
    assert await memory.read(MemoryScope.MEMORY, ANN) == "- budget due Friday\n"
    # Memory files are gone once read back; the skill folders stay, as the cache.
    assert not (state / "SOUL.md").exists()
    assert not FolderDocs(state).path(ANN, "user").exists()
    assert (state / "skills" / "standup" / "SKILL.md").is_file()

    again = await import_state(state, store)
    assert (again.moved, again.kept) == ([], [])
    assert await memory.read(MemoryScope.USER, ANN) == "- Ann lives in Lyon\n- Ann takes tea\n"

    # Another machine with a wiped state directory sees all of it.
    other = tmp_path / "other"
    skills = Skills(SkillStore(other), sync=SkillMirror(store, other))
    await skills.refresh()
    assert "standup" in skills.index(None)
    assert "tea-ritual" in skills.index(ANN)
    assert (other / "skills" / "standup" / "scripts" / "notes.py").read_text() == "print('hi')\n"


async def test_a_persona_that_differs_from_the_database_is_kept_and_said(
    store: Store, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    await old_state(state)
    await MemoryFiles(SqlMemoryDocs(store)).set_soul("You are Wooster.")

    done = await import_state(state, store)

    assert [line.split(":")[0] for line in done.kept] == ["SOUL.md"]
    assert "herald memory soul --set" in done.kept[0]
    assert (state / "SOUL.md").is_file()
    assert await MemoryFiles(SqlMemoryDocs(store)).soul() == "You are Wooster."


async def test_a_cache_never_brings_back_what_the_database_deleted(
    store: Store, tmp_path: Path
) -> None:
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a = Skills(SkillStore(a_dir), sync=SkillMirror(store, a_dir))
    b = Skills(SkillStore(b_dir), sync=SkillMirror(store, b_dir))
    operator = Actor(None, Author.OPERATOR)
    await a.manage(Request(SkillAction.CREATE, "standup", skill_text("standup")), operator)
    await b.refresh()
    assert "standup" in b.index(None)

    # B is down while A deletes the skill; B comes back with its old cache.
    await a.manage(Request(SkillAction.DELETE, "standup"), operator)
    restarted = Skills(SkillStore(b_dir), sync=SkillMirror(store, b_dir))
    assert (await import_state(b_dir, store)).moved == []
    await restarted.refresh()
    assert "standup" not in restarted.index(None)
    assert not (b_dir / "skills" / "standup").exists()
    # B's next write does not bring it back either.
    await restarted.manage(Request(SkillAction.CREATE, "retro", skill_text("retro")), operator)
    await a.refresh()
    assert "retro" in a.index(None)
    assert "standup" not in a.index(None)
    async with store.read() as conn:
        folders = set((await conn.execute(select(skill_files.c.folder))).scalars())
    assert "standup" not in folders


class FailingSync:
    """A database that cannot be read."""

    async def refresh(self) -> None:
        raise ConnectionError("database down")

    def writing(self) -> object:
        raise AssertionError("not used")


async def test_skills_are_read_from_the_cache_when_the_database_is_down(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    make_skill(tmp_path / "skills", "standup", "Run the standup.")
    skills = Skills(SkillStore(tmp_path), sync=FailingSync())  # type: ignore[arg-type]
    await skills.refresh()
    assert "standup" in skills.index(None)
    assert "the local copy is used" in caplog.text


IMPORT = "import sys; from gateway.cli.main import app; sys.argv[0] = 'herald'; app()"


async def test_an_import_killed_halfway_moves_each_file_once(tmp_path: Path) -> None:
    state = tmp_path / "state"
    people = 200
    await old_state(state, people=people)
    url = f"sqlite+aiosqlite:///{tmp_path / 'herald.db'}"
    config = tmp_path / "herald.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(state), "database_url": url}))
    async with Store.open(url) as store:

        async def stored() -> int:
            async with store.read() as conn:
                return int(await conn.scalar(select(func.count()).select_from(memory_docs)) or 0)

        first = await asyncio.create_subprocess_exec(
            sys.executable, "-c", IMPORT, "state", "import", "--config", str(config),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        async with asyncio.timeout(60):
            while await stored() < 20:
                await asyncio.sleep(0.005)
        first.send_signal(signal.SIGKILL)
        assert await first.wait() == -signal.SIGKILL
        at_kill = await stored()
        assert at_kill < people + 2, "the kill came after the last file"

        second = await asyncio.create_subprocess_exec(
            sys.executable, "-c", IMPORT, "state", "import", "--config", str(config),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        async with asyncio.timeout(60):
            out, _ = await second.communicate()
        assert second.returncode == 0, out.decode()

        memory = MemoryFiles(SqlMemoryDocs(store))
        assert await memory.soul() == "You are Jeeves."
        assert await memory.read(MemoryScope.USER, ANN) == "- Ann takes tea\n"
        for i in range(people - 1):
            text = await memory.read(MemoryScope.USER, MemoryOwner(f"u-p{i}"))
            assert text == f"- person {i} likes jazz\n", i
        assert await stored() == people + 2  # SOUL.md, Ann's two, one each for the others
        assert not list((state / "memory").glob("*/*.md"))
        moved = [line for line in out.decode().splitlines() if line.startswith("moved ")]
        assert len(moved) + at_kill >= people + 2
        assert len(set(moved)) == len(moved)
