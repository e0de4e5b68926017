"""Bad input on the HTTP API: a clear status code, and nothing written."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.store import Store
from tests.e2e.daemon import Daemon, running

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
KEY = "bad-input-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
GOOD = {"messages": [{"role": "user", "content": "hello"}]}
LIMIT = 4096


async def raw_request(daemon: Daemon, head: bytes, body: bytes = b"") -> int:
    """Send bytes as they are (no client-side header validation); return the status code."""
    reader, writer = await asyncio.open_connection("127.0.0.1", daemon.port)
    try:
        writer.write(head + body)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 10)
    finally:
        writer.close()
        await writer.wait_closed()
    return int(status_line.split()[1])


def request_head(headers: dict[str, bytes], length: int) -> bytes:
    """A POST /v1/chat/completions request head with the given extra headers."""
    lines = [
        b"POST /v1/chat/completions HTTP/1.1",
        b"Host: 127.0.0.1",
        b"Content-Type: application/json",
        f"Content-Length: {length}".encode(),
        b"Connection: close",
        *(name.encode() + b": " + value for name, value in headers.items()),
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def assert_nothing_written(daemon: Daemon) -> None:
    """No session, turn or message was stored."""
    async with Store.open(daemon.database_url) as store:
        assert await store.list_sessions() == []
        assert await store.search_messages("hello", user_id=None) == []


async def test_bad_requests_get_clear_errors_and_change_nothing(tmp_path: Path) -> None:
    config = {"api": {"key": KEY, "max_body_bytes": LIMIT}}
    async with running(tmp_path / "s", **config) as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=10) as http:

            async def post(
                body: Any = GOOD, headers: dict[str, str] | None = None, raw: bytes | None = None
            ) -> httpx.Response:
                content = raw if raw is not None else json.dumps(body).encode()
                return await http.post(
                    "/v1/chat/completions",
                    content=content,
                    headers={
                        "Content-Type": "application/json",
                        **(AUTH if headers is None else headers),
                    },
                )

            # Authentication.
            assert (await post(headers={})).status_code == 401
            wrong = await post(headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401
            assert wrong.json()["error"]["type"] == "authentication_error"
            assert (await post(headers={"Authorization": KEY})).status_code == 401

            # Malformed or invalid JSON bodies.
            for raw in (b"{not json", b"", b"[1, 2]", b'"text"'):
                response = await post(raw=raw)
                assert response.status_code == 400, raw
                assert "error" in response.json()
            invalid: tuple[dict[str, Any], ...] = (
                {},
                {"messages": []},
                {"messages": "hello"},
                {"messages": [{"role": "wizard", "content": "x"}]},
                {"messages": [{"role": "user", "content": 5}]},
                {"messages": [{"role": "assistant", "content": "only me"}]},
                {"messages": [{"role": "user", "content": "x"}], "stream": "maybe"},
                {"messages": [{"role": "user", "content": "x"}], "user": "u" * 300},
                {"messages": [{"role": "user", "content": "x"}], "user": "bad\u0001id"},
            )
            for body in invalid:
                response = await post(body)
                assert response.status_code == 400, body
                assert response.json()["error"]["type"] == "invalid_request_error"
            named = await post({"messages": [{"role": "wizard", "content": "x"}]})
            assert "messages.0.role" in named.json()["error"]["message"]

            # Session and user headers: too long.
            for name in ("X-Herald-Session-Id", "X-Hermes-Session-Id", "X-Herald-User-Id"):
                response = await post(headers={**AUTH, name: "s" * 257})
                assert response.status_code == 400, name

            # Oversized bodies: declared, and streamed without a length.
            big = {"messages": [{"role": "user", "content": "x" * (LIMIT * 2)}]}
            assert (await post(big)).status_code == 413

        # Oversized body without a declared length (chunked), sent raw.
        piece = b" " * LIMIT
        chunk = f"{len(piece):x}".encode() + b"\r\n" + piece + b"\r\n"
        head = b"\r\n".join(
            [
                b"POST /v1/chat/completions HTTP/1.1",
                b"Host: 127.0.0.1",
                b"Content-Type: application/json",
                b"Transfer-Encoding: chunked",
                f"Authorization: Bearer {KEY}".encode(),
                b"",
                b"",
            ]
        )
        assert await raw_request(daemon, head, chunk * 3 + b"0\r\n\r\n") == 413

        # Control characters in headers, sent raw (clients refuse to send them).
        good = json.dumps(GOOD).encode()
        for value in (b"abc\x01def", b"abc\x7fdef", b"a\x00b"):
            head = request_head(
                {"Authorization": f"Bearer {KEY}".encode(), "X-Herald-Session-Id": value},
                len(good),
            )
            assert await raw_request(daemon, head, good) == 400, value
        assert await daemon.stop() == 0
    await assert_nothing_written(daemon)


async def test_session_headers_need_a_configured_key(tmp_path: Path) -> None:
    async with running(tmp_path / "s") as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=10) as http:
            for name in ("X-Herald-Session-Id", "X-Hermes-Session-Id", "X-Herald-User-Id"):
                response = await http.post("/v1/chat/completions", json=GOOD, headers={name: "abc"})
                assert response.status_code == 403, name
                assert "api.key" in response.json()["error"]["message"]
        assert await daemon.stop() == 0
    await assert_nothing_written(daemon)


async def test_refuses_to_listen_beyond_loopback_without_a_key(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path / "s", {"api": {"host": "0.0.0.0"}})  # noqa: S104 - the point
    with pytest.raises(RuntimeError, match="herald exited on start"):
        await daemon.start()
    assert daemon.process is not None
    assert await daemon.wait() == 2
    assert "api.key is required" in daemon.output()
