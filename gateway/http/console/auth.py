"""Who may use the console: local requests, or the `api.key` holder with a session cookie.

A request is local when it comes from this machine, addressed to this server (see
`gateway.http.local`: a loopback client, no forwarding header, a `Host` and `Origin` that
name this server). Everyone else logs in with the API key (a form; the key never travels in
a URL) and gets an HttpOnly, SameSite=Strict session cookie signed with a key derived from
`api.key`; the login is also a row in SQL (`console_sessions`), and logging out deletes it,
so a cookie replayed after logout is refused by every instance. A script may instead send
`Authorization: Bearer <api.key>`, as to the API.

Every form carries a CSRF token: the HMAC of a random per-browser cookie value, checked on
each POST.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
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


@dataclass(frozen=True, slots=True)
class Visitor:
    """Who is asking: for the log of actions (`who`), and whether they may see the console."""

    who: str
    allowed: bool


@dataclass(frozen=True, slots=True)
class Login:
    """A validly signed, unexpired session cookie: `key` names its row in SQL, `short` is
    what the log shows, `expires` is a Unix time."""

    key: str
    short: str
    expires: int


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

    def bearer_matches(self, headers: Mapping[str, str]) -> bool:
        """Whether the request sends `Authorization: Bearer <api.key>`."""
        scheme, _, token = headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and self.key_matches(token)

    def _mac(self, text: str) -> str:
        digest = hmac.new(self._secret, text.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def new_session(self, now: float | None = None) -> str:
        """A session cookie value valid for SESSION_TTL seconds (record its `login` in SQL)."""
        expires = int((time.time() if now is None else now) + SESSION_TTL)
        payload = f"{expires}.{secrets.token_urlsafe(18)}"
        return f"{payload}.{self._mac('session|' + payload)}"

    def login(self, cookie: str | None, now: float | None = None) -> Login | None:
        """The login of a validly signed, unexpired session cookie, else None (whether it is
        still open is the `console_sessions` row's to say)."""
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
        key = hashlib.sha256(nonce.encode()).hexdigest()
        return Login(key, nonce[:8], int(expires))

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
        self,
        client_host: str | None,
        headers: Mapping[str, str],
        *,
        local: bool,
        login: Login | None,
    ) -> Visitor:
        """Who the request is from, and whether it may use the console: `local` (see
        `ServerNames.is_local`), or an open `login`, or the key as a bearer token."""
        where = client_host or "unknown address"
        forwarded = headers.get("x-forwarded-for") or headers.get("x-real-ip")
        if forwarded:
            where = f"{forwarded.strip()[:100]} via {where}"
        if local:
            return Visitor(f"local user at {where}", True)
        if login is not None:
            return Visitor(f"key holder (session {login.short}) at {where}", True)
        if self.bearer_matches(headers):
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
