"""`python3 -m gateway.pid1 herald run`: the container image's entrypoint.

As PID 1 of a container started without `--init` (docker and podman without the flag,
Kubernetes), nothing else would reap the processes that end up orphaned: the children an MCP
server or a tool leaves behind stay zombies for the container's life. So there it starts the
command as its only child, passes on the signals a container gets, reaps every process that
ends, and exits with the command's exit code (128 + the signal when a signal killed it).
Under any other PID (an init in front: `--init`, compose's `init: true`) it only execs the
command. It imports nothing of Herald: the resident parent stays small.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
"""The signals passed on to the command (SIGKILL and SIGSTOP cannot be caught)."""


def _exec(argv: list[str]) -> int:
    try:
        os.execvp(argv[0], argv)  # noqa: S606 (the image's own entrypoint, no shell)
    except OSError as err:
        print(f"error: cannot run {argv[0]}: {err.strerror}", file=sys.stderr)
    return 127


def main(argv: list[str]) -> int:
    """Run `argv` as PID 1's child (reaping orphans), or exec it under any other PID."""
    if not argv:
        print("usage: python3 -m gateway.pid1 COMMAND [ARG...]", file=sys.stderr)
        return 2
    if os.getpid() != 1:
        return _exec(argv)
    # Signals wait until the handlers know the child: PID 1 drops those it has no handler for.
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    child = os.fork()
    if child == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
        os._exit(_exec(argv))

    def forward(number: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):  # it has ended; the loop below sees it
            os.kill(child, number)

    for number in FORWARDED:
        signal.signal(number, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 0  # no child left (cannot happen while the command runs)
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
