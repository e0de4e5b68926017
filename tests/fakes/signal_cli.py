"""A fake signal-cli daemon (`signal-cli daemon --http`, `--receive-mode=on-connection`) on
127.0.0.1, speaking its HTTP interface as signal-cli-jsonrpc(5) documents it:

- `POST /api/v1/rpc`: one JSON-RPC 2.0 request → `{"jsonrpc", "result" | "error", "id"}`.
  Methods: `version` (`{"version"}`), `listAccounts` (`[{"number"}]`, in multi-account mode
  only; a single-account daemon answers -32601), `getUserStatus`, `send` (`recipient` list or
  `groupId`, `message`, `attachments` as data URIs, `textStyle`, `quoteTimestamp` /
  `quoteAuthor`, `editTimestamp` → `{"timestamp", "results"}`), `sendTyping`, `sendReaction`
  (`emoji`, `targetAuthor`, `targetTimestamp`, `remove`), `sendReceipt` (`recipient`,
  `targetTimestamp` list, `type`), `getAttachment` (`id` → `{"data": base64}`), `listGroups`.
  In multi-account mode a request names its `account`; an unknown one is -32602.
  Errors as signal-cli's command handler writes them: -1 user error, -3 I/O, -4 untrusted key,
  -5 rate limit (its `data.response.results[].retryAfterSeconds`).
- `GET /api/v1/events`: server-sent events, `event:receive` / `data:{"account", "envelope"}`
  per message, a `:` comment as keep-alive. Like signal-cli in `on-connection` mode the fake
  hands out messages only while a stream is open, writes each to every open stream and
  forgets it (no redelivery); messages sent while none is open wait (on Signal's servers).
- `GET /api/v1/check`: 200.

Faults: `rate_limit(to, retry_after)` (the next send to that chat: -5), `fail(count, status)`
(the next `count` sends: HTTP 5xx), `block(to)` (every send there: UNREGISTERED_FAILURE, -1),
`drop_streams()` (every open stream closed between two events), `deliver_twice()` (the next
message is written twice); `clear_faults()` switches them all off.
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote_plus

from aiohttp import web

from tests.fakes.serving import AiohttpServer, Served
from tests.fakes.waiting import Changes, Waitable

JSON = dict[str, Any]
HERALD_NUMBER = "+15550009999"
VERSION = "0.13.22"


@dataclass(frozen=True, slots=True)
class File:
    """A file of a message Herald sent (decoded from its data URI)."""

    mime_type: str
    filename: str
    data: bytes


@dataclass(frozen=True, slots=True)
class Sent:
    """A message Herald sent (`send`)."""

    chat: str
    """The recipient's number or uuid, or the group id."""
    text: str
    timestamp: int
    styles: tuple[str, ...] = ()
    files: tuple[File, ...] = ()
    quote: tuple[str, int] | None = None
    """(author, timestamp) of the message quoted."""
    edit_of: int | None = None


@dataclass(frozen=True, slots=True)
class Call:
    """Any other JSON-RPC request Herald made (typing, reactions, receipts)."""

    method: str
    params: JSON


@dataclass
class _Faults:
    rate_limited: dict[str, list[float]] = field(default_factory=dict)
    failing: list[int] = field(default_factory=list)
    blocked: set[str] = field(default_factory=set)
    twice: int = 0
    lookups: list[tuple[int, str]] = field(default_factory=list)


def _parse_data_uri(uri: str) -> File:
    head, _, payload = uri.partition(",")
    parts = head.removeprefix("data:").split(";")
    mime = parts[0] or "application/octet-stream"
    name = next((p.removeprefix("filename=") for p in parts if p.startswith("filename=")), "")
    name = unquote_plus(name, errors="strict")  # as signal-cli's URLDecoder reads it
    return File(mime, name, base64.b64decode(payload))


def _chat_of(params: Mapping[str, Any]) -> str:
    group = params.get("groupId")
    if isinstance(group, str):
        return group
    to = params.get("recipient")
    if isinstance(to, list):
        return str(to[0])
    return str(to)


class FakeSignalCli(Served, Waitable):
    """The fake daemon (see the module doc). `async with FakeSignalCli() as signal:`."""

    def __init__(
        self,
        *,
        number: str = HERALD_NUMBER,
        multi_account: bool = False,
        registered: bool = True,
        keepalive: float = 15.0,
        port: int = 0,
        others: Sequence[str] = (),
    ) -> None:
        self.number = number
        self.multi_account = multi_account
        self.others = tuple(others)
        """Further accounts of a multi-account daemon (their events go to streams opened
        without `?account=`; a request naming no account is refused, as signal-cli does
        once it holds more than one)."""
        self.registered = registered
        self.keepalive = keepalive
        self.uuid = str(uuid.uuid4())
        self.sent: list[Sent] = []
        self.calls: list[Call] = []
        self.downloads: list[str] = []
        self.written: list[JSON] = []
        """Every event written to a stream, in order (a message written twice: twice)."""
        self.streams_opened = 0
        self.lost_with_client: list[JSON] = []
        """Events written to a stream whose client went away (killed) before it ended: such
        a client may not have stored them, and signal-cli does not send them again."""
        self.faults = _Faults()
        self.uuids: dict[str, str] = {}
        self._pending: list[JSON] = []
        self._files: dict[str, bytes] = {}
        self._endless: set[str] = set()
        self._streams: list[_Stream] = []
        self._last_stamp = 0
        self._changes = Changes()
        self._port = port
        self._server: AiohttpServer | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the server is not started")
        return self._server.port

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/api/v1/rpc", self._rpc)
        app.router.add_get("/api/v1/events", self._events)
        app.router.add_get("/api/v1/check", self._check)
        self._server = AiohttpServer(app, self._port)
        await self._server.start()

    async def _stop(self) -> None:
        self._changes.stop()
        for stream in self._streams:
            stream.closed = True
        if self._server is not None:
            await self._server.stop()

    # -- people ---------------------------------------------------------------------------------

    def uuid_of(self, number: str) -> str:
        """A person's uuid (made up once per number)."""
        return self.uuids.setdefault(number, str(uuid.uuid4()))

    def stamp(self) -> int:
        """A fresh timestamp (milliseconds), later than every earlier one."""
        self._last_stamp = max(self._last_stamp + 1, int(time.time() * 1000))
        return self._last_stamp

    def envelope(self, sender: str, body: JSON, *, name: str = "") -> JSON:
        """An envelope from `sender` (a number) carrying `body` (`dataMessage`, …)."""
        stamp = body.get("dataMessage", {}).get("timestamp") or self.stamp()
        return {
            "account": self.number,
            "envelope": {
                "source": sender,
                "sourceNumber": sender,
                "sourceUuid": self.uuid_of(sender),
                "sourceName": name or f"Person {sender[-4:]}",
                "sourceDevice": 1,
                "timestamp": stamp,
                "serverReceivedTimestamp": stamp + 5,
                "serverDeliveredTimestamp": stamp + 9,
                **body,
            },
        }

    def add_endless_file(self) -> str:
        """An attachment whose `getAttachment` answer never ends (base64 written until the
        client goes away); its id."""
        ident = f"{uuid.uuid4().hex[:20]}.endless"
        self._endless.add(ident)
        return ident

    def add_file(self, data: bytes) -> str:
        """Keep `data` as an attachment the daemon has; its id."""
        ident = f"{uuid.uuid4().hex[:20]}.bin"
        self._files[ident] = data
        return ident

    def message(
        self,
        sender: str,
        text: str,
        *,
        group: str | None = None,
        files: Sequence[tuple[bytes, str, str]] = (),
        quote: tuple[str, int] | None = None,
        mention_me: bool = False,
    ) -> JSON:
        """The `receive` event of a message from `sender`: in `group` (else a direct chat),
        with `files` as (bytes, content type, name), quoting (author, timestamp)."""
        stamp = self.stamp()
        data: JSON = {"timestamp": stamp, "message": text, "expiresInSeconds": 0, "viewOnce": False}
        if group is not None:
            data["groupInfo"] = {
                "groupId": group,
                "groupName": "Team",
                "revision": 3,
                "type": "DELIVER",
            }
        if files:
            data["attachments"] = [
                {
                    "contentType": mime,
                    "filename": name,
                    "id": self.add_file(content),
                    "size": len(content),
                    "width": None,
                    "height": None,
                    "caption": None,
                    "uploadTimestamp": stamp,
                }
                for content, mime, name in files
            ]
        if quote is not None:
            author, when = quote
            data["quote"] = {
                "id": when,
                "author": author,
                "authorNumber": author,
                "authorUuid": self.uuid_of(author),
                "text": "",
                "attachments": [],
            }
        if mention_me:
            data["message"] = "\ufffc " + text
            data["mentions"] = [
                {
                    "name": self.number,
                    "number": self.number,
                    "uuid": self.uuid,
                    "start": 0,
                    "length": 1,
                }
            ]
        return self.envelope(sender, {"dataMessage": data})

    def reaction(
        self, sender: str, emoji: str, target: tuple[str, int], *, group: str | None = None
    ) -> JSON:
        """The `receive` event of `sender` reacting to the message (author, timestamp)."""
        data: JSON = {
            "timestamp": self.stamp(),
            "message": None,
            "reaction": {
                "emoji": emoji,
                "targetAuthor": target[0],
                "targetAuthorNumber": target[0],
                "targetAuthorUuid": self.uuid_of(target[0]),
                "targetSentTimestamp": target[1],
                "isRemove": False,
            },
        }
        if group is not None:
            data["groupInfo"] = {
                "groupId": group,
                "groupName": "Team",
                "revision": 3,
                "type": "DELIVER",
            }
        return self.envelope(sender, {"dataMessage": data})

    def edit(self, sender: str, target: int, text: str) -> JSON:
        """The `receive` event of `sender` editing their message sent at `target`."""
        data = {
            "timestamp": self.stamp(),
            "message": text,
            "expiresInSeconds": 0,
            "viewOnce": False,
        }
        return self.envelope(
            sender, {"editMessage": {"targetSentTimestamp": target, "dataMessage": data}}
        )

    def push(self, event: JSON) -> JSON:
        """Write `event` to every open stream, or keep it for the next one to open (Signal's
        servers hold it until the daemon receives again)."""
        open_streams = [s for s in self._streams if not s.closed]
        for stream in open_streams:
            if stream.account in (None, event.get("account")):
                stream.queue.append(event)
        if not open_streams:
            self._pending.append(event)
        self._changes.notify()
        return event

    def say(self, sender: str, text: str, **kwargs: Any) -> int:
        """Queue a message from `sender` (see `message`); its timestamp."""
        event = self.push(self.message(sender, text, **kwargs))
        stamp: int = event["envelope"]["timestamp"]
        return stamp

    # -- what Herald did ---------------------------------------------------------------------

    def texts_to(self, chat: str) -> list[str]:
        """The texts Herald sent to `chat`, in order."""
        return [s.text for s in self.sent if s.chat == chat]

    def read(self, author: str, stamp: int) -> bool:
        """Whether Herald sent a read receipt for `author`'s message at `stamp`."""
        return any(
            c.method == "sendReceipt"
            and c.params.get("recipient") in ([author], author)
            and stamp in (c.params.get("targetTimestamp") or ())
            for c in self.calls
        )

    def called(self, method: str) -> list[JSON]:
        """The parameters of each `method` request so far."""
        return [c.params for c in self.calls if c.method == method]

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    @property
    def pending(self) -> int:
        """Messages not yet handed to a stream."""
        return len(self._pending)

    # -- faults ----------------------------------------------------------------------------

    def rate_limit(self, to: str, retry_after: float, count: int = 1) -> None:
        self.faults.rate_limited.setdefault(to, []).extend([retry_after] * count)

    def fail(self, count: int, status: int = 503) -> None:
        self.faults.failing.extend([status] * count)

    def fail_lookups(self, code: int, message: str, count: int = 1) -> None:
        """The next `count` getUserStatus requests fail with JSON-RPC error `code` (-5: a
        rate limit of Signal's contact discovery, -3: Signal's servers unreachable)."""
        self.faults.lookups.extend([(code, message)] * count)

    def block(self, to: str) -> None:
        self.faults.blocked.add(to)

    def drop_streams(self) -> None:
        """Close every open stream now (between two events: nothing half written; what was
        not yet written to a stream goes to the next one, as Signal's servers keep what the
        daemon did not receive)."""
        for stream in self._streams:
            stream.closed = True
            self._pending.extend(e for e in stream.queue if e not in self._pending)
            stream.queue.clear()
        self._changes.notify()

    def deliver_twice(self, count: int = 1) -> None:
        """The next `count` messages are written to the stream twice."""
        self.faults.twice += count

    def clear_faults(self) -> None:
        """Every fault not yet used is forgotten, and no chat is blocked any more."""
        self.faults = _Faults()

    # -- HTTP ---------------------------------------------------------------------------------

    async def _check(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _events(self, request: web.Request) -> web.StreamResponse:
        account = request.query.get("account")
        if account is not None and account != self.number:
            return web.Response(status=400)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        stream = _Stream(list(self._pending), account=account)
        self._pending.clear()
        self._streams.append(stream)
        self.streams_opened += 1
        self._changes.notify()
        last = time.monotonic()

        def gone() -> bool:
            transport = request.transport
            return transport is None or transport.is_closing()

        try:
            while not stream.closed and not self._changes.stopping.is_set() and not gone():
                if stream.queue:
                    event = stream.queue.pop(0)
                    copies = 2 if self.faults.twice else 1
                    self.faults.twice = max(0, self.faults.twice - 1)
                    line = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
                    for _ in range(copies):
                        await response.write(f"event:receive\ndata:{line}\n\n".encode())
                        self.written.append(event)
                        stream.written.append(event)
                    self._changes.notify()
                    continue
                if time.monotonic() - last >= self.keepalive:
                    await response.write(b":\n")
                    last = time.monotonic()
                with contextlib.suppress(TimeoutError):
                    await self._changes.wait_for(
                        lambda: stream.closed or bool(stream.queue), min(self.keepalive, 0.5)
                    )
        except ConnectionError:
            pass
        finally:
            self._streams.remove(stream)
            if gone():
                self.lost_with_client.extend(stream.written)
            # Not yet written to this stream: the other streams (or the next) get it.
            others = [s for s in self._streams if not s.closed]
            for event in stream.queue:
                targets = [s.queue for s in others] or [self._pending]
                for queue in targets:
                    if event not in queue:
                        queue.append(event)
            self._changes.notify()
        with contextlib.suppress(ConnectionError, RuntimeError):
            await response.write_eof()
        return response

    async def _rpc(self, request: web.Request) -> web.StreamResponse:
        if not request.content_type.startswith("application/json"):
            return web.Response(status=415)
        try:
            body = await request.json()
        except ValueError:
            return _answer(None, error=(-32700, "parse error"))
        ident = body.get("id") if isinstance(body, dict) else None
        if not isinstance(body, dict) or not isinstance(body.get("method"), str):
            return _answer(ident, error=(-32600, "method field must be set"))
        method: str = body["method"]
        params: JSON = dict(body.get("params") or {})
        if method == "send" and self.faults.failing:
            return web.Response(status=self.faults.failing.pop(0))
        if self.multi_account and method not in ("version", "listAccounts"):
            account = params.pop("account", None)
            if account is not None and account != self.number:
                return _answer(ident, error=(-32602, "Specified account does not exist"))
            if account is None and self.others:
                return _answer(ident, error=(-32602, "Method requires valid account parameter"))
        elif "account" in params:
            return _answer(ident, error=(-32602, 'Unrecognized field "account"'))
        if method == "getAttachment" and params.get("id") in self._endless:
            self.downloads.append(str(params["id"]))
            return await self._endless_answer(request, ident)
        try:
            result = self._method(method, params)
        except _RpcFailure as failure:
            return _answer(ident, error=(failure.code, failure.message), data=failure.data)
        self._changes.notify()
        return _answer(ident, result=result)

    async def _endless_answer(self, request: web.Request, ident: Any) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        head = json.dumps({"jsonrpc": "2.0", "id": ident})[:-1]
        await response.write(f'{head}, "result": {{"data": "'.encode())
        chunk = b"A" * 65536
        with contextlib.suppress(ConnectionError, RuntimeError):
            while not self._changes.stopping.is_set():
                transport = request.transport
                if transport is None or transport.is_closing():
                    break
                await response.write(chunk)
        return response

    def _method(self, method: str, params: JSON) -> Any:
        if method == "version":
            return {"version": VERSION}
        if method == "listAccounts":
            if not self.multi_account:
                raise _RpcFailure(-32601, "Method not implemented")
            mine = [{"number": self.number}] if self.registered else []
            return mine + [{"number": n} for n in self.others]
        if method == "getUserStatus":
            if self.faults.lookups:
                raise _RpcFailure(*self.faults.lookups.pop(0))
            if not self.registered:
                raise _RpcFailure(-1, "User is not registered")
            return [
                {
                    "recipient": n,
                    "number": n,
                    "uuid": self.uuid if n == self.number else self.uuid_of(n),
                    "isRegistered": True,
                }
                for n in params.get("recipient") or ()
            ]
        if method == "listGroups":
            return []
        if method == "getAttachment":
            self.downloads.append(str(params.get("id")))
            data = self._files.get(str(params.get("id")))
            if data is None:
                raise _RpcFailure(-1, f"Could not find attachment with ID: {params.get('id')}")
            return {"data": base64.b64encode(data).decode()}
        if method == "send":
            return self._send(params)
        if method in ("sendTyping", "sendReaction", "sendReceipt"):
            chat = _chat_of(params)
            if method != "sendReceipt":
                self._refusal(chat)
            self.calls.append(Call(method, params))
            return {"timestamp": self.stamp(), "results": [self._result(chat, "SUCCESS")]}
        raise _RpcFailure(-32601, "Method not implemented")

    def _result(self, chat: str, kind: str, retry: float | None = None) -> JSON:
        result: JSON = {
            "recipientAddress": {"uuid": self.uuid_of(chat), "number": chat},
            "type": kind,
        }
        if retry is not None:
            result["retryAfterSeconds"] = int(retry)
        return result

    def _refusal(self, chat: str) -> None:
        waits = self.faults.rate_limited.get(chat)
        if waits:
            retry = waits.pop(0)
            data = {
                "response": {
                    "timestamp": self.stamp(),
                    "results": [self._result(chat, "RATE_LIMIT_FAILURE", retry)],
                }
            }
            raise _RpcFailure(-5, "Failed to send message due to rate limiting", data)
        if chat in self.faults.blocked:
            data = {
                "response": {
                    "timestamp": self.stamp(),
                    "results": [self._result(chat, "UNREGISTERED_FAILURE")],
                }
            }
            raise _RpcFailure(-1, "Failed to send message", data)

    def _send(self, params: JSON) -> JSON:
        chat = _chat_of(params)
        self._refusal(chat)
        stamp = self.stamp()
        quote = None
        if isinstance(params.get("quoteTimestamp"), int):
            quote = (str(params.get("quoteAuthor")), int(params["quoteTimestamp"]))
        found = params.get("attachments") or params.get("attachment") or ()
        files = tuple(_parse_data_uri(u) for u in ([found] if isinstance(found, str) else found))
        styles = params.get("textStyle") or ()
        self.sent.append(
            Sent(
                chat=chat,
                text=str(params.get("message") or ""),
                timestamp=stamp,
                styles=tuple([styles] if isinstance(styles, str) else styles),
                files=files,
                quote=quote,
                edit_of=params.get("editTimestamp"),
            )
        )
        return {"timestamp": stamp, "results": [self._result(chat, "SUCCESS")]}


@dataclass
class _Stream:
    """One open event stream: the messages not yet written to it."""

    queue: list[JSON]
    closed: bool = False
    account: str | None = None
    """The account named in `?account=` (None: every account's events)."""
    written: list[JSON] = field(default_factory=list)


class _RpcFailure(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        self.code = code
        self.message = message
        self.data = data


def _answer(
    ident: Any, *, result: Any = None, error: tuple[int, str] | None = None, data: Any = None
) -> web.Response:
    body: JSON = {"jsonrpc": "2.0", "id": ident}
    if error is not None:
        body["error"] = {"code": error[0], "message": error[1], "data": data}
    else:
        body["result"] = result
    return web.json_response(body)
