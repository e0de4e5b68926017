"""Fixtures of the agent core tests: memory files under tmp_path and a real SQLite store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent_core.memory import MemoryFiles
from gateway.store import Store


@pytest.fixture
def memory(tmp_path: Path) -> MemoryFiles:
    """Memory files under a fresh state directory."""
    return MemoryFiles(tmp_path / "state")


@pytest.fixture
async def sql_store(tmp_path: Path) -> AsyncIterator[Store]:
    """A migrated SQLite store in tmp_path."""
    async with Store.open(f"sqlite+aiosqlite:///{tmp_path / 'h.db'}") as store:
        yield store
