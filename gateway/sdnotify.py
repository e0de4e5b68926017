"""The systemd notify protocol (sd_notify(3)) over its AF_UNIX datagram socket, without libsystemd.

The service manager passes the socket in `NOTIFY_SOCKET` and, with `WatchdogSec=`, the watchdog
period in `WATCHDOG_USEC` (and the pid it applies to in `WATCHDOG_PID`). Outside systemd every
call here is a no-op, so the daemon can call it unconditionally.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Mapping

logger = logging.getLogger(__name__)


def _socket_address(value: str) -> str | None:
    """The AF_UNIX address named by `NOTIFY_SOCKET`, or None when unset or not AF_UNIX."""
    if not value:
        return None
    if value.startswith("@"):
        # The abstract namespace: a leading NUL byte instead of a file system path.
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    # Newer systemd also speaks AF_VSOCK ("vsock:CID:PORT"); Herald never runs under that.
    logger.warning("NOTIFY_SOCKET=%r is not an AF_UNIX address; not notifying systemd", value)
    return None


def _watchdog_interval(environ: Mapping[str, str], pid: int) -> float | None:
    """Half of `WATCHDOG_USEC` in seconds, or None when unset, invalid or meant for another pid."""
    usec_text = environ.get("WATCHDOG_USEC", "")
    if not usec_text:
        return None
    try:
        usec = int(usec_text)
        watchdog_pid = int(environ["WATCHDOG_PID"]) if environ.get("WATCHDOG_PID") else pid
    except ValueError:
        logger.warning("ignoring a malformed WATCHDOG_USEC / WATCHDOG_PID")
        return None
    if usec <= 0 or watchdog_pid != pid:
        return None
    return usec / 2 / 1_000_000


class SystemdNotifier:
    """Tells the service manager about readiness, stopping, status and liveness.

    Built from an environment mapping (normally `os.environ`). Sends never block and never
    raise: an unreachable socket is logged as a warning once and otherwise ignored.
    """

    def __init__(self, environ: Mapping[str, str], *, pid: int | None = None) -> None:
        """Read `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID`; `pid` defaults to ours."""
        self._address = _socket_address(environ.get("NOTIFY_SOCKET", ""))
        own_pid = os.getpid() if pid is None else pid
        self._interval = _watchdog_interval(environ, own_pid) if self._address is not None else None
        self._warned = False
        self._withholding = False

    @property
    def enabled(self) -> bool:
        """True when a notify socket is configured (the process runs under `Type=notify`)."""
        return self._address is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between watchdog pings (half of `WATCHDOG_USEC`), or None without a watchdog."""
        return self._interval

    def ready(self) -> None:
        """Send `READY=1`: startup is complete and the service is serving."""
        self.notify("READY=1")

    def stopping(self) -> None:
        """Send `STOPPING=1`: the service has begun its shutdown (the drain)."""
        self.notify("STOPPING=1")

    def status(self, text: str) -> None:
        """Send `STATUS=<text>`, shown by `systemctl status`; newlines become spaces."""
        self.notify("STATUS=" + " ".join(text.splitlines()))

    def watchdog(self) -> None:
        """Send `WATCHDOG=1`: the service is alive; resets the service manager's watchdog timer."""
        self.notify("WATCHDOG=1")

    def notify(self, message: str) -> None:
        """Send one datagram of newline-separated `KEY=VALUE` assignments; a no-op when disabled."""
        if self._address is None:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.setblocking(False)
                sock.sendto(message.encode("utf-8"), self._address)
        except OSError as err:
            if not self._warned:
                self._warned = True
                logger.warning(
                    "cannot notify systemd at %r: %s (further failures are not logged)",
                    self._address.replace("\0", "@", 1),
                    err,
                )

    async def run_watchdog(self, healthy: Callable[[], bool]) -> None:
        """Ping every `watchdog_interval` while `healthy()` is true; run until cancelled.

        Returns at once when no watchdog is configured. While `healthy()` is false (or raises),
        pings are withheld so that systemd's watchdog fires and restarts the service.
        """
        interval = self._interval
        if interval is None:
            return
        while True:
            if self._is_healthy(healthy):
                if self._withholding:
                    logger.warning("healthy again: resuming watchdog pings")
                    self._withholding = False
                self.watchdog()
            elif not self._withholding:
                logger.warning("unhealthy: withholding watchdog pings")
                self._withholding = True
            await asyncio.sleep(interval)

    @staticmethod
    def _is_healthy(healthy: Callable[[], bool]) -> bool:
        try:
            return healthy()
        except Exception:
            logger.exception("health check failed; treating the service as unhealthy")
            return False
