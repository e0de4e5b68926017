"""A clock that moves only when the test says so (the scheduler's `Clock`)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta


class FakeClock:
    """`now()` is whatever the test set; `sleep_until` returns once the test moves past it."""

    def __init__(self, start: datetime) -> None:
        assert start.tzinfo is not None, "the fake clock keeps aware UTC times"
        self._now = start
        self._moved = asyncio.Event()

    def now(self) -> datetime:
        """The current fake time."""
        return self._now

    async def sleep_until(self, when: datetime) -> None:
        """Wait until the test has moved the clock to `when` or later."""
        while self._now < when:
            moved = self._moved
            await moved.wait()

    def set(self, when: datetime) -> None:
        """Move the clock to `when` (never backwards) and wake every sleeper."""
        assert when >= self._now, "the fake clock never goes backwards"
        self._now = when
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()

    def advance(self, delta: timedelta) -> None:
        """Move the clock forward by `delta`."""
        self.set(self._now + delta)
