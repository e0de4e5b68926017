"""`gateway.cli.base.explain`: the one line and the exit code for an error that ended a
command (2: fix the configuration or the machine; 1: anything else)."""

from __future__ import annotations

import asyncio
import errno

import pytest

from gateway.cli.base import explain
from gateway.contracts.errors import (
    ConfigError,
    DatabaseUnavailable,
    InstanceConflict,
    NotReady,
    SetupError,
)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ConfigError("invalid configuration: api.port"), 2),
        (SetupError("cannot listen on 127.0.0.1:8642: Address already in use"), 2),
        (InstanceConflict("another instance runs on this SQLite database"), 2),
        (DatabaseUnavailable("the database server does not answer"), 1),
        (NotReady("telegram: connecting"), 1),
        (PermissionError(errno.EACCES, "Permission denied", "/var/lib/herald"), 2),
        (OSError(errno.EADDRINUSE, "Address already in use"), 2),
        (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), 1),
    ],
)
def test_the_exit_code_says_whether_a_restart_can_help(error: Exception, code: int) -> None:
    failure = explain(error)

    assert failure.code == code
    assert "\n" not in failure.line
    assert str(error.args[-1] if isinstance(error, OSError) else error) in failure.line


def test_a_task_group_failure_is_told_by_its_first_real_error() -> None:
    group = ExceptionGroup(
        "unhandled errors in a TaskGroup",
        [SetupError("cannot listen on 127.0.0.1:8642: Address already in use; set api.port")],
    )
    nested = BaseExceptionGroup("outer", [asyncio.CancelledError(), group])

    failure = explain(nested)

    assert failure == explain(group.exceptions[0])
    assert failure.code == 2


def test_an_unexpected_error_points_at_debug() -> None:
    failure = explain(KeyError("lanes"))

    assert failure.code == 1
    assert failure.line.startswith("unexpected KeyError: 'lanes'")
    assert "herald --debug" in failure.line
