"""Servers that echo a client's credentials back in their errors, as careless real servers do:
an HTTP server answering every request with a platform-shaped error whose text holds the
request's `Authorization` (Basic decoded), and an IMAP server whose `NO` repeats the LOGIN
line. Each records what it sent, so a test can prove the secret did leave the server: a
redaction test that passes only because the secret never came back proves nothing."""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.fakes.serving import LocalServer, Served

Shape = Callable[[str], tuple[int, dict[str, Any]]]
"""The error a platform answers, from the echoed credentials: (status, JSON body)."""

SHAPES: dict[str, Shape] = {
    # slack_sdk raises SlackApiError with the whole response body in its message.
    "slack": lambda echo: (200, {"ok": False, "error": "invalid_auth", "warning": echo}),
    # discord.py puts a 403's message in its Forbidden error (a 401 becomes LoginFailure
    # with a fixed text, which would prove nothing).
    "discord": lambda echo: (403, {"message": f"Missing Access for {echo}", "code": 50001}),
    # twilio's TwilioRestException carries the message.
    "twilio": lambda echo: (
        401,
        {"code": 20003, "message": f"Authenticate: {echo}", "status": 401, "more_info": ""},
    ),
    # matrix-nio keeps the body's `error` in its ErrorResponse (a 502: the adapter retries).
    "matrix": lambda echo: (502, {"errcode": "M_UNKNOWN", "error": f"upstream refused {echo}"}),
    # Mattermost's error JSON (`id`, `message`, `status_code`); the adapter logs the message
    # (a 500: it retries).
    "mattermost": lambda echo: (
        500,
        {"id": "app.error", "message": f"upstream refused {echo}", "status_code": 500},
    ),
    # signal-cli's JSON-RPC errors carry a message (here from a proxy in front of it).
    "signal": lambda echo: (
        200,
        {
            "jsonrpc": "2.0",
            "id": 1,
            "error": {"code": -32603, "message": f"upstream refused {echo}"},
        },
    ),
    # openai's APIStatusError carries the error's message.
    "llm": lambda echo: (401, {"error": {"message": f"Incorrect API key: {echo}"}}),
}


def credentials(request: Request) -> str:
    """The request's Authorization header; Basic credentials decoded to `user:password`."""
    value = request.headers.get("authorization", "")
    scheme, _, rest = value.partition(" ")
    if scheme.lower() == "basic":
        try:
            return base64.b64decode(rest, validate=True).decode("utf-8", "replace")
        except (binascii.Error, ValueError):
            return value
    return value


class EchoingHTTP(Served):
    """Every request answered with `SHAPES[platform]` of its credentials."""

    def __init__(self, platform: str) -> None:
        self.shape = SHAPES[platform]
        self.sent: list[str] = []
        """Each echoed credentials string, in order."""

    async def _answer(self, request: Request) -> JSONResponse:
        await request.body()
        echo = credentials(request)
        self.sent.append(echo)
        status, body = self.shape(echo)
        return JSONResponse(body, status_code=status)

    async def _start(self) -> None:
        methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
        app = Starlette(routes=[Route("/{path:path}", self._answer, methods=methods)])
        self._local = LocalServer(app)
        await self._local.start()

    async def _stop(self) -> None:
        if self._local is not None:
            await self._local.stop()


class EchoingIMAP(Served):
    """An IMAP server that greets, then answers LOGIN with a NO repeating the command line."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        """Each echoed LOGIN line, in order."""
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        """The listening port."""
        if self._server is None:
            raise RuntimeError("the server is not started")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(b"* OK [CAPABILITY IMAP4rev1 AUTH=PLAIN] echoing IMAP ready\r\n")
            await writer.drain()
            while line := await reader.readline():
                text = line.decode("utf-8", "replace").rstrip("\r\n")
                tag, _, command = text.partition(" ")
                verb = command.split(" ", 1)[0].upper()
                if verb == "CAPABILITY":
                    writer.write(b"* CAPABILITY IMAP4rev1 AUTH=PLAIN\r\n")
                    writer.write(f"{tag} OK CAPABILITY completed\r\n".encode())
                elif verb == "LOGIN":
                    self.sent.append(command)
                    writer.write(f"{tag} NO [AUTHENTICATIONFAILED] refused: {command}\r\n".encode())
                elif verb == "LOGOUT":
                    writer.write(f"* BYE\r\n{tag} OK LOGOUT completed\r\n".encode())
                    await writer.drain()
                    break
                else:
                    writer.write(f"{tag} BAD unknown command\r\n".encode())
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
