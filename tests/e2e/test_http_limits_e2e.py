"""Socket limits of `herald run`'s HTTP server, on loopback, and clients that walk away."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.contracts.history import Role
from gateway.store import Store
from tests.e2e.daemon import Daemon, running
from tests.fakes.llm import FakeLLM, Reply

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
KEY = "limits-key"
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
MB = 1 << 20


@contextlib.asynccontextmanager
async def connection(daemon: Daemon) -> AsyncIterator[tuple[asyncio.StreamReader, Any]]:
    """A raw TCP connection to the daemon, closed on exit."""
    reader, writer = await asyncio.open_connection("127.0.0.1", daemon.port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """The status code and the rest of what the server sent before closing (0: nothing)."""
    try:
        data = await reader.read()
    except ConnectionError:  # reset, or a broken pipe our own writes met
        return 0, b""
    if not data:
        return 0, b""
    return int(data.split()[1]), data


async def feed_until_closed(writer: Any, pieces: Callable[[int], bytes], pause: float) -> int:
    """Write pieces until the server closes the connection; return the bytes written."""
    sent = 0
    with contextlib.suppress(ConnectionError):
        for i in range(1_000_000):
            piece = pieces(i)
            if not piece:
                break
            writer.write(piece)
            await writer.drain()
            sent += len(piece)
            await asyncio.sleep(pause)
    return sent


def rss_bytes(daemon: Daemon) -> int:
    """The daemon's resident memory."""
    assert daemon.process is not None
    status = Path(f"/proc/{daemon.process.pid}/status").read_text(encoding="ascii")
    line = next(ln for ln in status.splitlines() if ln.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


async def until(check: Callable[[], Any], timeout: float = 15.0) -> None:
    """Poll a sync or async condition every 50 ms until it holds (TimeoutError)."""
    async with asyncio.timeout(timeout):
        while True:
            result = check()
            if asyncio.iscoroutine(result):
                result = await result
            if result:
                return
            await asyncio.sleep(0.05)


async def test_a_slow_or_silent_request_head_is_cut_off(tmp_path: Path) -> None:
    async with running(tmp_path / "s", api={"header_timeout": 1, "idle_timeout": 1}) as daemon:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(20):
            # One byte every 50 ms, never ending: cut after the timeout, not kept alive.
            async with connection(daemon) as (reader, writer):
                started = loop.time()
                slow = HEAD + b"X-Slow: " + b"a" * 10_000
                drip = asyncio.create_task(
                    feed_until_closed(writer, lambda i: slow[i : i + 1], 0.05)
                )
                status, data = await answer(reader)
                elapsed = loop.time() - started
                drip.cancel()
            # 408, or a reset when a dripped byte crossed the server's close.
            assert status in (408, 0)
            assert status == 0 or b"took longer than 1s" in data
            assert elapsed >= 0.9  # closed by the server's timeout (clocks differ a little)
            # A connection that sends nothing at all.
            async with connection(daemon) as (reader, _):
                status, data = await answer(reader)
            assert status == 408
            assert b"took longer than 1s" in data
            # A kept-alive connection after its answer: closed when idle for idle_timeout.
            async with connection(daemon) as (reader, writer):
                writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                started = loop.time()
                status, data = await answer(reader)  # reads until the server closes
                elapsed = loop.time() - started
            assert status == 200
            assert b'"status":"ok"' in data
            assert elapsed >= 0.9  # closed by the server's timeout (clocks differ a little)
        async with httpx.AsyncClient(base_url=daemon.url) as http:
            assert (await http.get("/health")).status_code == 200
        assert await daemon.stop() == 0


async def test_huge_or_too_many_headers_are_refused_without_memory_growth(
    tmp_path: Path,
) -> None:
    async with running(tmp_path / "s", api={"max_header_bytes": 16384}) as daemon:
        before = rss_bytes(daemon)
        piece = b"a" * (64 * 1024)

        def endless(i: int) -> bytes:
            """The request line, then one header line of up to 64 MB."""
            return HEAD + b"X-Big: " if i == 0 else piece if i <= 1024 else b""

        async def never_ending_header() -> tuple[int, int]:
            async with connection(daemon) as (reader, writer):
                # Up to 64 MB of one header, in 64 KB pieces, until the server hangs up.
                sending = asyncio.create_task(feed_until_closed(writer, endless, 0))
                status, _ = await answer(reader)
                return status, await sending

        async with asyncio.timeout(60):
            results = await asyncio.gather(*(never_ending_header() for _ in range(8)))
        for status, sent in results:
            assert status in (431, 0)  # 431, or the connection reset under the client's writes
            assert sent < 16 * MB  # the server stopped reading long before 64 MB
        assert rss_bytes(daemon) - before < 40 * MB

        # A head just over the limit, sent whole: the client reads the 431.
        async with connection(daemon) as (reader, writer):
            writer.write(HEAD + b"X-Big: " + b"a" * 17_000 + b"\r\n\r\n")
            status, data = await answer(reader)
        assert status == 431
        assert b"larger than 16384 bytes" in data

        # A small head with a body larger than the head limit, sent whole: only the head counts.
        body = b'{"messages": [], "pad": "' + b"a" * 40_000 + b'"}'
        # Addressed to this server by its port (without a key, the API serves no other Host).
        here = HEAD.replace(b"127.0.0.1", b"127.0.0.1:%d" % daemon.port)
        async with connection(daemon) as (reader, writer):
            length = b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
            writer.write(here + b"Content-Type: application/json\r\n" + length + body)
            status, data = await answer(reader)
        assert status == 400, data[:200]

        fields = b"".join(b"X-F%d: v\r\n" % i for i in range(101))
        async with connection(daemon) as (reader, writer):
            writer.write(HEAD + fields + b"Content-Length: 0\r\n\r\n")
            status, data = await answer(reader)
        assert status == 431
        assert b"more than 100 header fields" in data
        async with httpx.AsyncClient(base_url=daemon.url) as http:
            assert (await http.get("/health")).status_code == 200
        assert await daemon.stop() == 0


async def test_connections_past_the_cap_get_503_and_the_server_recovers(tmp_path: Path) -> None:
    cap = 20
    async with running(tmp_path / "s", api={"max_connections": cap}) as daemon:
        async with contextlib.AsyncExitStack() as stack, asyncio.timeout(30):
            held = [await stack.enter_async_context(connection(daemon)) for _ in range(cap)]
            for _ in range(3 * cap):  # the flood: each is answered at once and closed
                async with connection(daemon) as (reader, _):
                    status, data = await answer(reader)
                assert status == 503
                assert b"retry-after: 1" in data
            assert len(held) == cap
        # The flood is gone: a normal request is served again.
        async with httpx.AsyncClient(base_url=daemon.url) as http:

            async def served() -> bool:
                with contextlib.suppress(httpx.TransportError):
                    return (await http.get("/health")).status_code == 200
                return False

            await until(served)
        assert await daemon.stop() == 0


async def test_a_never_ending_body_is_cut_off_and_one_client_gets_half_the_connections(
    tmp_path: Path,
) -> None:
    cap = 6
    api = {"max_connections": cap, "body_timeout": 1, "key": KEY}
    async with running(tmp_path / "s", api=api) as daemon:
        loop = asyncio.get_running_loop()
        body_head = HEAD + b"Content-Type: application/json\r\nContent-Length: 1000\r\n"
        async with contextlib.AsyncExitStack() as stack, asyncio.timeout(30):
            # Without the key, the API answers 401 before it waits for the body.
            async with connection(daemon) as (reader, writer):
                writer.write(body_head + b"\r\n" + b'{"messages": ')
                status, data = await answer(reader)
            assert status == 401, data
            # Bodies that never end, with the key: the client's share is half the cap.
            auth = f"Authorization: Bearer {KEY}\r\n\r\n".encode()
            held = []
            for _ in range(cap // 2):
                reader, writer = await stack.enter_async_context(connection(daemon))
                writer.write(body_head + auth + b'{"messages": ')
                held.append(reader)
            started = loop.time()
            for _ in range(cap // 2):  # its next connections are refused at once
                async with connection(daemon) as (reader, _):
                    status, data = await answer(reader)
                assert status == 503
                assert b"too many open connections from 127.0.0.1" in data
            # Another client (another loopback address) is served meanwhile.
            other = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
            async with httpx.AsyncClient(transport=other, base_url=daemon.url) as http:
                assert (await http.get("/health")).status_code == 200
            # The never-ending bodies are cut off: 408, the connection closed.
            for reader in held:
                status, data = await answer(reader)
                assert status == 408, data
                assert b"the request body took longer than 1s" in data
            assert loop.time() - started >= 0.9
        async with httpx.AsyncClient(base_url=daemon.url) as http:

            async def served() -> bool:
                with contextlib.suppress(httpx.TransportError):
                    return (await http.get("/health")).status_code == 200
                return False

            await until(served)
        assert await daemon.stop() == 0


async def metric(http: httpx.AsyncClient, name: str) -> float:
    """A sample of `/metrics` by its exact name and labels (0 when absent)."""
    for line in (await http.get("/metrics")).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


async def test_a_client_that_leaves_cancels_its_stateless_turn(tmp_path: Path) -> None:
    llm_settings: dict[str, Any]
    async with FakeLLM() as llm:
        llm_settings = {"base_url": llm.base_url, "api_key": "k", "memory_pass": False}
        llm.responder = lambda body: Reply(hang=True)
        async with running(tmp_path / "s", llm=llm_settings) as daemon:
            body = {"messages": [{"role": "user", "content": "think forever"}]}
            async with httpx.AsyncClient(base_url=daemon.url, timeout=10) as http:
                # Streamed: read the first event, then hang up.
                async with http.stream(
                    "POST", "/v1/chat/completions", json={**body, "stream": True}
                ) as response:
                    assert response.status_code == 200
                    lines = response.aiter_lines()  # held: leaving it would hang up
                    assert (await anext(lines)).startswith("data: ")
                    await llm.wait_for_requests(1)  # the turn is waiting on the model
                await until(lambda: llm.abandoned == 1)
                # Not streamed: the client gives up waiting.
                asking = asyncio.create_task(http.post("/v1/chat/completions", json=body))
                await llm.wait_for_requests(2)
                asking.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await asking
                await until(lambda: llm.abandoned == 2)
                interrupted = 'herald_turns_total{status="interrupted"}'

                async def both_interrupted() -> bool:
                    return await metric(http, interrupted) == 2.0

                await until(both_interrupted)
                assert await metric(http, "herald_running_turns") == 0.0
            assert len(llm.requests) == 2
            assert await daemon.stop() == 0


async def test_a_session_turn_whose_client_left_is_finished_and_stored(tmp_path: Path) -> None:
    async with FakeLLM() as llm:
        reply = "one two three four five"
        llm.responder = lambda body: Reply(text=reply, chunk_delay=0.2)
        settings = {"base_url": llm.base_url, "api_key": "k", "memory_pass": False}
        async with running(tmp_path / "s", llm=settings, api={"key": KEY}) as daemon:
            headers = {"Authorization": f"Bearer {KEY}", "X-Herald-Session-Id": "walker"}
            body = {"messages": [{"role": "user", "content": "count"}], "stream": True}
            async with httpx.AsyncClient(base_url=daemon.url, timeout=10) as http:
                async with http.stream(
                    "POST", "/v1/chat/completions", json=body, headers=headers
                ) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data: ") and "one" in line:
                            break  # the first word arrived; leave mid-stream
                assert '"five"' not in json.dumps(line)

                async def stored() -> bool:
                    async with Store.open(daemon.database_url, migrate=False) as store:
                        session = await store.get_session("api:default:walker")
                        if session is None:
                            return False
                        transcript = await store.transcript(session.id)
                    return [(m.role, m.content) for m in transcript] == [
                        (Role.USER, "count"),
                        (Role.ASSISTANT, reply),
                    ]

                await until(stored)
                auth = {"Authorization": f"Bearer {KEY}"}

                async def counted() -> bool:
                    # Counted once the turn's commit is back from the database: a moment
                    # after another connection can read it.
                    text = (await http.get("/metrics", headers=auth)).text
                    return 'herald_turns_total{status="completed"} 1.0' in text

                await until(counted)
            assert await daemon.stop() == 0
