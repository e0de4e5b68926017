"""ASGI middleware: request body size limit, the API key check, admission, request metrics."""

from __future__ import annotations

import hmac
import json
import math
import time
from collections.abc import Callable

from pydantic import SecretStr
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.contracts.errors import Overloaded
from gateway.http.errors import error_body
from gateway.http.local import ServerNames
from gateway.metrics import Metrics


class BodyLimit:
    """Answer 413 to any request whose body is larger than `max_bytes`, before handling it."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    too_big = int(value) > self.max_bytes
                except ValueError:
                    await _reply(send, 400, "invalid Content-Length header")
                    return
                if too_big:
                    await _reply(send, 413, f"the body is larger than {self.max_bytes} bytes")
                    return
        received = 0
        started = False
        rejected = False

        async def limited_receive() -> Message:
            nonlocal received, rejected
            if rejected:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Answer now; the app sees a client that went away and its reply is dropped.
                    rejected = True
                    if not started:
                        await _reply(send, 413, f"the body is larger than {self.max_bytes} bytes")
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if rejected:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, limited_receive, guarded_send)


class KeyGate:
    """Check who may call the API (`/v1`, `/api`, `/metrics`) before the request is routed or
    its body read. With `api.key`: `Authorization: Bearer <key>`, else 401. Without one: only
    local requests (see `gateway.http.local`), else 403 saying why."""

    PREFIXES = ("/v1", "/api", "/metrics")

    def __init__(self, app: ASGIApp, key: SecretStr | None, names: ServerNames) -> None:
        self.app = app
        self.key = None if key is None else key.get_secret_value().encode()
        self.names = names

    def _guarded(self, path: str) -> bool:
        return any(path == p or path.startswith(p + "/") for p in self.PREFIXES)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._guarded(scope["path"]):
            await self.app(scope, receive, send)
            return
        if self.key is not None:
            scheme, _, token = Headers(scope=scope).get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                token.strip().encode(), self.key
            ):
                challenge = [(b"www-authenticate", b"Bearer")]
                await _reply(send, 401, "missing or wrong API key", challenge)
                return
        elif (why := self.names.not_local(scope)) is not None:
            await _reply(
                send,
                403,
                f"this API has no key (api.key), so it serves only requests made on this "
                f"machine to {self.names.describe(scope)}, not forwarded by a proxy: {why}. "
                "Set api.key to serve anyone else.",
            )
            return
        await self.app(scope, receive, send)


class Admission:
    """Refuse `POST /v1/chat/completions` with 503 while too many turns wait, before the
    request is routed or its body read: under overload, a refusal must cost next to nothing.

    `admit` raises Overloaded (and counts the refusal); the handler checks again, later.
    """

    PATH = "/v1/chat/completions"

    def __init__(self, app: ASGIApp, admit: Callable[[], None]) -> None:
        self.app = app
        self.admit = admit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == self.PATH:
            try:
                self.admit()
            except Overloaded as err:
                retry_after = str(max(1, math.ceil(err.retry_after)))
                await _reply(send, 503, str(err), [(b"retry-after", retry_after.encode())])
                return
        await self.app(scope, receive, send)


RECEIVED_AT = "received_at"
"""The `request.state` key: `time.perf_counter()` when the request reached Herald."""


class RequestMetrics:
    """Count requests by method, route template and status code; stamp their arrival."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})[RECEIVED_AT] = time.perf_counter()
        status = 500

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            self.metrics.http_requests.labels(
                method=scope["method"], route=path, status=str(status)
            ).inc()


async def _reply(
    send: Send, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = json.dumps(error_body(status, message)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
