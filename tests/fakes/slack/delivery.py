"""How `FakeSlackServer` delivers events: Socket Mode envelopes and their acks, and Events API
requests, each function taking the server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import TYPE_CHECKING
from urllib.parse import urlencode

import httpx
from aiohttp import WSMsgType, web

from tests.fakes.slack.records import (
    HttpDelivery,
    SocketInfo,
    _Event,
    _Socket,
)

if TYPE_CHECKING:
    from tests.fakes.slack.server import FakeSlackServer


# -- internals: Socket Mode -------------------------------------------------------------------


async def socket_endpoint(server: FakeSlackServer, request: web.Request) -> web.StreamResponse:
    ticket = request.query.get("ticket", "")
    if server._faults.refuse_handshake > 0:
        server._faults.refuse_handshake -= 1
        server.refused_connections += 1
        server._changes.notify()
        return web.Response(status=503, text="Service Unavailable")
    if ticket not in server._tickets:
        return web.Response(status=401, text="invalid ticket")
    ws = web.WebSocketResponse(autoping=False, heartbeat=None, timeout=5.0)
    await ws.prepare(request)
    server._tickets.discard(ticket)
    info = SocketInfo(next(server._socket_ids), ticket, time.monotonic())
    transport = request.transport
    sock = _Socket(info, ws, transport if isinstance(transport, asyncio.Transport) else None)
    server.sockets.append(info)
    server._open.append(sock)
    server.max_open_sockets = max(server.max_open_sockets, len(server._open))
    hello = {
        "type": "hello",
        "num_connections": len(server._open),
        "debug_info": {
            "host": f"applink-fake-{info.id}",
            "build_number": 1,
            "approximate_connection_time": 18060,
        },
        "connection_info": {"app_id": server.app_id},
    }
    sock.outbox.put_nowait(json.dumps(hello))
    sock.ready = True
    sender = asyncio.create_task(send_loop(server, sock))
    server._changes.notify()
    server._dispatch()
    reason = "connection_lost"
    try:
        while not sock.closed:
            msg = await ws.receive()
            if msg.type is WSMsgType.TEXT:
                server._on_text(sock, msg.data)
            elif msg.type is WSMsgType.PING:
                if not sock.info.silenced:
                    with contextlib.suppress(ConnectionError, RuntimeError):
                        await ws.pong(msg.data)
            elif msg.type is WSMsgType.CLOSE:
                reason = "client_close"
                break
            elif msg.type is WSMsgType.CLOSING and sock.closing:
                # The server's own close, from the sender: let it finish the handshake.
                await sock.close_done.wait()
                break
            elif msg.type in (WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
                break
    finally:
        server._mark_closed(sock, reason)
        server._dispatch()
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
    return ws


async def send_loop(server: FakeSlackServer, sock: _Socket) -> None:
    """Write what is queued for `sock`, in order, while it is open (a silenced socket's
    frames are dropped); close it when told to (waiting up to 5 s for the client's close)."""
    while True:
        text = await sock.outbox.get()
        if sock.closed:
            return
        if text is None:
            try:
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await sock.ws.close()
            finally:
                server._mark_closed(sock, "server_close")
                sock.close_done.set()
            return
        if sock.info.silenced:
            continue
        try:
            await sock.ws.send_str(text)
        except (ConnectionError, RuntimeError):
            return


def close_later(server: FakeSlackServer, sock: _Socket) -> None:
    """Close `sock` with a close frame once what is queued for it is sent."""
    if sock.closed or sock.closing:
        return
    sock.closing = True
    sock.outbox.put_nowait(None)
    server._changes.notify()


# -- internals: Events API --------------------------------------------------------------------


async def deliver_over_http(server: FakeSlackServer, event: _Event) -> None:
    """POST `event` to the Events API URL until a 2xx, retrying like Slack."""
    reason = ""
    while not event.acked:
        url = server.events_url
        if url is None:  # switched back to Socket Mode
            server._pending.append(event)
            server._pending.sort(key=lambda e: e.seq)
            server._dispatch()
            return
        if event.kind == "interactive":
            url = server.interactivity_url or url
        attempt = event.attempts
        event.attempts += 1
        status, error, no_retry = await post_event(server, url, event, attempt, reason)
        server.http_deliveries.append(
            HttpDelivery(event.event_id, url, attempt, reason, status, error, time.monotonic())
        )
        if error is None:
            server._acknowledge(event)
            server._changes.notify()
            return
        server._changes.notify()
        if no_retry or attempt >= server.max_retries:
            event.expired = True
            server.expired.append(event.event_id)
            server._changes.notify()
            return
        reason = error
        with contextlib.suppress(TimeoutError):
            await server.wait_for(server._changes.stopping.is_set, server.events_retry_delay)
        if server._changes.stopping.is_set():
            return


async def post_event(
    server: FakeSlackServer, url: str, event: _Event, attempt: int, reason: str
) -> tuple[int | None, str | None, bool]:
    """POST one attempt: (status, None when 2xx else Slack's retry reason, no-retry asked)."""
    if event.kind == "interactive":
        form = urlencode({"payload": json.dumps(event.body)}).encode()
        request = server.signed_request(form)
        request.headers["Content-Type"] = "application/x-www-form-urlencoded"
    else:
        request = server.signed_request(
            event.body,
            retry_num=attempt or None,
            retry_reason=reason or None,
        )
    try:
        response = await server._client().post(url, content=request.body, headers=request.headers)
    except httpx.TimeoutException:
        return None, "http_timeout", False
    except httpx.ConnectError:
        return None, "connection_failed", False
    except (httpx.HTTPError, httpx.InvalidURL):
        return None, "unknown_error", False
    no_retry = response.headers.get("x-slack-no-retry") == "1"
    if 200 <= response.status_code < 300:
        return response.status_code, None, no_retry
    if 300 <= response.status_code < 400:
        return response.status_code, "too_many_redirects", no_retry
    return response.status_code, "http_error", no_retry
