"""What Herald's Matrix account does on a real Synapse, watched (and faulted) on the way.

The adapter under test talks to `MatrixProxy.url`; every request goes on to the real Synapse
unchanged, and the proxy records what the account sent (events by room, edits, media
downloads, the `/sync` batches and which events each carried). Faults are switched on per
test: a 429 with a `retry_after_ms` for one room's requests, a 503 for the next sends or
event reads, and a
rewind of the next `/sync` to an earlier `since` (the homeserver then delivers those events
again, as after a restart that lost the stored token).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self
from urllib.parse import unquote

import aiohttp
from aiohttp import web

from tests.fakes.waiting import Changes, Waitable

HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "content-encoding"}


@dataclass
class Sent:
    """An event the account sent (and Synapse accepted)."""

    room: str
    event_id: str
    type: str
    content: dict[str, Any]


@dataclass
class Batch:
    """One `/sync` answer: the `since` asked with, its `next_batch`, the event ids it held."""

    since: str | None
    next_batch: str
    events: set[str] = field(default_factory=set)


class MatrixProxy(Waitable):
    """A recording, fault-injecting proxy in front of one homeserver."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self._changes = Changes()
        self.sent: list[Sent] = []
        self.batches: list[Batch] = []
        self.downloads: list[str] = []
        self.typing: list[str] = []
        self.receipts: list[str] = []
        self.refused: list[tuple[int, str | None]] = []
        """(status, room) of every request Synapse refused."""
        self.calls: list[tuple[str, str, str | None]] = []
        """(method, last path segment, room) of every request Synapse answered 200."""
        self._limited: dict[str, tuple[int, float]] = {}
        self._errors = 0
        self._read_errors = 0
        self._rewind: str | None = None
        self._holds: dict[str, asyncio.Future[Any]] = {}
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Self:
        self._http = aiohttp.ClientSession(auto_decompress=True)
        app = web.Application(client_max_size=100 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # A long poll whose client left ends with it (and a stop does not wait out its wait).
        self._runner = web.AppRunner(
            app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._changes.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()

    # -- faults ---------------------------------------------------------------------------

    def rate_limit(self, room: str, retry_after: float, count: int = 1) -> None:
        """The next `count` event sends to `room` answer 429 M_LIMIT_EXCEEDED (Synapse limits
        sends, not receipts or typing)."""
        self._limited[room] = (count, retry_after)

    def still_limited(self, room: str) -> bool:
        """Whether a `rate_limit` of `room` has 429s left to answer."""
        return room in self._limited

    def hold(self, room: str, until: asyncio.Future[Any]) -> None:
        """Requests about `room` wait until `until` is done."""
        self._holds[room] = until

    def fail_sends(self, count: int) -> None:
        """The next `count` event sends answer 503."""
        self._errors = count

    def fail_reads(self, count: int) -> None:
        """The next `count` reads of one event (`GET /rooms/…/event/…`) answer 503."""
        self._read_errors = count

    def rewind(self, event_id: str) -> None:
        """The next `/sync` starts from before the batch that delivered `event_id`."""
        batch = next(b for b in self.batches if event_id in b.events)
        self._rewind = batch.since or ""  # "": from the start (an initial sync)

    # -- what the account did ---------------------------------------------------------------

    def texts_in(self, room: str) -> list[str]:
        """The bodies of the messages the account sent to `room` (edits left out)."""
        return [
            str(s.content.get("body", ""))
            for s in self.sent
            if s.room == room and s.type == "m.room.message" and not _edit_of(s.content)
        ]

    def shown_in(self, room: str) -> list[str]:
        """The account's messages in `room` as they read after its edits."""
        shown: dict[str, str] = {}
        for s in self.sent:
            if s.room != room or s.type != "m.room.message":
                continue
            target = _edit_of(s.content)
            if target is None:
                shown[s.event_id] = str(s.content.get("body", ""))
            elif target in shown:
                new = s.content.get("m.new_content", {})
                shown[target] = str(new.get("body", ""))
        return list(shown.values())

    def edits(self) -> int:
        return sum(1 for s in self.sent if _edit_of(s.content) is not None)

    # -- proxying -------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.rel_url.raw_path
        parts = [unquote(p) for p in request.rel_url.raw_path.split("?")[0].split("/")]
        marker = next((m for m in ("rooms", "join") if m in parts[:-1]), None)
        room = parts[parts.index(marker) + 1] if marker is not None else None
        if room is not None and room in self._holds:
            await asyncio.shield(self._holds[room])
        sending = request.method == "PUT" and "send" in parts
        if sending and room in self._limited:
            count, retry_after = self._limited[room]
            if count <= 1:
                del self._limited[room]
            else:
                self._limited[room] = (count - 1, retry_after)
            refusal = {
                "errcode": "M_LIMIT_EXCEEDED",
                "error": "Too Many Requests",
                "retry_after_ms": int(retry_after * 1000),
            }
            return web.json_response(refusal, status=429)
        if sending and self._errors > 0:
            self._errors -= 1
            return web.json_response({"errcode": "M_UNKNOWN", "error": "unavailable"}, status=503)
        if request.method == "GET" and "event" in parts[:-1] and self._read_errors > 0:
            self._read_errors -= 1
            return web.json_response({"errcode": "M_UNKNOWN", "error": "unavailable"}, status=503)
        query = dict(request.query)
        syncing = parts[-1] == "sync"
        if syncing and self._rewind is not None:
            if self._rewind:
                query["since"] = self._rewind
            else:
                query.pop("since", None)
            self._rewind = None
        data = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        assert self._http is not None
        async with self._http.request(
            request.method,
            self.upstream + request.rel_url.path,
            params=query,
            data=data or None,
            headers=headers,
            allow_redirects=False,
        ) as upstream:
            body = await upstream.read()
            status = upstream.status
            content_type = upstream.headers.get("Content-Type", "application/json")
        self._record(request.method, parts, path, query, data, status, body, room)
        return web.Response(body=body, status=status, headers={"Content-Type": content_type})

    def _record(  # noqa: PLR0917 - one request and its answer
        self,
        method: str,
        parts: list[str],
        path: str,
        query: dict[str, str],
        data: bytes,
        status: int,
        body: bytes,
        room: str | None,
    ) -> None:
        if status != 200:
            self.refused.append((status, room))
            self._changes.notify()
            return
        self.calls.append((method, "join" if "join" in parts else parts[-1], room))
        if method == "PUT" and "send" in parts and room is not None:
            kind = parts[parts.index("send") + 1]
            event_id = json.loads(body).get("event_id", "")
            if not any(s.event_id == event_id for s in self.sent):
                self.sent.append(Sent(room, event_id, kind, json.loads(data)))
        elif parts[-1] == "sync":
            answer = json.loads(body)
            events: set[str] = set()
            for info in answer.get("rooms", {}).get("join", {}).values():
                for event in info.get("timeline", {}).get("events", []):
                    events.add(event.get("event_id", ""))
            self.batches.append(Batch(query.get("since"), answer.get("next_batch", ""), events))
        elif "download" in parts:
            self.downloads.append(path)
        elif "typing" in parts and room is not None:
            self.typing.append(room)
        elif "read_markers" in parts and room is not None:
            self.receipts.append(room)
        else:
            return
        self._changes.notify()


def _edit_of(content: dict[str, Any]) -> str | None:
    relates = content.get("m.relates_to")
    if isinstance(relates, dict) and relates.get("rel_type") == "m.replace":
        target = relates.get("event_id")
        return target if isinstance(target, str) else None
    return None
