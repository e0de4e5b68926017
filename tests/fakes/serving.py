"""Serving a fake's ASGI app with uvicorn on 127.0.0.1, in the test's own event loop, and the
`async with` lifecycle the fakes share."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable, Iterator
from types import TracebackType
from typing import Any, Self

import uvicorn
from aiohttp import web


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signal handling to its owner and reports readiness."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.ready.set()

    async def main_loop(self) -> None:
        # uvicorn polls `should_exit` every 0.1 s; tests stop servers often, so poll faster.
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864_000
            await asyncio.sleep(0.01)


class LocalServer:
    """uvicorn serving `app` on 127.0.0.1:`port` (0: a free port) between `start` and `stop`.

    HTTP is h11 (a fake may close a connection unanswered through its transport); no
    websockets, no lifespan, no access log.
    """

    def __init__(self, app: Any, *, port: int = 0, log_level: str | None = None) -> None:
        self.app = app
        self._port = port
        self._log_level = log_level
        self._sock: socket.socket | None = None
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        """The port listened on; RuntimeError before `start`."""
        if self._sock is None:
            raise RuntimeError("the server is not started")
        port: int = self._sock.getsockname()[1]
        return port

    async def start(self) -> None:
        """Listen and serve; return once serving. Raises OSError (port taken) or RuntimeError."""
        # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted sockets only when their
        # proto says TCP, and without it uvicorn's separate header and body writes meet
        # Nagle's algorithm and the client's delayed ACK (~40 ms per request).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", self._port))
            sock.listen(128)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        config = uvicorn.Config(
            self.app,
            http="h11",
            ws="none",
            lifespan="off",
            log_config=None,
            log_level=self._log_level,
            access_log=False,
            timeout_graceful_shutdown=5,
        )
        self._server = server = _Server(config)
        self._task = task = asyncio.create_task(server.serve(sockets=[sock]))
        ready = asyncio.create_task(server.ready.wait())
        try:
            await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            await self.stop()
            raise
        finally:
            ready.cancel()
            await asyncio.gather(ready, return_exceptions=True)
        if not server.ready.is_set():
            await self.stop()
            raise RuntimeError("the server did not start")

    async def stop(self) -> None:
        """Stop serving (open connections get `timeout_graceful_shutdown`) and close the socket."""
        try:
            if self._server is not None:
                self._server.should_exit = True
            if self._task is not None:
                await asyncio.shield(self._task)
        finally:
            if self._sock is not None:
                self._sock.close()


class Served:
    """`async with fake:` runs `_start`, then `_stop` on the way out (also when `_start` fails).

    A fake serving HTTP keeps its `LocalServer` in `_local`; `port` and `url` read it.
    """

    _local: LocalServer | None = None

    @property
    def port(self) -> int:
        """The bound TCP port (of the HTTP server, where a fake has more than one)."""
        if self._local is None:
            raise RuntimeError("the server is not started")
        return self._local.port

    @property
    def url(self) -> str:
        """`http://127.0.0.1:<port>`: the root, where a fake's `/control/*` routes live."""
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Self:
        try:
            await self._start()
        except BaseException:
            await self._stop()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stop()

    async def _start(self) -> None:
        raise NotImplementedError

    async def _stop(self) -> None:
        raise NotImplementedError


class AiohttpServer:
    """aiohttp's web server serving `app` on 127.0.0.1:`port` (0: a free port) between
    `start` and `stop`: for fakes that need what `LocalServer` does not serve (websockets,
    server-sent events written as they come)."""

    def __init__(self, app: web.Application, port: int = 0, *, shutdown_timeout: float = 1.0):
        self._app = app
        self._port = port
        self._shutdown_timeout = shutdown_timeout
        self._sock: socket.socket | None = None
        self._runner: web.AppRunner | None = None

    @property
    def port(self) -> int:
        """The port listened on; RuntimeError before `start`."""
        if self._sock is None:
            raise RuntimeError("the server is not started")
        port: int = self._sock.getsockname()[1]
        return port

    async def start(self) -> None:
        """Listen and serve; return once serving. Raises OSError (port taken)."""
        # IPPROTO_TCP for TCP_NODELAY on accepted sockets, as in `LocalServer`.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", self._port))
            sock.listen(128)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._runner = runner = web.AppRunner(
            self._app, access_log=None, shutdown_timeout=self._shutdown_timeout
        )
        await runner.setup()
        await web.SockSite(runner, sock).start()

    async def stop(self) -> None:
        """Stop serving (open handlers get `shutdown_timeout`) and close the socket."""
        try:
            if self._runner is not None:
                await self._runner.cleanup()
        finally:
            if self._sock is not None:
                self._sock.close()


class WebSocketListener(AiohttpServer):
    """An `AiohttpServer` answering GET `path` with `handler`: for websockets, which
    `LocalServer` does not serve."""

    def __init__(
        self,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
        port: int,
        path: str,
    ) -> None:
        app = web.Application()
        app.router.add_get(path, handler)
        super().__init__(app, port, shutdown_timeout=2.0)
