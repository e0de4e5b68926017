"""Who may use the console: loopback requests, or the `api.key` holder with a session cookie.

A request is local when its client address is a loopback address and no proxy forwarded it
(no `Forwarded`, `X-Forwarded-For` or `X-Real-IP` header): a reverse proxy on the same
machine connects from 127.0.0.1 on behalf of someone else, so a forwarded request is never
local. Everyone else logs in with the API key (a form; the key never travels in a URL) and
gets an HttpOnly, SameSite=Strict session cookie signed with a key derived from `api.key`.
A script may instead send `Authorization: Bearer <api.key>`, as to the API.

Every form carries a CSRF token: the HMAC of a random per-browser cookie value, checked on
each POST.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import secrets
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pydantic import SecretStr

SESSION_COOKIE = "herald_console"
CSRF_COOKIE = "herald_csrf"
CSRF_FIELD = "csrf"
SESSION_TTL = 12 * 3600
"""Seconds a login lasts."""
FORWARDING_HEADERS = ("forwarded", "x-forwarded-for", "x-real-ip")


def is_local(client_host: str | None, headers: Mapping[str, str]) -> bool:
    """Whether a request comes from this machine itself: a loopback client address and no
    header saying a proxy forwarded it for someone else."""
    if client_host is None or any(name in headers for name in FORWARDING_HEADERS):
        return False
    try:
        return ipaddress.ip_address(client_host.removeprefix("::ffff:")).is_loopback
    except ValueError:
        return client_host == "localhost"


@dataclass(frozen=True, slots=True)
class Visitor:
    """Who is asking: for the log of actions (`who`), and whether they may see the console."""

    who: str
    allowed: bool


class Guard:
    """Signs and checks session cookies and CSRF tokens.

    `key` is `api.key` (None: only local requests are let in). The signing secret derives
    from it, so a new key ends every login; without a key, a secret made at start signs the
    CSRF tokens (forms left open across a restart must be reloaded).
    """

    def __init__(self, key: SecretStr | None) -> None:
        self._key = None if key is None else key.get_secret_value().encode()
        material = self._key if self._key is not None else secrets.token_bytes(32)
        self._secret = hashlib.sha256(b"herald-console\x00" + material).digest()

    @property
    def has_key(self) -> bool:
        """Whether a key is configured (logging in is possible)."""
        return self._key is not None

    def key_matches(self, given: str) -> bool:
        """Whether `given` is the API key (compared in constant time)."""
        return self._key is not None and hmac.compare_digest(given.strip().encode(), self._key)

    def _mac(self, text: str) -> str:
        digest = hmac.new(self._secret, text.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def new_session(self, now: float | None = None) -> str:
        """A session cookie value valid for SESSION_TTL seconds."""
        expires = int((time.time() if now is None else now) + SESSION_TTL)
        payload = f"{expires}.{secrets.token_urlsafe(12)}"
        return f"{payload}.{self._mac('session|' + payload)}"

    def session_id(self, cookie: str | None, now: float | None = None) -> str | None:
        """The id (nonce) of a valid, unexpired session cookie, else None."""
        if not cookie or self._key is None:
            return None
        expires, _, rest = cookie.partition(".")
        nonce, _, mac = rest.partition(".")
        if not expires.isdigit() or not nonce or not mac:
            return None
        if not hmac.compare_digest(mac, self._mac(f"session|{expires}.{nonce}")):
            return None
        if int(expires) < (time.time() if now is None else now):
            return None
        return nonce[:8]

    @staticmethod
    def new_csrf_cookie() -> str:
        """A fresh random value for the CSRF cookie."""
        return secrets.token_urlsafe(18)

    def csrf_token(self, cookie: str) -> str:
        """The token forms carry for a browser whose CSRF cookie is `cookie`."""
        return self._mac("csrf|" + cookie)

    def csrf_ok(self, cookie: str | None, token: str | None) -> bool:
        """Whether a posted `token` belongs to the browser's CSRF `cookie`."""
        if not cookie or not token:
            return False
        return hmac.compare_digest(token, self.csrf_token(cookie))

    def visitor(
        self, client_host: str | None, headers: Mapping[str, str], cookie: str | None
    ) -> Visitor:
        """Who the request is from, and whether it may use the console."""
        where = client_host or "unknown address"
        forwarded = headers.get("x-forwarded-for") or headers.get("x-real-ip")
        if forwarded:
            where = f"{forwarded.strip()} via {where}"
        if is_local(client_host, headers):
            return Visitor(f"local user at {where}", True)
        session = self.session_id(cookie)
        if session is not None:
            return Visitor(f"key holder (session {session}) at {where}", True)
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and self.key_matches(token):
            return Visitor(f"key holder (bearer) at {where}", True)
        return Visitor(f"visitor at {where}", False)


class LoginThrottle:
    """At most `limit` failed logins in any `window` seconds, from everyone together: past
    it, every login is refused until the window has moved on (guessing the key stays
    hopeless; the operator waits a minute at worst)."""

    def __init__(
        self, limit: int = 10, window: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limit = limit
        self.window = window
        self.clock = clock
        self._failures: deque[float] = deque()

    def _forget_old(self) -> None:
        horizon = self.clock() - self.window
        while self._failures and self._failures[0] <= horizon:
            self._failures.popleft()

    def wait(self) -> float:
        """Seconds until a login may be tried again (0: now)."""
        self._forget_old()
        if len(self._failures) < self.limit:
            return 0.0
        return max(0.0, self._failures[0] + self.window - self.clock())

    def failed(self) -> None:
        """Count a failed login."""
        self._failures.append(self.clock())
