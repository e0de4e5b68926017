"""Jittered exponential backoff, for reconnects and retries, and logging a repeated failure
once per interval instead of once per try."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    """Jittered exponential backoff: `initial * factor**n`, capped, times a random 0.5-1.0."""

    initial: float = 1.0
    factor: float = 2.0
    maximum: float = 300.0

    def delay(self, attempt: int) -> float:
        """The wait before retry number `attempt` (0-based)."""
        base = min(self.maximum, self.initial * self.factor ** min(attempt, 32))
        return base * random.uniform(0.5, 1.0)


class FailureLog:
    """Logs a failure that repeats once per `interval`, not once per try.

    The first failure of a run is logged (with its traceback unless `expected`); repeats
    within `interval` are counted and summarised in one line when the interval has passed;
    `recovered` ends the run. A run that starts again within `interval` of the last line is
    logged in one line, without a traceback (a flapping failure cannot flood the log either).
    `failures` is the length of the current run (the attempt number of the next backoff).
    """

    def __init__(
        self,
        log: logging.Logger,
        what: str,
        *,
        interval: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = log
        self.what = what
        self.interval = interval
        self.clock = clock
        self.failures = 0
        self._logged_at: float | None = None
        self._recovered_at: float | None = None
        self._unlogged = 0

    def failed(self, err: BaseException, *, expected: bool = False) -> None:
        """Count one failure; log it if it starts a run, or if `interval` has passed since
        the last line. `expected` failures (a network away) never carry a traceback."""
        self.failures += 1
        now = self.clock()
        recent = self._logged_at is not None and now - self._logged_at < self.interval
        if self.failures == 1 and not recent:
            if expected:
                self.log.warning("%s failed: %s", self.what, first_line(err))
            else:
                self.log.error("%s failed: %s", self.what, first_line(err), exc_info=err)
        elif not recent:
            self.log.warning(
                "%s still failing (%d failure(s) in a row, %d not logged): %s: %s",
                self.what,
                self.failures,
                self._unlogged,
                type(err).__name__,
                first_line(err),
            )
        else:
            self._unlogged += 1
            return
        self._logged_at, self._unlogged = now, 0

    def recovered(self) -> None:
        """It works again: ends the current run of failures (logged at most once per
        `interval`)."""
        if not self.failures:
            return
        now = self.clock()
        if self._recovered_at is None or now - self._recovered_at >= self.interval:
            self.log.warning("%s works again after %d failure(s)", self.what, self.failures)
            self._recovered_at = now
        self.failures = 0


def first_line(err: BaseException) -> str:
    """The first line of `err`'s message (SQLAlchemy's add the statement and a link)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else ""
