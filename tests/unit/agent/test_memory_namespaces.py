"""A profile's memory namespace: the same person has other files there, SOUL.md included
(or the persona set in config), and agent-written skills follow the namespace."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent_core.memory import (
    MemoryDocs,
    MemoryFiles,
    MemoryScope,
    NamespacedDocs,
    default_soul,
    namespaced,
    person,
)
from gateway.contracts.ids import SessionKey, UserId
from gateway.store import Store
from gateway.store.memory_docs import SqlMemoryDocs

ADA = UserId("u_ada")
KEY = SessionKey("telegram:default:1")


@pytest.fixture
async def docs(sqlite_template: Path, tmp_path: Path) -> AsyncIterator[SqlMemoryDocs]:
    """The memory documents in SQL (as the daemon keeps them)."""
    shutil.copyfile(sqlite_template, tmp_path / "h.db")
    async with Store.open(f"sqlite+aiosqlite:///{tmp_path / 'h.db'}") as store:
        yield SqlMemoryDocs(store)


def files(docs: MemoryDocs, namespace: str | None, soul: str | None = None) -> MemoryFiles:
    if namespace is None:
        return MemoryFiles(docs)
    return MemoryFiles(NamespacedDocs(docs, namespace, soul), namespace=namespace)


async def test_each_namespace_keeps_its_own_files(docs: SqlMemoryDocs) -> None:
    default, work = files(docs, None), files(docs, "work")
    await work.add(MemoryScope.USER, person(ADA), "Works on Herald")
    assert await work.read(MemoryScope.USER, person(ADA)) == "- Works on Herald\n"
    assert await default.read(MemoryScope.USER, person(ADA)) == ""
    assert await files(docs, "family").read(MemoryScope.USER, person(ADA)) == ""
    # Profiles naming the same namespace share it.
    assert await files(docs, "work").read(MemoryScope.USER, person(ADA)) != ""


async def test_soul_is_per_namespace_or_from_config(docs: SqlMemoryDocs) -> None:
    default, work = files(docs, None), files(docs, "work")
    await default.set_soul("You are the default.")
    assert await work.soul() == default_soul()
    await work.set_soul("You are Ledger.")
    assert await work.soul() == "You are Ledger."
    assert await files(docs, None).soul() == "You are the default."
    configured = files(docs, "family", soul="You are Hearth.")
    assert await configured.soul() == "You are Hearth."
    with pytest.raises(ValueError, match="set in the config file"):
        await configured.set_soul("something else")


def test_agent_written_skills_follow_the_namespace(docs: SqlMemoryDocs) -> None:
    assert files(docs, None).skill_owner(KEY, ADA) == person(ADA)
    assert files(docs, "work").skill_owner(KEY, ADA) == f"p-work.{person(ADA)}"
    assert files(docs, "work").skill_owner("api:stateless:x", None) is None
    assert namespaced(None, "u-x") == "u-x"
