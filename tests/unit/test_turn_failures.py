"""How a turn's exception is classified: a lost database connection is tried again later, like
an unreachable model; anything else unknown is an internal error."""

from __future__ import annotations

import sqlite3

from sqlalchemy.exc import InterfaceError, InternalError

from gateway.turns import FailureKind, classify


class AdminShutdown(Exception):
    """What asyncpg raises in a backend terminated by `pg_terminate_backend`."""

    sqlstate = "57P01"


def test_a_lost_connection_is_transient() -> None:
    lost = InterfaceError("select 1", {}, Exception("connection is closed"))
    lost.connection_invalidated = True
    failure = classify(lost, 60)
    assert failure.kind is FailureKind.STORE
    assert failure.transient
    assert "database connection was lost" in failure.error


def test_a_terminated_backend_is_transient() -> None:
    terminated = InternalError("select 1", {}, AdminShutdown("terminating connection"))
    assert classify(terminated, 60).kind is FailureKind.STORE


def test_other_errors_are_internal_and_final() -> None:
    for err in (ValueError("bug"), InternalError("x", {}, sqlite3.IntegrityError("no"))):
        failure = classify(err, 60)
        assert failure.kind is FailureKind.INTERNAL
        assert not failure.transient
