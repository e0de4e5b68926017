"""MemoryFiles: SOUL.md, per-user USER.md / MEMORY.md, edits, caps, isolation, snapshots;
on each place they can be kept (the folder layout of earlier versions, and SQL on both
databases)."""

from __future__ import annotations

import asyncio
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent_core.memory import (
    SOUL_CACHE_SECONDS,
    FolderDocs,
    MemoryEditError,
    MemoryFiles,
    MemoryLimits,
    MemoryOwner,
    MemoryScope,
    memory_owner,
)
from gateway.contracts.ids import SessionKey, UserId
from gateway.store import Store
from gateway.store.memory_docs import SqlMemoryDocs


def owner(user: str) -> MemoryOwner:
    """The memory scope of a person."""
    found = memory_owner(None, UserId(user))
    assert found is not None
    return found


ADA_ID = UserId("u_ada")
ADA = owner("u_ada")
BOB = owner("u_bob")
GROUP_A = SessionKey("telegram:default:-100111")
GROUP_B = SessionKey("telegram:default:-100222")
USER = MemoryScope.USER
NOTES = MemoryScope.MEMORY


@pytest.fixture(
    params=[
        pytest.param("folder", id="folder"),
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
async def memory(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MemoryFiles]:
    """Memory files in a folder, or in SQL on each database."""
    if request.param == "folder":
        yield MemoryFiles(tmp_path / "state")
        return
    if request.param == "sqlite":
        shutil.copyfile(request.getfixturevalue("sqlite_template"), tmp_path / "h.db")
        url = f"sqlite+aiosqlite:///{tmp_path / 'h.db'}"
    else:
        server = request.getfixturevalue("pg_server")
        database = request.getfixturevalue("pg_database")
        server.copy_database(database, request.getfixturevalue("pg_template"))
        url = server.url(database)
    async with Store.open(url) as store:
        yield MemoryFiles(SqlMemoryDocs(store))


async def test_add_appends_entries_as_list_items(memory: MemoryFiles) -> None:
    assert await memory.add(USER, ADA, "Name: Ada") == "saved to user"
    await memory.add(USER, ADA, "Prefers  short\nanswers ")

    assert await memory.read(USER, ADA) == "- Name: Ada\n- Prefers short answers\n"


async def test_read_of_a_missing_file_is_empty(memory: MemoryFiles) -> None:
    assert await memory.read(USER, ADA) == ""
    assert await memory.read(NOTES, None) == ""


async def test_replace_swaps_the_one_entry_containing_the_needle(memory: MemoryFiles) -> None:
    await memory.add(NOTES, ADA, "project: thesis on ferns")
    await memory.add(NOTES, ADA, "deadline: March")

    assert await memory.replace(NOTES, ADA, "ferns", "project: thesis on mosses") == (
        "replaced in memory"
    )

    assert await memory.read(NOTES, ADA) == "- project: thesis on mosses\n- deadline: March\n"


async def test_remove_deletes_the_one_entry_containing_the_needle(memory: MemoryFiles) -> None:
    await memory.add(USER, ADA, "likes tea")
    await memory.add(USER, ADA, "lives in Lyon")

    assert await memory.remove(USER, ADA, "  tea ") == "removed from user"

    assert await memory.read(USER, ADA) == "- lives in Lyon\n"


async def test_a_duplicate_entry_is_refused(memory: MemoryFiles) -> None:
    await memory.add(USER, ADA, "likes tea")
    before = await memory.read(USER, ADA)

    with pytest.raises(MemoryEditError, match="already saved"):
        await memory.add(USER, ADA, "  likes   tea ")

    assert await memory.read(USER, ADA) == before


@pytest.mark.parametrize("entry", ["", "   ", "\n\t"])
async def test_an_empty_entry_is_refused(memory: MemoryFiles, entry: str) -> None:
    with pytest.raises(MemoryEditError, match="empty"):
        await memory.add(USER, ADA, entry)
    assert await memory.read(USER, ADA) == ""


async def test_an_ambiguous_needle_is_refused_and_changes_nothing(memory: MemoryFiles) -> None:
    await memory.add(USER, ADA, "likes green tea")
    await memory.add(USER, ADA, "likes black tea")
    before = await memory.read(USER, ADA)

    with pytest.raises(MemoryEditError, match="2 entries contain 'tea'"):
        await memory.replace(USER, ADA, "tea", "likes coffee")
    with pytest.raises(MemoryEditError, match="give more of the text"):
        await memory.remove(USER, ADA, "likes")

    assert await memory.read(USER, ADA) == before


async def test_a_needle_found_nowhere_is_refused(memory: MemoryFiles) -> None:
    await memory.add(USER, ADA, "likes tea")

    with pytest.raises(MemoryEditError, match="no entry contains 'coffee'"):
        await memory.remove(USER, ADA, "coffee")
    with pytest.raises(MemoryEditError, match="no entry contains"):
        await memory.replace(USER, ADA, "coffee", "likes coffee")

    assert await memory.read(USER, ADA) == "- likes tea\n"


async def test_an_empty_needle_is_refused(memory: MemoryFiles) -> None:
    await memory.add(USER, ADA, "likes tea")

    with pytest.raises(MemoryEditError, match="say which entry"):
        await memory.remove(USER, ADA, "  ")

    assert await memory.read(USER, ADA) == "- likes tea\n"


async def test_replace_by_an_empty_entry_is_refused(memory: MemoryFiles) -> None:
    await memory.add(USER, ADA, "likes tea")

    with pytest.raises(MemoryEditError, match="empty"):
        await memory.replace(USER, ADA, "tea", " ")

    assert await memory.read(USER, ADA) == "- likes tea\n"


async def test_editing_a_missing_file_says_not_found(memory: MemoryFiles) -> None:
    with pytest.raises(MemoryEditError, match="no entry contains"):
        await memory.remove(NOTES, ADA, "anything")
    assert await memory.read(NOTES, ADA) == ""


async def test_the_user_cap_refuses_an_add_and_leaves_the_file_unchanged(
    memory: MemoryFiles,
) -> None:
    files = MemoryFiles(memory.docs, MemoryLimits(user_max_chars=20, memory_max_chars=1_000))
    await files.add(USER, ADA, "a" * 8)  # "- aaaaaaaa\n" is 11 characters
    before = await files.read(USER, ADA)

    with pytest.raises(MemoryEditError, match=r"user memory is full \(22 of 20 characters\)"):
        await files.add(USER, ADA, "b" * 8)

    assert await files.read(USER, ADA) == before
    # The other file has its own cap.
    await files.add(NOTES, ADA, "b" * 8)


async def test_the_memory_cap_refuses_a_growing_replace(memory: MemoryFiles) -> None:
    files = MemoryFiles(memory.docs, MemoryLimits(user_max_chars=1_000, memory_max_chars=20))
    await files.add(NOTES, ADA, "short")
    before = await files.read(NOTES, ADA)

    with pytest.raises(MemoryEditError, match="memory memory is full"):
        await files.replace(NOTES, ADA, "short", "a much longer entry than fits")

    assert await files.read(NOTES, ADA) == before
    # Shrinking is always possible, so a full file can be tidied.
    await files.replace(NOTES, ADA, "short", "s")
    assert await files.read(NOTES, ADA) == "- s\n"


async def test_an_entry_exactly_at_the_cap_fits(memory: MemoryFiles) -> None:
    files = MemoryFiles(memory.docs, MemoryLimits(user_max_chars=10, memory_max_chars=10))
    await files.add(USER, ADA, "x" * 7)  # "- xxxxxxx\n" is 10 characters
    assert len(await files.read(USER, ADA)) == 10


async def test_writes_leave_no_temporary_file(tmp_path: Path) -> None:
    memory = MemoryFiles(tmp_path)
    await memory.add(USER, ADA, "one")
    await memory.replace(USER, ADA, "one", "two")
    await memory.remove(USER, ADA, "two")

    folder = FolderDocs(tmp_path).path(ADA, "user").parent
    assert sorted(p.name for p in folder.iterdir()) == ["USER.md"]
    assert await memory.read(USER, ADA) == ""


async def test_concurrent_adds_keep_every_entry(memory: MemoryFiles) -> None:
    await asyncio.gather(*(memory.add(NOTES, ADA, f"note {i}") for i in range(20)))

    saved = (await memory.read(NOTES, ADA)).splitlines()
    assert sorted(saved) == sorted(f"- note {i}" for i in range(20))


async def test_one_users_files_are_never_visible_to_another(memory: MemoryFiles) -> None:
    await memory.add(USER, ADA, "Ada's secret: allergic to penicillin")
    await memory.add(NOTES, ADA, "Ada's project: thesis")

    assert await memory.read(USER, BOB) == ""
    assert await memory.read(NOTES, BOB) == ""
    assert await memory.snapshot(SessionKey("telegram:default:2"), UserId("u_bob")) == ("", "")
    assert await memory.snapshot(GROUP_A, None) == ("", "")
    # Bob cannot reach Ada's entries by editing either.
    with pytest.raises(MemoryEditError, match="no entry contains"):
        await memory.remove(USER, BOB, "penicillin")
    assert "penicillin" in await memory.read(USER, ADA)


async def test_the_same_entry_may_be_saved_for_two_users(memory: MemoryFiles) -> None:
    await memory.add(USER, ADA, "likes tea")
    await memory.add(USER, BOB, "likes tea")

    assert await memory.read(USER, ADA) == await memory.read(USER, BOB) == "- likes tea\n"


async def test_each_group_chat_has_its_own_scope_never_shared(memory: MemoryFiles) -> None:
    group_a = memory.owner(GROUP_A, None)
    group_b = memory.owner(GROUP_B, None)
    assert group_a is not None
    assert group_b is not None
    await memory.add(USER, group_a, "Carol has asthma")

    assert await memory.read(USER, group_a) == "- Carol has asthma\n"
    assert await memory.read(USER, group_b) == ""
    assert await memory.read(USER, ADA) == ""
    assert await memory.snapshot(GROUP_B, None) == ("", "")
    # A thread of group A is group A; its people's own sessions are theirs.
    assert memory.owner(SessionKey(f"{GROUP_A}:77"), None) == group_a
    assert memory.owner(GROUP_A, ADA_ID) == ADA


async def test_no_person_and_no_group_means_no_memory(memory: MemoryFiles) -> None:
    for key in ("api:stateless:1", "cron:job:abc", None):
        assert memory.owner(key, None) is None
    assert await memory.snapshot(SessionKey("cron:job:abc"), None) == ("", "")
    with pytest.raises(MemoryEditError, match="no memory"):
        await memory.add(NOTES, None, "team standup at 9")


async def test_group_memory_can_be_switched_off(tmp_path: Path) -> None:
    memory = MemoryFiles(tmp_path, group_memory=False)
    assert memory.owner(GROUP_A, None) is None
    assert memory.owner(GROUP_A, ADA_ID) == ADA


async def test_user_ids_with_unsafe_characters_stay_inside_the_memory_folder(
    tmp_path: Path,
) -> None:
    path = FolderDocs(tmp_path).path(owner("../../etc/passwd"), "user")
    assert path.parent.parent == tmp_path / "memory"
    assert "/" not in path.parent.name


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("telegram:42", "telegram_42"),
        ("..", "."),
    ],
)
def test_distinct_users_never_share_a_memory_folder(tmp_path: Path, one: str, other: str) -> None:
    docs = FolderDocs(tmp_path)
    first = docs.path(owner(one), "user")
    second = docs.path(owner(other), "user")
    assert first.parent != second.parent
    for path in (first, second):
        assert path.resolve().parent.parent == (tmp_path / "memory").resolve()


async def test_snapshot_reads_both_files_of_the_user(memory: MemoryFiles) -> None:
    await memory.add(USER, ADA, "Name: Ada")
    await memory.add(NOTES, ADA, "working on: thesis")

    key = SessionKey("telegram:default:1")
    assert await memory.snapshot(key, ADA_ID) == ("- Name: Ada\n", "- working on: thesis\n")


async def test_a_snapshot_does_not_follow_later_edits(memory: MemoryFiles) -> None:
    await memory.add(USER, ADA, "Name: Ada")
    key = SessionKey("telegram:default:1")
    taken = await memory.snapshot(key, ADA_ID)

    await memory.add(USER, ADA, "likes tea")

    assert taken == ("- Name: Ada\n", "")
    assert await memory.snapshot(key, ADA_ID) == ("- Name: Ada\n- likes tea\n", "")


async def test_soul_is_the_builtin_persona_when_absent(memory: MemoryFiles) -> None:
    soul = await memory.soul()
    assert soul.startswith("You are Herald")
    assert soul == soul.strip()


async def test_soul_is_the_builtin_persona_when_blank(memory: MemoryFiles) -> None:
    await memory.set_soul(" \n\n")
    assert (await memory.soul()).startswith("You are Herald")


async def test_soul_is_the_one_set_when_present(memory: MemoryFiles) -> None:
    await memory.set_soul("\nYou are Jeeves, a butler.\n")
    assert await memory.soul() == "You are Jeeves, a butler."


async def test_a_soul_set_elsewhere_shows_within_the_cache_time(memory: MemoryFiles) -> None:
    now = [100.0]
    here = MemoryFiles(memory.docs, clock=lambda: now[0])
    elsewhere = MemoryFiles(memory.docs)  # another instance, or the CLI
    assert (await here.soul()).startswith("You are Herald")
    await elsewhere.set_soul("You are Jeeves.")
    assert (await here.soul()).startswith("You are Herald")  # read moments ago
    now[0] += SOUL_CACHE_SECONDS
    assert await here.soul() == "You are Jeeves."
    await here.set_soul("You are Wooster!")  # set here: at once
    assert await here.soul() == "You are Wooster!"
    await here.set_soul("")
    assert (await here.soul()).startswith("You are Herald")


def test_the_folder_layout_reads_soul_md_from_its_root(tmp_path: Path) -> None:
    (tmp_path / "SOUL.md").write_text("\nYou are Jeeves, a butler.\n", encoding="utf-8")
    assert asyncio.run(MemoryFiles(tmp_path).soul()) == "You are Jeeves, a butler."


async def test_hand_written_lines_are_read_as_entries(memory: MemoryFiles) -> None:
    await memory.docs.edit(ADA, "user", lambda _: "- likes tea\n\nplain line\n")

    await memory.add(USER, ADA, "likes cake")

    assert await memory.read(USER, ADA) == "- likes tea\n- plain line\n- likes cake\n"


EDITOR = """
import asyncio, sys
from pathlib import Path
from agent_core.memory import MemoryFiles, MemoryScope
from gateway.store import Store
from gateway.store.memory_docs import SqlMemoryDocs
async def main():
    if sys.argv[1].startswith("sqlite"):
        async with Store.open(sys.argv[1]) as store:
            await edit(MemoryFiles(SqlMemoryDocs(store)))
    else:
        await edit(MemoryFiles(Path(sys.argv[1])))
async def edit(memory):
    for i in range(40):
        await memory.add(MemoryScope.MEMORY, "g-shared", f"{sys.argv[2]} fact {i}")
asyncio.run(main())
"""


@pytest.mark.parametrize("layout", ["folder", "sqlite"])
async def test_two_processes_editing_one_scope_never_lose_an_edit(
    tmp_path: Path, layout: str
) -> None:
    # Two instances sharing the memory, each adding entries as fast as it can.
    where = str(tmp_path) if layout == "folder" else f"sqlite+aiosqlite:///{tmp_path / 'h.db'}"
    if layout == "sqlite":
        async with Store.open(where):
            pass  # migrated once, before both start
    editors = [
        await asyncio.create_subprocess_exec(sys.executable, "-c", EDITOR, where, name)
        for name in ("first", "second")
    ]
    async with asyncio.timeout(60):
        codes = [await p.wait() for p in editors]
    assert codes == [0, 0]
    if layout == "folder":
        saved = await MemoryFiles(tmp_path).read(NOTES, MemoryOwner("g-shared"))
    else:
        async with Store.open(where) as store:
            saved = await MemoryFiles(SqlMemoryDocs(store)).read(NOTES, MemoryOwner("g-shared"))
    expected = [f"- {name} fact {i}" for name in ("first", "second") for i in range(40)]
    assert sorted(saved.splitlines()) == sorted(expected)
