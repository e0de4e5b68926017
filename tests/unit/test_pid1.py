"""gateway.pid1 outside a container (not PID 1): it only execs the command. Reaping as PID 1
is tested in the image (tests/image, a container started without --init)."""

from __future__ import annotations

import subprocess
import sys


def pid1(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.pid1", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_it_execs_the_command_with_its_exit_code() -> None:
    done = pid1(sys.executable, "-c", "import os, sys; print(os.getpid()); sys.exit(3)")
    assert done.returncode == 3
    assert done.stdout.strip().isdigit()


def test_a_missing_command_says_so() -> None:
    done = pid1("/nonexistent/herald", "run")
    assert done.returncode == 127
    assert "cannot run /nonexistent/herald" in done.stderr


def test_no_command_is_a_usage_error() -> None:
    done = pid1()
    assert done.returncode == 2
    assert "usage" in done.stderr
