"""Which errors mean the database refuses writes, and `FailureLog`: a repeated failure is
logged once per interval."""

from __future__ import annotations

import errno
import logging
import sqlite3

import pytest

from gateway.backoff import FailureLog
from gateway.store.health import StoreHealth, WriteProblem, classify


class PgError(Exception):
    """What asyncpg raises: the SQLSTATE in `sqlstate`."""

    def __init__(self, message: str, sqlstate: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


def sqlite_error(message: str, name: str) -> sqlite3.OperationalError:
    err = sqlite3.OperationalError(message)
    err.sqlite_errorname = name
    return err


def wrapped(cause: BaseException) -> RuntimeError:
    """`cause` as the driver wraps it (raise … from …)."""
    try:
        raise RuntimeError("(wrapped) statement failed") from cause
    except RuntimeError as err:
        return err


@pytest.mark.parametrize(
    ("err", "problem"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), WriteProblem.DISK_FULL),
        (OSError(errno.EROFS, "Read-only file system"), WriteProblem.READ_ONLY),
        (sqlite_error("database or disk is full", "SQLITE_FULL"), WriteProblem.DISK_FULL),
        (
            sqlite_error("attempt to write a readonly database", "SQLITE_READONLY"),
            WriteProblem.READ_ONLY,
        ),
        (PgError("could not extend file", "53100"), WriteProblem.DISK_FULL),
        (PgError("cannot execute INSERT in a transaction", "25006"), WriteProblem.READ_ONLY),
        (wrapped(sqlite_error("database or disk is full", "SQLITE_FULL")), WriteProblem.DISK_FULL),
        (sqlite3.OperationalError("database is locked"), None),
        (PgError("duplicate key", "23505"), None),
        (OSError(errno.ECONNREFUSED, "Connection refused"), None),
        (ValueError("a bug"), None),
    ],
)
def test_classify(err: BaseException, problem: WriteProblem | None) -> None:
    assert classify(err) is problem


def test_store_health_is_degraded_from_a_refused_write_until_one_commits() -> None:
    health = StoreHealth()
    health.failed(ValueError("not about space"))
    assert health.describe() == "ok"

    health.failed(OSError(errno.ENOSPC, "No space left on device"))
    health.failed(OSError(errno.ENOSPC, "No space left on device"))
    degraded = health.degraded
    assert degraded is not None
    assert (degraded.problem, degraded.failures) == (WriteProblem.DISK_FULL, 2)
    assert health.describe().startswith("degraded (disk full since ")

    health.succeeded()
    assert (health.degraded, health.describe()) == (None, "ok")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_failure_log_logs_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = FailureLog(logging.getLogger("test.failures"), "the thing", interval=60, clock=clock)
    with caplog.at_level(logging.INFO, logger="test.failures"):
        for _ in range(100):  # a hundred tries in a few seconds: one line
            log.failed(OSError(errno.ENOSPC, "No space left on device"))
            clock.now += 0.05
        clock.now += 60
        log.failed(OSError(errno.ENOSPC, "No space left on device"))
        log.recovered()
        # Flapping: failing again at once, then working again, many times over.
        for _ in range(50):
            log.failed(OSError(errno.ENOSPC, "No space left on device"))
            log.recovered()

    messages = [(r.levelno, r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert messages == [
        (logging.ERROR, "the thing failed: [Errno 28] No space left on device", True),
        (
            logging.WARNING,
            "the thing still failing (101 failure(s) in a row, 99 not logged): OSError: "
            "[Errno 28] No space left on device",
            False,
        ),
        (logging.WARNING, "the thing works again after 101 failure(s)", False),
    ]
    assert log.failures == 0


def test_an_expected_failure_has_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    log = FailureLog(logging.getLogger("test.failures"), "heartbeat")
    with caplog.at_level(logging.INFO, logger="test.failures"):
        log.failed(ConnectionError("database away"), expected=True)

    [record] = caplog.records
    assert (record.levelno, record.getMessage(), record.exc_info) == (
        logging.WARNING,
        "heartbeat failed: database away",
        None,
    )
