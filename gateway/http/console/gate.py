"""The console's door: a request whose `Host` or `Origin` does not name this server is
refused before any page, cookie or token is served, and a form (any method but GET/HEAD)
must show it was sent by one of the console's own pages (its `Origin`, or `Referer`)."""

from __future__ import annotations

import json
import logging

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.http.console.auth import Guard
from gateway.http.errors import error_body
from gateway.http.local import ServerNames

logger = logging.getLogger("gateway.console")

SAFE_METHODS = frozenset({"GET", "HEAD"})


class ConsoleGate:
    """Refuse (403) console requests not addressed to this server, and forms from elsewhere.

    A request sending the API key as a bearer token (a script, never a browser's own
    doing) needs no `Origin`; one that sends an `Origin` anyway must still name this server.
    """

    def __init__(self, app: ASGIApp, prefix: str, names: ServerNames, guard: Guard) -> None:
        self.app = app
        self.prefix = prefix
        self.names = names
        self.guard = guard

    def _why(self, scope: Scope) -> str | None:
        why = self.names.misdirected(scope)
        if why is not None or scope["method"] in SAFE_METHODS:
            return why
        headers = Headers(scope=scope)
        if self.names.same_origin(scope):
            return None
        unsent = "origin" not in headers and "referer" not in headers
        if unsent and self.guard.bearer_matches(headers):
            return None
        return (
            "a console form must be sent from a console page: the request's Origin (or "
            "Referer) does not name this server"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not (path == self.prefix or path.startswith(self.prefix + "/")):
            await self.app(scope, receive, send)
            return
        why = self._why(scope)
        if why is None:
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        logger.warning(
            "console: refused %s %s from %s: %s",
            scope["method"],
            path[:200],
            client[0] if client else "unknown address",
            why,
        )
        body = json.dumps(error_body(403, why)).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 403,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
