"""A receiver of Herald's outbound webhooks on 127.0.0.1: checks each POST's signature as the
README tells a receiver to, fails the next N on demand, records what it took."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.fakes.serving import LocalServer, Served

TOLERANCE = 300


def verified(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """The receiver's check (README, Triggers): `v1=` HMAC-SHA256 of `"<timestamp>.<body>"`
    compared in constant time, and a timestamp within five minutes."""
    timestamp = headers.get("x-herald-timestamp", "")
    given = headers.get("x-herald-signature", "")
    if not timestamp.isdigit() or abs(time.time() - int(timestamp)) > TOLERANCE:
        return False
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return hmac.compare_digest(given, "v1=" + mac.hexdigest())


@dataclass(frozen=True, slots=True)
class Taken:
    """One POST the receiver accepted: its JSON and its delivery header."""

    data: dict[str, Any]
    delivery: str


class WebhookReceiver(Served):
    """`async with WebhookReceiver(secret) as r:` serves `r.url + "/hook"`."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.taken: list[Taken] = []
        self.attempts = 0
        self.forged = 0
        """POSTs whose signature did not verify (answered 401)."""
        self._failures: list[int] = []
        self._changed = asyncio.Condition()

    def fail_next(self, times: int, status: int = 503) -> None:
        """The next `times` POSTs are answered `status`."""
        self._failures.extend([status] * times)

    async def wait_taken(self, n: int, timeout: float = 20.0) -> list[Taken]:
        """Wait until `n` POSTs were accepted; all of them."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: len(self.taken) >= n)
        return list(self.taken)

    async def _start(self) -> None:
        app = Starlette(routes=[Route("/hook", self._hook, methods=["POST"])])
        self._local = LocalServer(app)
        await self._local.start()

    async def _stop(self) -> None:
        if self._local is not None:
            await self._local.stop()

    async def _hook(self, request: Request) -> Response:
        body = await request.body()
        async with self._changed:
            self.attempts += 1
            self._changed.notify_all()
            if self._failures:
                return Response("try later", status_code=self._failures.pop(0))
            if not verified(self.secret, dict(request.headers), body):
                self.forged += 1
                return Response("bad signature", status_code=401)
            self.taken.append(Taken(json.loads(body), request.headers["x-herald-delivery"]))
            self._changed.notify_all()
        return Response(status_code=204)
