"""Keeping the skill folders in step with where skills are really kept.

The folders under the state directory are what `SkillStore` reads and writes. Where several
instances share one database, those folders are a cache of it: `SkillSync.refresh` brings the
cache up to date before skills are read, and every write runs inside `SkillSync.writing`,
one writer at a time across every instance, so that what it changed is stored before anyone
else writes. `NoSync`: a Herald whose folders are the only copy (tests, tools).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Protocol


class SkillSync(Protocol):
    """Where skills are kept besides the local folders."""

    async def refresh(self) -> None:
        """Bring the local folders up to date (cheap when nothing changed)."""
        ...

    def writing(self) -> AbstractAsyncContextManager[None]:
        """One writer at a time everywhere: refreshed on entry, what the block changed in
        the local folders stored on a clean exit."""
        ...


class NoSync:
    """The local folders are the only copy."""

    async def refresh(self) -> None:
        return None

    @contextlib.asynccontextmanager
    async def writing(self) -> AsyncIterator[None]:
        yield
