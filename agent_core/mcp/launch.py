"""Starts a local MCP server so that it never outlives Herald, even after a SIGKILL.

Run as `python launch.py <parent pid> <command> [args…]` (by path: it imports nothing of
Herald's). It asks the kernel for SIGTERM when its parent dies (Linux `PR_SET_PDEATHSIG`),
starts the server in a process group of its own sharing its stdin and stdout, and on SIGTERM,
SIGINT, SIGHUP or the server's exit ends the whole group (the server and anything it
started: `npx`'s node, `uvx`'s python), SIGKILL after a grace period. Its exit code is the
server's.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from types import FrameType

PR_SET_PDEATHSIG = 1
GRACE = 2.0


def _die_with_parent(parent: int) -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request took effect
        sys.exit(1)


def _end_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def main(argv: list[str]) -> int:
    """Run the server until it exits or this process is told to stop; its exit code."""
    if len(argv) < 3:
        print("usage: launch.py PARENT_PID COMMAND [ARGS…]", file=sys.stderr)
        return 2
    _die_with_parent(int(argv[1]))
    try:
        child = subprocess.Popen(argv[2:], start_new_session=True)  # noqa: S603 - the configured server
    except OSError as err:
        print(f"cannot start MCP server {argv[2]!r}: {err.strerror}", file=sys.stderr)
        return 127

    def stop(signum: int, frame: FrameType | None) -> None:
        _end_group(child.pid)
        sys.exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    code = child.wait()
    _end_group(child.pid)  # what the server left running
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
