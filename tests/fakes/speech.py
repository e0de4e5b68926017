"""A fake OpenAI-compatible text-to-speech server (`POST /v1/audio/speech`), served by
uvicorn on 127.0.0.1.

It answers every request with a small valid Ogg/Opus stream (`ogg_opus(text)`: the
`OpusHead` and `OpusTags` pages, CRCs right) when `response_format` is `opus`, and with
MP3-looking bytes for any other format, so a client asking for the wrong one is caught.
Faults: `status` (anything but 200 answers an OpenAI-style error), `garbage` (answer bytes
that are not audio), `huge` (valid Ogg/Opus followed by that many more bytes, streamed),
`endless` (valid Ogg/Opus, then a byte every 50 ms for ever). Every request body is kept in
`requests`, every `Authorization` header in `authorizations`.

In tests: `async with FakeSpeech() as speech:` then point `speech.base_url` at it.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fakes.serving import LocalServer, Served


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        r = i << 24
        for _ in range(8):
            r = ((r << 1) ^ 0x04C11DB7) if r & 0x80000000 else (r << 1)
        table.append(r & 0xFFFFFFFF)
    return table


_CRC = _crc_table()


def _ogg_crc(data: bytes) -> int:
    """Ogg's CRC-32 (polynomial 0x04C11DB7, not reflected, initial 0)."""
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFFFFFF) ^ _CRC[((crc >> 24) & 0xFF) ^ byte]
    return crc


def _page(packet: bytes, sequence: int, *, first: bool = False, last: bool = False) -> bytes:
    """One Ogg page carrying one packet (under 255 × 255 bytes)."""
    lacing = [255] * (len(packet) // 255) + [len(packet) % 255]
    flags = (0x02 if first else 0) | (0x04 if last else 0)
    header = struct.pack("<4sBBqIII", b"OggS", 0, flags, 0, 0x48455241, sequence, 0)
    page = header + bytes([len(lacing)]) + bytes(lacing) + packet
    crc = _ogg_crc(page)
    return page[:22] + struct.pack("<I", crc) + page[26:]


def ogg_opus(text: str = "") -> bytes:
    """A minimal Ogg/Opus stream: identification and comment headers (the comment carries
    `text`, so each answer's bytes differ with what was said)."""
    head = b"OpusHead" + struct.pack("<BBHIhB", 1, 1, 312, 48000, 0, 0)
    vendor = b"herald-fake-speech"
    said = f"SAID={text}".encode()[:1000]
    tags = b"OpusTags" + struct.pack("<I", len(vendor)) + vendor
    tags += struct.pack("<I", 1) + struct.pack("<I", len(said)) + said
    return _page(head, 0, first=True) + _page(tags, 1, last=True)


class FakeSpeech(Served):
    """`/v1/audio/speech` for one test: recorded requests, Ogg/Opus answers, faults."""

    def __init__(self, *, port: int = 0) -> None:
        self.requests: list[dict[str, Any]] = []
        """Every speech request body, parsed, in arrival order."""
        self.authorizations: list[str] = []
        """The `Authorization` header of each request, in arrival order."""
        self.status = 200
        """Anything but 200 answers with an OpenAI-style error of that status."""
        self.garbage = False
        """Answer bytes that are not audio (an endpoint that ignores `response_format`)."""
        self.huge = 0
        """Bytes streamed after a valid answer (an answer too large to keep)."""
        self.endless = False
        """Trickle bytes after a valid answer and never finish."""
        self._port = port

    @property
    def base_url(self) -> str:
        """The OpenAI base URL of this server, `http://127.0.0.1:<port>/v1`."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def said(self) -> list[str]:
        """The `input` of each request."""
        return [str(r.get("input")) for r in self.requests]

    async def _start(self) -> None:
        app = Starlette(routes=[Route("/v1/audio/speech", self._speech, methods=["POST"])])
        self._local = LocalServer(app, port=self._port)
        await self._local.start()

    async def _stop(self) -> None:
        if self._local is not None:
            await self._local.stop()

    async def _speech(self, request: Request) -> Response:
        self.authorizations.append(request.headers.get("authorization", ""))
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _error(400, "request body is not JSON")
        if not isinstance(body, dict) or not body.get("input") or not body.get("voice"):
            return _error(400, "input and voice are required")
        self.requests.append(body)
        if self.status != 200:
            return _error(self.status, f"fake speech error {self.status}")
        if self.garbage:
            return Response(b"<html>not audio</html>", media_type="text/html")
        if self.huge or self.endless:
            return StreamingResponse(self._stream(str(body["input"])), media_type="audio/ogg")
        if body.get("response_format") != "opus":
            return Response(b"ID3\x04" + b"\x00" * 64, media_type="audio/mpeg")
        return Response(ogg_opus(str(body["input"])), media_type="audio/ogg")

    async def _stream(self, text: str) -> AsyncIterator[bytes]:
        yield ogg_opus(text)
        left = self.huge
        while left > 0:
            piece = min(left, 64 * 1024)
            yield b"\x00" * piece
            left -= piece
        while self.endless:
            await asyncio.sleep(0.05)
            yield b"\x00"


def _error(status: int, message: str) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": None}},
        status_code=status,
    )
