"""Signals between instances: PostgreSQL LISTEN/NOTIFY on one channel.

A signal names a session key and an action (`SignalAction`: wake, steer, interrupt, cancel)
or the outbox (`outbox`: new chunks were committed). It is published inside the transaction that
made it necessary, so it is delivered exactly when that commits. Signals are hints: the
state is in SQL, and every instance also looks for orphaned work on a timer, so a signal
lost with a dropped connection delays work by at most `cluster.scan_interval`.

Signals are not trusted: any role that may connect to the database can NOTIFY on the
channel. A receiver acts only on what it re-reads from tables only Herald's role writes (a
cancel is the lane's `cancel` column, a steer the inbox row), so a forged signal at worst
wakes it for a read that finds nothing. A payload that is not a signal is ignored, counted
(`on_ignored`) and logged at most once a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import asyncpg
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.backoff import Backoff

logger = logging.getLogger(__name__)

CHANNEL = "herald"
HEALTH_INTERVAL = 5.0
"""Seconds between checks that the listening connection still answers."""
IGNORED_LOG_INTERVAL = 60.0
"""At most one log line per this many seconds about ignored signals."""


class SignalAction(StrEnum):
    """What a signal asks of the instance that receives it."""

    WAKE = "wake"
    """New messages wait for the session."""
    STEER = "steer"
    """A message arrived for the running turn to take in."""
    INTERRUPT = "interrupt"
    """A newer message interrupts the running turn."""
    CANCEL = "cancel"
    """Cancel the running turn (and drop what waits: `/stop`)."""
    RESYNC = "resync"
    """Signals may have been missed: look at the state in SQL again (every instance)."""
    OUTBOX = "outbox"
    """New chunks were committed (every instance's delivery worker)."""


@dataclass(frozen=True, slots=True, init=False)
class Signal:
    """A hint for the instance that runs `key` (or for every instance: `outbox`, `resync`)."""

    action: SignalAction
    key: str
    reason: str
    origin: str

    def __init__(
        self, action: SignalAction | str, key: str = "", reason: str = "", origin: str = ""
    ) -> None:
        """Raise ValueError when `action` is not a `SignalAction` value."""
        object.__setattr__(self, "action", SignalAction(action))
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "origin", origin)

    def encode(self) -> str:
        """The NOTIFY payload."""
        return json.dumps(
            {"a": str(self.action), "k": self.key, "r": self.reason, "o": self.origin}
        )

    @classmethod
    def decode(cls, payload: str) -> Signal | None:
        """A signal from a payload, or None when it is not one of ours."""
        try:
            data: Any = json.loads(payload)
            return cls(str(data["a"]), str(data["k"]), str(data.get("r", "")), str(data["o"]))
        except (ValueError, KeyError, TypeError):
            return None


Handler = Callable[[Signal], None]


class IgnoredLog:
    """Logs ignored signals: the first one, then at most one summary line per interval."""

    def __init__(
        self, interval: float = IGNORED_LOG_INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval = interval
        self.clock = clock
        self._logged_at: float | None = None
        self._unlogged = 0

    def note(self, reason: str, what: str) -> None:
        """One more ignored signal."""
        now = self.clock()
        if self._logged_at is not None and now - self._logged_at < self.interval:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more ignored since the last line)" if self._unlogged else ""
        logger.warning(
            "ignored a signal (%s): %s%s; signals are checked against the database, so a "
            "forged one changes nothing, but some role that can connect sent it: revoke "
            "PUBLIC's CONNECT on the database",
            reason,
            what,
            more,
        )
        self._logged_at, self._unlogged = now, 0


class LocalBus:
    """One instance: nothing to carry (the instance that would publish acts itself)."""

    def __init__(self, origin: str = "") -> None:
        self.origin = origin
        self.handlers: list[Handler] = []
        self.on_ignored: Callable[[str], None] = lambda _reason: None
        """Called with a reason (`malformed`, `unconfirmed`) for each signal not acted upon."""
        self._ignored_log = IgnoredLog()

    def ignore(self, reason: str, what: str) -> None:
        """Count a signal that is not acted upon (`on_ignored`) and log it, at most one line
        a minute (a flood of forged NOTIFYs cannot flood the log)."""
        self.on_ignored(reason)
        self._ignored_log.note(reason, what)

    @property
    def clustered(self) -> bool:
        """False: signals never leave this process."""
        return False

    @property
    def connected(self) -> bool:
        """Always: there is no connection to lose."""
        return True

    def subscribe(self, handler: Handler) -> None:
        """Call `handler` for each signal from another instance (never here)."""
        self.handlers.append(handler)

    async def publish(self, conn: AsyncConnection, signal: Signal) -> None:
        """Nothing to do."""

    async def run(self) -> None:
        """Nothing to listen to: wait until cancelled."""
        await asyncio.Event().wait()


class PgBus(LocalBus):
    """LISTEN on a dedicated connection, reconnecting with backoff; NOTIFY through the
    publisher's own transaction."""

    def __init__(self, database_url: str, origin: str) -> None:
        super().__init__(origin)
        # SQLAlchemy's URL options (prepared_statement_cache_size, …) mean nothing to asyncpg.
        url = make_url(database_url).set(drivername="postgresql", query={})
        self._dsn = url.render_as_string(hide_password=False)
        self._connected = False
        self.backoff = Backoff(initial=0.2, maximum=5.0)

    @property
    def clustered(self) -> bool:
        """True: signals reach every instance sharing the database."""
        return True

    @property
    def connected(self) -> bool:
        """Whether the listening connection is up."""
        return self._connected

    async def publish(self, conn: AsyncConnection, signal: Signal) -> None:
        """NOTIFY inside the caller's transaction (sent when it commits)."""
        stamped = Signal(signal.action, signal.key, signal.reason[:200], self.origin)
        await conn.execute(
            text("SELECT pg_notify(:channel, :payload)"),
            {"channel": CHANNEL, "payload": stamped.encode()},
        )

    async def run(self) -> None:
        """Listen until cancelled; after each (re)connection every handler gets `resync`
        (signals may have been missed meanwhile)."""
        attempt = 0
        while True:
            try:
                conn = await asyncpg.connect(
                    self._dsn,
                    timeout=10,
                    server_settings={"application_name": f"herald signals {self.origin}"[:63]},
                )
            except Exception as err:  # any failure to connect is retried, never fatal
                logger.warning("signal listener cannot connect: %s", err)
                await asyncio.sleep(self.backoff.delay(attempt))
                attempt += 1
                continue
            closed = asyncio.Event()
            try:
                conn.add_termination_listener(lambda _conn, ended=closed: ended.set())
                await conn.add_listener(CHANNEL, self._on_notify)
                self._connected = True
                attempt = 0
                self._deliver(Signal(SignalAction.RESYNC, origin=self.origin))
                while not closed.is_set():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(HEALTH_INTERVAL):
                            await closed.wait()
                    if not closed.is_set():
                        async with asyncio.timeout(HEALTH_INTERVAL):
                            await conn.execute("SELECT 1")
                logger.warning("signal listener lost its connection")
            except Exception as err:  # reconnect whatever went wrong
                logger.warning("signal listener lost its connection: %s", err)
            finally:
                self._connected = False
                await _close(conn)
            await asyncio.sleep(self.backoff.delay(attempt))
            attempt += 1

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        signal = Signal.decode(str(payload))
        if signal is None:
            self.ignore("malformed", f"a payload that is not a signal: {str(payload)[:80]!r}")
            return
        if signal.origin == self.origin:
            return
        if signal.action is SignalAction.RESYNC:  # only ever made here, never sent
            self.ignore("malformed", f"a resync from {signal.origin!r}, which no instance sends")
            return
        self._deliver(signal)

    def _deliver(self, signal: Signal) -> None:
        for handler in self.handlers:
            try:
                handler(signal)
            except Exception:  # one handler's bug must not silence the others
                logger.exception("signal handler failed for %s", signal)


async def _close(conn: asyncpg.Connection) -> None:
    try:
        async with asyncio.timeout(2):
            await conn.close()
    except Exception:  # closing a broken connection: drop it
        conn.terminate()
