"""Whether a request names this server, and whether it comes from this machine.

A page whose DNS name rebinds to 127.0.0.1 reaches a loopback server from the operator's own
browser: its client address is loopback and no proxy forwarded it, but its `Host` (and
`Origin`) carry the page's own name. So a request *names this server* only when its `Host`
is `localhost`, `127.0.0.1`, `[::1]` (or `api.host`, when that is one address) at the port
the request came in on, or a name of `api.public_names` (at its port, when the entry has
one); and it is *local* only when, besides, its client address is loopback, it carries no
forwarding header, and its `Origin`, when sent, names this server too.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi import HTTPException, Request
from starlette.datastructures import Headers
from starlette.types import Scope

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
FORWARDING_HEADERS = (
    "forwarded",
    "x-forwarded-for",
    "x-real-ip",
    "x-forwarded-host",
    "x-forwarded-proto",
    "via",
)
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
_HOST = re.compile(r"\[[0-9a-f:.]+\]|[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?")


@dataclass(frozen=True, slots=True)
class Authority:
    """`host[:port]` of a `Host` header or an origin, lower case; port None: not given."""

    host: str
    port: int | None

    @classmethod
    def parse(cls, text: str) -> Authority | None:
        """The authority `text` names; None when it is malformed."""
        text = text.strip().lower()
        host, port = text, ""
        if text.startswith("["):
            end = text.find("]") + 1
            host, rest = text[:end], text[end:]
            if rest:
                if not rest.startswith(":"):
                    return None
                port = rest[1:]
        elif ":" in text:
            host, _, port = text.partition(":")
        if not _HOST.fullmatch(host) or (text.startswith("[") and not _ipv6(host[1:-1])):
            return None
        if host.startswith("["):  # one spelling of each address: [0:0:0:0:0:0:0:1] is [::1]
            host = f"[{ipaddress.IPv6Address(host[1:-1])}]"
        if not port:
            return None if text.endswith(":") else cls(host, None)
        if not port.isdigit() or len(port) > 5 or not 0 < int(port) <= 65535:
            return None
        return cls(host, int(port))

    def at(self, scheme: str) -> int:
        """The port, or the scheme's default when none is given."""
        return self.port if self.port is not None else DEFAULT_PORTS.get(scheme, 80)


def _ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def _bound_name(host: str) -> str | None:
    """`api.host` as a `Host` names it, when it is one address or name (not 0.0.0.0, ::)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        found = Authority.parse(host)
        return found.host if found is not None and found.port is None else None
    if address.is_unspecified:
        return None
    return f"[{address}]" if address.version == 6 else str(address)


def is_loopback_client(client_host: str | None) -> bool:
    """Whether a client address is a loopback address."""
    if client_host is None:
        return False
    try:
        return ipaddress.ip_address(client_host.removeprefix("::ffff:")).is_loopback
    except ValueError:
        return client_host == "localhost"


def forwarded(headers: Headers) -> bool:
    """Whether a header says a proxy forwarded the request for someone else."""
    return any(name in headers for name in FORWARDING_HEADERS)


@dataclass(frozen=True, slots=True)
class ServerNames:
    """The names this server answers to: `own` at the port a request came in on (or `port`
    when the server does not say), and `public` (at their port, or any when they have none)."""

    own: frozenset[str]
    public: frozenset[Authority]
    port: int

    @classmethod
    def of(cls, host: str, port: int, public_names: tuple[str, ...]) -> ServerNames:
        """The names of a server listening on `host`:`port`, reached as `public_names` too."""
        bound = _bound_name(host)
        own = LOOPBACK_NAMES | ({bound} if bound else set())
        public = {found for name in public_names if (found := Authority.parse(name)) is not None}
        return cls(frozenset(own), frozenset(public), port)

    def names_us(self, authority: Authority, scheme: str, server_port: int) -> bool:
        """Whether `authority`, reached over `scheme`, names this server at `server_port`."""
        port = authority.at(scheme)
        if authority.host in self.own and port == server_port:
            return True
        return any(
            p.host == authority.host and (p.port is None or p.port == port) for p in self.public
        )

    def _server_port(self, scope: Scope) -> int:
        server = scope.get("server")
        if not server:
            return self.port
        port = server[1]
        return int(port) if port is not None else DEFAULT_PORTS.get(scope.get("scheme", ""), 80)

    def host_ok(self, scope: Scope) -> bool:
        """Whether the request has one `Host` header and it names this server."""
        hosts = Headers(scope=scope).getlist("host")
        if len(hosts) != 1:
            return False
        found = Authority.parse(hosts[0])
        scheme = str(scope.get("scheme", "http"))
        return found is not None and self.names_us(found, scheme, self._server_port(scope))

    def origin_names_us(self, origin: str, scope: Scope) -> bool:
        """Whether an `Origin` (or a `Referer`'s origin) is a page of this server."""
        try:
            parts = urlsplit(origin.strip())
        except ValueError:
            return False
        if parts.scheme not in ("http", "https") or parts.username or parts.password:
            return False
        found = Authority.parse(parts.netloc)
        return found is not None and self.names_us(found, parts.scheme, self._server_port(scope))

    def origin_ok(self, scope: Scope) -> bool:
        """Whether the request's `Origin` is absent or names this server (`null` does not)."""
        origins = Headers(scope=scope).getlist("origin")
        return all(self.origin_names_us(origin, scope) for origin in origins)

    def same_origin(self, scope: Scope) -> bool:
        """Whether a state-changing request shows it was sent by a page of this server: its
        `Origin`, or without one its `Referer`, names this server."""
        headers = Headers(scope=scope)
        if "origin" in headers:
            return self.origin_ok(scope)
        referers = headers.getlist("referer")
        return len(referers) == 1 and self.origin_names_us(referers[0], scope)

    def is_local(self, scope: Scope) -> bool:
        """Whether a request comes from this machine itself, addressed to this server: a
        loopback client, no forwarding header, and a `Host` and `Origin` that name us."""
        return self.not_local(scope) is None

    def describe(self, scope: Scope) -> str:
        """The names a refused request could have used, for its error message."""
        port = self._server_port(scope)
        names = [f"{name}:{port}" for name in sorted(self.own)]
        names += sorted(p.host + (f":{p.port}" if p.port else "") for p in self.public)
        return ", ".join(names)

    def misdirected(self, scope: Scope) -> str | None:
        """Why the request's `Host` or `Origin` does not name this server; None when both do."""
        if not self.host_ok(scope):
            host = Headers(scope=scope).get("host", "")[:100]
            return (
                f"the request is addressed to {host!r}, not to this server "
                f"({self.describe(scope)}); if that name is yours, add it to api.public_names"
            )
        if not self.origin_ok(scope):
            origin = Headers(scope=scope).get("origin", "")[:100]
            return (
                f"a page of another site (Origin {origin!r}) may not use this server; if that "
                "name is yours (a reverse proxy's), add it to api.public_names"
            )
        return None

    def not_local(self, scope: Scope) -> str | None:
        """Why the request is not local; None when it is."""
        client = scope.get("client")
        if not is_loopback_client(client[0] if client else None):
            return "the request does not come from this machine"
        if forwarded(Headers(scope=scope)):
            return "the request was forwarded by a proxy"
        return self.misdirected(scope)


def require_local(request: Request) -> None:
    """Raise 403 unless the request is local by the app's `ServerNames` (`app.state.names`)."""
    names: ServerNames = request.app.state.names
    why = names.not_local(request.scope)
    if why is not None:
        raise HTTPException(403, f"only requests made on this machine are served here: {why}")
