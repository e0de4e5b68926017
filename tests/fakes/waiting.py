"""Waiting on a fake's state: an asyncio.Event swapped for a fresh one on every change, so
that every waiter wakes up and re-checks its condition."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TypeVar

from starlette.requests import Request

from tests.fakes.params import client_left

T = TypeVar("T")


class Changes:
    """The change signal of one fake, and whether the fake is stopping.

    Single event loop only: created, notified and waited on in the loop that runs the fake.
    """

    def __init__(self) -> None:
        self._changed = asyncio.Event()
        self.stopping = asyncio.Event()
        """Set once the fake stops: ends long polls and control waits."""

    def notify(self) -> None:
        """Wake every waiter: something changed."""
        self._changed.set()
        self._changed = asyncio.Event()

    def stop(self) -> None:
        """Mark the fake stopping and wake every waiter."""
        self.stopping.set()
        self.notify()

    async def wait_for(self, condition: Callable[[], bool], timeout: float | None) -> None:
        """Wait until `condition()` holds, re-checked after every change.

        Raises TimeoutError after `timeout` seconds (None: no limit).
        """
        async with asyncio.timeout(timeout):
            while not condition():
                await self._changed.wait()

    async def wait_for_items(
        self, items: list[T], expected: int | Callable[[T], bool], timeout: float
    ) -> list[T]:
        """Wait until `items` (a list the fake appends to) holds `expected` items (return them
        all) or an item matching `expected` (return the matches); TimeoutError after `timeout`."""
        if isinstance(expected, int):
            count = expected
            await self.wait_for(lambda: len(items) >= count, timeout)
            return list(items)
        predicate = expected
        await self.wait_for(lambda: any(predicate(i) for i in items), timeout)
        return [i for i in items if predicate(i)]

    async def hold(self, request: Request, seconds: float | None, done: Callable[[], bool]) -> bool:
        """Wait until `done()`, `seconds` pass (None: no limit), the client of `request` leaves
        or the fake stops; False when the client left."""
        left = asyncio.create_task(client_left(request))
        left.add_done_callback(lambda _: self.notify())
        try:
            with contextlib.suppress(TimeoutError):
                await self.wait_for(
                    lambda: done() or left.done() or self.stopping.is_set(), seconds
                )
        finally:
            gone = left.done()
            left.cancel()
            await asyncio.gather(left, return_exceptions=True)
        return not gone


class Waitable:
    """A fake whose state changes are signalled by its `_changes`."""

    _changes: Changes

    async def wait_for(self, condition: Callable[[], bool], timeout: float | None = 10.0) -> None:
        """Wait until `condition()` holds; re-checked after every change of the server's state.

        Raises TimeoutError after `timeout` seconds (None: no limit).
        """
        await self._changes.wait_for(condition, timeout)
