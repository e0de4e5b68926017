"""Whether the database takes writes: a full disk or a read-only database, seen by `/health`.

`Store.write` reports every write here. A write that fails because the disk (or the database's
size limit) is full, or because the database or its filesystem is read-only, marks the store
degraded; the next write that commits clears it. Other errors (constraint violations, lost
connections, the caller's own exceptions) say nothing about space and change nothing.
"""

from __future__ import annotations

import errno
import logging
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from gateway.contracts.messages import utcnow

logger = logging.getLogger(__name__)

SQLSTATE_PROBLEMS = {"53100": "disk full", "25006": "read-only"}
"""PostgreSQL's disk_full and read_only_sql_transaction (a standby, or a read-only default)."""


class WriteProblem(StrEnum):
    """Why the database refuses writes."""

    DISK_FULL = "disk full"
    READ_ONLY = "read-only"


def classify(err: BaseException) -> WriteProblem | None:
    """The write problem `err` (or an error it was raised from) reports, or None."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        found = _one(current)
        if found is not None:
            return found
        current = current.__cause__ or current.__context__ or getattr(current, "orig", None)
    return None


LOST_CONNECTION_STATES = ("08", "57P01", "57P02", "57P03")
"""PostgreSQL's connection exceptions, and its admin, crash and startup shutdowns: a
connection terminated (`pg_terminate_backend`) or a server restarting."""


def connection_lost(err: BaseException) -> bool:
    """Whether `err` (or an error it was raised from) says the database connection was lost or
    refused: the same work may succeed on a new connection later."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if getattr(current, "connection_invalidated", False) is True:
            return True
        if isinstance(current, ConnectionError):
            return True
        state = getattr(current, "sqlstate", None) or getattr(current, "pgcode", None)
        if isinstance(state, str) and state.startswith(LOST_CONNECTION_STATES):
            return True
        current = current.__cause__ or current.__context__ or getattr(current, "orig", None)
    return False


def _one(err: BaseException) -> WriteProblem | None:
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return WriteProblem.DISK_FULL
    if isinstance(err, OSError) and err.errno == errno.EROFS:
        return WriteProblem.READ_ONLY
    name = str(getattr(err, "sqlite_errorname", ""))
    if name == "SQLITE_FULL":
        return WriteProblem.DISK_FULL
    if name.startswith("SQLITE_READONLY"):
        return WriteProblem.READ_ONLY
    state = getattr(err, "sqlstate", None) or getattr(err, "pgcode", None)
    if isinstance(state, str) and state in SQLSTATE_PROBLEMS:
        return WriteProblem(SQLSTATE_PROBLEMS[state])
    text = str(err).lower()
    if "database or disk is full" in text or "no space left on device" in text:
        return WriteProblem.DISK_FULL
    if "readonly database" in text or "read-only transaction" in text:
        return WriteProblem.READ_ONLY
    return None


@dataclass(frozen=True, slots=True)
class Degraded:
    """Writes fail: why, since when, how many failed, and the last error."""

    problem: WriteProblem
    since: datetime
    failures: int
    error: str

    def describe(self) -> str:
        """One line for `/health` and the log."""
        return (
            f"degraded ({self.problem} since {self.since.isoformat(timespec='seconds')}; "
            f"{self.failures} write(s) failed, last: {self.error[:200]})"
        )


class StoreHealth:
    """The outcome of the latest writes: `degraded` is None while they commit."""

    def __init__(self) -> None:
        self.degraded: Degraded | None = None

    def failed(self, err: BaseException) -> None:
        """A write raised `err`: mark the store degraded when `err` says the disk is full or
        the database read-only (logged once, when it starts)."""
        problem = classify(err)
        if problem is None:
            return
        error = f"{type(err).__name__}: {err}".splitlines()[0]
        current = self.degraded
        if current is None or current.problem is not problem:
            self.degraded = Degraded(problem, utcnow(), 1, error)
            logger.error(
                "the database refuses writes (%s): %s; Herald retries, backing off. Free space "
                "(or make the database writable) and it resumes by itself",
                problem,
                error,
            )
        else:
            self.degraded = Degraded(problem, current.since, current.failures + 1, error)

    def succeeded(self) -> None:
        """A write committed: the store takes writes again."""
        current = self.degraded
        if current is not None:
            self.degraded = None
            logger.warning(
                "the database takes writes again (%s since %s, %d write(s) failed)",
                current.problem,
                current.since.isoformat(timespec="seconds"),
                current.failures,
            )

    def describe(self) -> str:
        """`ok`, or `degraded (…)` with the problem, since when and the last error."""
        return "ok" if self.degraded is None else self.degraded.describe()
