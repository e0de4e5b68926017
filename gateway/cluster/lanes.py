"""Session lanes across instances: at most one instance runs a session's turns.

The contract is `gateway.store.abc.Lanes`. On SQLite there is one instance: `SoloLanes`
keeps lanes in memory only. Instances sharing PostgreSQL claim them in the `lanes` table
(`gateway.store.lanes.SqlLanes`).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.contracts.ids import SessionKey, TurnId
from gateway.store.abc import Lanes

__all__ = ["Claim", "LaneState", "Lanes", "SoloLanes"]


@dataclass(frozen=True, slots=True)
class Claim:
    """This instance runs the session's turns until it releases the claim."""

    key: SessionKey
    token: int


@dataclass(frozen=True, slots=True)
class LaneState:
    """Who runs a session now, as another instance sees it."""

    owner: str | None
    """A live instance holding the lane, or None when it is free (or its owner is gone)."""
    running: bool
    """Whether that instance is running a turn of the session now."""
    turn_id: TurnId | None = None
    """That turn."""


class SoloLanes:
    """One instance: every claim succeeds, nothing is written."""

    @property
    def clustered(self) -> bool:
        """False: this process is the only instance."""
        return False

    async def claim(self, key: SessionKey) -> Claim | None:
        """Always granted."""
        return Claim(key, 0)

    async def release(self, claim: Claim) -> None:
        """Nothing to do."""

    async def check(self, conn: AsyncConnection, claim: Claim, turn_id: TurnId | None) -> None:
        """Always holds."""

    async def state(self, conn: AsyncConnection, key: SessionKey) -> LaneState:
        """No other instance."""
        return LaneState(None, False)

    async def request_cancel(
        self, conn: AsyncConnection, key: SessionKey, turn_id: TurnId, reason: str
    ) -> None:
        """Never needed: the turn runs here and is cancelled directly."""

    async def cancel_requested(self, claim: Claim) -> str | None:
        """Never asked."""
        return None

    async def orphans(self, limit: int = 200, *, started: bool = False) -> list[SessionKey]:
        """Startup recovery finds them instead (`Inbox.recover`)."""
        return []
