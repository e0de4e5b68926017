"""The HTTP server's socket limits: uvicorn's own settings, and the six it lacks.

uvicorn gives the idle keep-alive timeout and the listen backlog. With httptools (the
parser it runs here) it has no limit on the size or the number of request headers, no
time limit on reading them or the body, and its `limit_concurrency` counts connections
only once a request's headers are in: connections that never finish a head or a body hold
their descriptors forever, and a never-ending header grows without bound. `GuardedProtocol`
adds those limits where they can act, in the protocol: bytes are counted as they arrive,
before the parser buffers them; connections are counted per client address too, so one
client cannot take every connection. (`h11_max_incomplete_event_size` would bound the head
with the h11 parser, at several times the CPU per request.)
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
from collections import Counter
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, ClassVar

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from gateway.config import APIConfig
from gateway.http.errors import error_body

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HeadLimits:
    """What one connection may cost before its request is handed to the app."""

    max_connections: int
    header_timeout: float
    max_header_bytes: int
    max_headers: int
    body_timeout: float = 30.0
    max_per_client: int | None = None
    """Connections from one client address (IPv6: one /64) at most; None: no such cap."""

    @classmethod
    def of(cls, api: APIConfig) -> HeadLimits:
        """The limits of the `api` config section (one client gets at most half the cap)."""
        per_client = min(api.max_connections_per_client, max(1, api.max_connections // 2))
        return cls(
            api.max_connections,
            api.header_timeout,
            api.max_header_bytes,
            api.max_headers,
            api.body_timeout,
            per_client,
        )


def server_config(app: Any, api: APIConfig, *, graceful_timeout: int) -> uvicorn.Config:
    """uvicorn's settings for Herald's server: `app` behind the limits of `api`."""
    return uvicorn.Config(
        app,
        lifespan="off",
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=graceful_timeout,
        http=guarded_protocol(HeadLimits.of(api)),
        timeout_keep_alive=api.idle_timeout,
        backlog=api.backlog,
    )


def guarded_protocol(limits: HeadLimits) -> type[GuardedProtocol]:
    """The protocol class uvicorn instantiates per connection, bound to `limits` and to a
    count of open connections per client of its own (one per server)."""
    clients: Counter[str] = Counter()
    return type("GuardedProtocol", (GuardedProtocol,), {"limits": limits, "clients": clients})


def client_of(peer: object) -> str:
    """The client a connection counts against: its IP address, an IPv6 one by its /64."""
    host = peer[0] if isinstance(peer, tuple) and peer else str(peer)
    try:
        address = ipaddress.ip_address(str(host))
    except ValueError:
        return str(host)
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network(f"{address}/64", strict=False))
    return str(address)


class _HeadRefused(Exception):
    """Raised in a parser callback: stop parsing this request head."""


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a connection cap and limits on request heads.

    A connection past `max_connections`, or past `max_per_client` from its client's
    address, is answered 503 and closed before it is read. A head (request line and
    headers) must arrive within `header_timeout` seconds of the connection opening or its
    first byte (408), in at most `max_header_bytes` bytes and `max_headers` fields (431); its
    body within `body_timeout` seconds of the head (408). Each refusal closes the connection.
    """

    limits: ClassVar[HeadLimits]
    clients: ClassVar[Counter[str]]

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._refused = False
        self._discarding = False
        """A head was refused while an earlier response is still going out: read no more."""
        self._reading_head = True
        self._head_bytes = 0
        self._head_tail = b""
        """The last bytes of the head read so far (its end may span two reads)."""
        self._head_fields = 0
        self._head_error: tuple[int, str] | None = None
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._client: str | None = None
        """The client this connection counts against (None: not counted)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Refuse the connection when too many are open, in all or from its client; else
        count it and time its first head."""
        client = client_of(transport.get_extra_info("peername"))
        per_client = self.limits.max_per_client
        message = None
        if len(self.server_state.connections) >= self.limits.max_connections:
            message = "too many open connections; retry in a moment"
        elif per_client is not None and self.clients[client] >= per_client:
            message = f"too many open connections from {client}; close some, then retry"
        if message is not None:
            self._refused = True
            self.transport = transport
            logger.debug("refused a connection from %s: %s", client, message)
            _answer(transport, HTTPStatus.SERVICE_UNAVAILABLE, message, retry_after=1)
            return
        self._client = client
        self.clients[client] += 1
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the connection (a refused one was never counted)."""
        self._disarm()
        self._disarm_body()
        if self._client is not None:
            self.clients[self._client] -= 1
            if self.clients[self._client] <= 0:
                del self.clients[self._client]
            self._client = None
        if not self._refused:
            super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Count a head's bytes before the parser keeps them; refuse past the limit."""
        if self._refused or self._discarding:
            return
        if self._reading_head:
            # Only the head counts: a body arriving in the same read (a picture) is no head.
            seen = self._head_tail + data
            end = seen.find(b"\r\n\r\n")
            self._head_bytes += len(data) if end < 0 else max(0, end + 4 - len(self._head_tail))
            self._head_tail = seen[-3:]
            if self._head_bytes > self.limits.max_header_bytes:
                self._refuse_head(
                    HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                    f"the request line and headers are larger than "
                    f"{self.limits.max_header_bytes} bytes",
                )
                return
        super().data_received(data)

    def on_message_begin(self) -> None:
        """A new request: its head is counted and timed from here."""
        super().on_message_begin()
        self._reading_head = True
        self._head_bytes = 0
        self._head_tail = b""
        self._head_fields = 0
        self._arm()

    def on_header(self, name: bytes, value: bytes) -> None:
        """Count header fields; past the limit, stop the parser (answered 431)."""
        self._head_fields += 1
        if self._head_fields > self.limits.max_headers:
            self._head_error = (
                HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                f"the request has more than {self.limits.max_headers} header fields",
            )
            raise _HeadRefused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        """The head is in: stop its clock, count no more bytes as head, time the body."""
        self._reading_head = False
        self._disarm()
        self._disarm_body()
        self._body_timer = self.loop.call_later(self.limits.body_timeout, self._body_timed_out)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        """The body is in: stop its clock."""
        self._disarm_body()
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a parser error: 431 when the error was our refusal."""
        if self._head_error is not None:
            self._refuse_head(*self._head_error)
            return
        super().send_400_response(msg)

    def _refuse_head(self, status: int, message: str) -> None:
        self._disarm()
        self._reading_head = False
        logger.debug("refused a request head: %s", message)
        if self.cycle is not None and not self.cycle.response_complete:
            # The previous (pipelined) request is still being answered: only close after it.
            self.cycle.keep_alive = False
            self._discarding = True
            self.flow.pause_reading()
            return
        _answer(self.transport, status, message)

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(
                self.limits.header_timeout, self._head_timed_out
            )

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _disarm_body(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_timed_out(self) -> None:
        """The body did not arrive in time: 408 (or, when the answer has begun, just close)."""
        self._body_timer = None
        if self.transport.is_closing():
            return
        logger.debug("closed a connection whose request body took too long")
        cycle = self.cycle
        if cycle is None or cycle.response_started:
            if cycle is not None:
                cycle.keep_alive = False
            self.transport.close()
            return
        cycle.keep_alive = False
        _answer(
            self.transport,
            HTTPStatus.REQUEST_TIMEOUT,
            f"the request body took longer than {self.limits.body_timeout:g}s",
        )

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._reading_head and not self.transport.is_closing():
            self._refuse_head(
                HTTPStatus.REQUEST_TIMEOUT,
                f"the request line and headers took longer than {self.limits.header_timeout:g}s",
            )


def _answer(
    transport: asyncio.Transport, status: int, message: str, *, retry_after: int | None = None
) -> None:
    """Write an error response in the API's shape, then close the connection."""
    body = json.dumps(error_body(status, message)).encode()
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
    ]
    if retry_after is not None:
        lines.append(f"retry-after: {retry_after}")
    transport.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    transport.close()
