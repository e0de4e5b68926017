"""The scheduler's clock: injectable, so tests move time without waiting."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Protocol

from gateway.contracts.messages import utcnow

MAX_NAP = 60.0
"""A long wait is cut in naps, so a changed system clock is noticed within a minute."""


class Clock(Protocol):
    """What the scheduler asks of time."""

    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""
        ...

    async def sleep_until(self, when: datetime) -> None:
        """Return once `now() >= when` (at once when it already is)."""
        ...


class SystemClock:
    """Wall-clock time."""

    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""
        return utcnow()

    async def sleep_until(self, when: datetime) -> None:
        """Sleep until `when`, in naps of at most a minute."""
        while True:
            left = (when - utcnow()).total_seconds()
            if left <= 0:
                return
            await asyncio.sleep(min(left, MAX_NAP))
