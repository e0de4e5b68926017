"""What the fake memory services (Honcho, Mem0) share: serving on 127.0.0.1 on a port that
stays the same across `down()` / `up()`, and fault injection.

Faults (counted ones count down, one per request): `slow(seconds, path=…)` delays answers
(to requests whose path contains `path`, else all), `fail(count, status)` answers 5xx,
`rate_limit(count, retry_after)` answers 429 with `Retry-After`, `down()` stops listening
(connection refused) until `up()`, `slow_answers(seconds, path=…)` handles requests but
holds their answers back.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tests.fakes.serving import LocalServer, Served
from tests.fakes.waiting import Changes


@dataclass
class Faults:
    """The faults switched on now."""

    delay: float = 0.0
    delay_path: str | None = None
    answer_delay: float = 0.0
    answer_delay_path: str | None = None
    failures: int = 0
    status: int = 503
    limited: int = 0
    retry_after: float = 1.0


@dataclass
class Seen:
    """One request the fake answered (or refused)."""

    method: str
    path: str
    body: Any
    status: int


@dataclass
class FakeMemoryService(Served):
    """Base of the fakes: `routes()` gives the service's routes."""

    key: str = "test-key"
    faults: Faults = field(default_factory=Faults)
    seen: list[Seen] = field(default_factory=list)
    _server: LocalServer | None = None
    _port: int = 0
    _changes: Changes = field(default_factory=Changes)
    _closing: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while going down: delayed answers stop waiting."""

    @property
    def base_url(self) -> str:
        """Where the service listens (the same after `down()` / `up()`)."""
        return f"http://127.0.0.1:{self._port}"

    def slow(self, seconds: float, path: str | None = None) -> None:
        """Delay answers by `seconds` (0: stop delaying)."""
        self.faults.delay, self.faults.delay_path = seconds, path

    def slow_answers(self, seconds: float, path: str | None = None) -> None:
        """Handle requests at once (what they store is stored) but hold their answers back
        `seconds` (0: stop): a client that dies meanwhile never learns it got through."""
        self.faults.answer_delay, self.faults.answer_delay_path = seconds, path

    def fail(self, count: int, status: int = 503) -> None:
        """Answer the next `count` requests with `status`."""
        self.faults.failures, self.faults.status = count, status

    def rate_limit(self, count: int, retry_after: float = 1.0) -> None:
        """Answer the next `count` requests 429 with `Retry-After: retry_after`."""
        self.faults.limited, self.faults.retry_after = count, retry_after

    async def down(self) -> None:
        """Stop listening: connections are refused until `up()`."""
        if self._server is not None:
            self._closing.set()
            await self._server.stop()
            self._server = None

    async def up(self) -> None:
        """Listen again on the same port."""
        if self._server is None:
            self._closing.clear()
            server = LocalServer(self._app(), port=self._port)
            await server.start()
            self._server = server
            self._port = server.port

    async def wait_for(self, condition: Any, timeout: float = 10.0) -> None:
        """Wait until `condition()` holds (re-checked after every request)."""
        await self._changes.wait_for(condition, timeout)

    async def _start(self) -> None:
        await self.up()

    async def _stop(self) -> None:
        self._changes.stop()
        await self.down()

    def routes(self) -> list[Route]:
        raise NotImplementedError

    def authorized(self, request: Request) -> bool:
        raise NotImplementedError

    def _app(self) -> ASGIApp:
        inner = Starlette(routes=self.routes())
        return _FaultLayer(self, inner)

    def record(self, request: Request, body: Any, status: int) -> None:
        self.seen.append(Seen(request.method, request.url.path, body, status))
        self._changes.notify()


class _FaultLayer:
    """Applies the faults, checks the key, then hands the request to the service."""

    def __init__(self, fake: FakeMemoryService, app: ASGIApp) -> None:
        self.fake = fake
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        fake, faults = self.fake, self.fake.faults
        request = Request(scope, receive)
        path = request.url.path
        if faults.delay and (faults.delay_path is None or faults.delay_path in path):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(faults.delay):
                    await fake._closing.wait()
        response: Response | None = None
        if faults.limited:
            faults.limited -= 1
            response = JSONResponse(
                {"detail": "rate limited"},
                status_code=429,
                headers={"Retry-After": f"{faults.retry_after:g}"},
            )
        elif faults.failures:
            faults.failures -= 1
            response = JSONResponse({"detail": "unavailable"}, status_code=faults.status)
        elif not fake.authorized(request):
            response = JSONResponse({"detail": "invalid api key"}, status_code=401)
        if response is not None:
            fake.record(request, None, response.status_code)
            await response(scope, receive, send)
            return
        hold = faults.answer_delay
        if hold and (faults.answer_delay_path is None or faults.answer_delay_path in path):
            closing = fake._closing

            async def late(message: Message) -> None:
                if message["type"] == "http.response.start":
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(hold):
                            await closing.wait()
                await send(message)

            await self.app(scope, receive, late)
            return
        await self.app(scope, receive, send)
