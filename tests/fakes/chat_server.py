"""A fake chat platform for the loopback adapter, served by uvicorn on 127.0.0.1.

The wire protocol is modelled on Telegram's Bot API `getUpdates`: an update stays on the
server until a later poll's `offset` passes it, so a client that crashes before it polls again
gets the update again. Bot routes live under `/bot<token>/` (wrong token: 401 everywhere):

- `GET  /bot<token>/me` → `{"ok": true, "bot": {...}}` (harmless: acknowledges nothing)
- `GET  /bot<token>/updates?offset=N&timeout=S` → `{"ok": true, "updates": [...]}`
- `POST /bot<token>/send | /edit | /typing`

In tests: `async with FakeChatServer("token") as chat:` then `chat.inject(...)`, switch faults
on (`chat.rate_limit(...)`, `chat.fail_sends(...)`, …) and inspect `chat.sent`, `chat.edits`,
`chat.typing`. Another process drives the same server through the `/control/*` routes (see
`ChatServerClient`). Standalone (crash tests, manual runs):
`python -m tests.fakes.chat_server --port 8100 --token T` serves until SIGTERM / SIGINT and keeps
its state in memory for its whole lifetime, whatever its clients do.
"""

from __future__ import annotations

import itertools
import json
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes import standalone
from tests.fakes.control import (
    ControlClient,
    ControlError,
    ControlHandler,
    checked_fields,
    control_fault_spec,
    control_mounts,
    control_specs,
    wait_answer,
)
from tests.fakes.params import EscapedJSONResponse, hang_up
from tests.fakes.serving import LocalServer, Served
from tests.fakes.standalone import until_signalled
from tests.fakes.waiting import Changes, Waitable

MAX_UPDATES = 100
"""Most updates one poll returns."""
MAX_POLL_TIMEOUT = 60.0
"""Longest long poll the server grants, in seconds."""
DEFAULT_MARKUP_MARKER = "<<bad-markup>>"
"""Markdown text containing this is refused once `reject_markup()` is on."""
TEXT_FORMATS = ("markdown", "plain")


@dataclass(frozen=True, slots=True)
class Update:
    """One update waiting on the server: `message` is what the poll returns, as is."""

    update_id: int
    message: Any

    @property
    def message_id(self) -> str | None:
        """The message's id, None for a malformed message."""
        if isinstance(self.message, Mapping):
            value = self.message.get("message_id")
            return value if isinstance(value, str) else None
        return None

    def to_json(self) -> dict[str, Any]:
        """The update as the `updates` route returns it."""
        return {"update_id": self.update_id, "message": self.message}


@dataclass(frozen=True, slots=True)
class Sent:
    """One accepted `send` request, with the id the server gave the new message."""

    chat_id: str
    thread_id: str | None
    text: str
    format: str
    reply_to: str | None
    idempotency_key: str | None
    recovered: bool
    message_id: str
    received_at: float
    """`time.monotonic()` when the server accepted it."""


@dataclass(frozen=True, slots=True)
class Edit:
    """One accepted `edit` request."""

    chat_id: str
    message_id: str
    text: str
    format: str
    received_at: float


@dataclass(frozen=True, slots=True)
class Rejected:
    """A send, edit or typing request the server refused (a fault or a bad request)."""

    route: str
    status: int
    error: str
    body: Any
    received_at: float


@dataclass(slots=True)
class _Faults:
    """The faults currently switched on; counters count down per affected request."""

    rate_limits: dict[str, tuple[int, float]] = field(default_factory=dict)
    fail_sends: int = 0
    fail_sends_status: int = 500
    markup_marker: str | None = None
    blocked_chats: set[str] = field(default_factory=set)
    fail_updates: int = 0
    fail_updates_status: int = 500
    drop_polls: int = 0


class _BadRequest(ControlError):
    """A request the server answers with 400 and `error` = the message (a control route's
    too)."""


def _error(
    status: int, error: str, *, headers: Mapping[str, str] | None = None, **extra: Any
) -> JSONResponse:
    return JSONResponse({"ok": False, "error": error, **extra}, status_code=status, headers=headers)


def _ok(**fields: Any) -> JSONResponse:
    return EscapedJSONResponse({"ok": True, **fields})


def _str(body: Mapping[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str):
        raise _BadRequest(f"bad request: {key} must be a string")
    return value


def _id(body: Mapping[str, Any], key: str) -> str:
    value = _str(body, key)
    if not value:
        raise _BadRequest(f"bad request: {key} must not be empty")
    return value


def _optional_str(body: Mapping[str, Any], key: str) -> str | None:
    return None if body.get(key) is None else _str(body, key)


def _int(value: Any, name: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise _BadRequest(f"bad request: {name} must be an integer")
    try:
        return int(value)
    except ValueError as err:
        raise _BadRequest(f"bad request: {name} must be an integer") from err


def _float(value: Any, name: str, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise _BadRequest(f"bad request: {name} must be a number")
    try:
        number = float(value)
    except ValueError as err:
        raise _BadRequest(f"bad request: {name} must be a number") from err
    if not math.isfinite(number) or number < 0:
        raise _BadRequest(f"bad request: {name} must be a finite number >= 0")
    return number


async def _json(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except ValueError as err:
        raise _BadRequest("bad request: the body is not JSON") from err


async def _json_object(request: Request) -> dict[str, Any]:
    body = await _json(request)
    if not isinstance(body, dict):
        raise _BadRequest("bad request: the body is not a JSON object")
    return body


class FakeChatServer(Served, Waitable):
    """A long-polling chat platform for one test (or one standalone process).

    Single event loop only: the server runs as a task of the loop that enters it, and the
    Python API (`inject`, faults, waits) must be called from that loop.
    """

    def __init__(
        self,
        token: str = "test-token",
        *,
        port: int = 0,
        bot_name: str = "Herald test bot",
        log_level: str | None = None,
    ) -> None:
        self.token = token
        self.bot_name = bot_name
        self.sent: list[Sent] = []
        """Every accepted send, duplicates by idempotency key included, in arrival order."""
        self.edits: list[Edit] = []
        """Every accepted edit, in arrival order."""
        self.typing: list[str] = []
        """The chat id of every accepted typing request, in arrival order."""
        self.rejected: list[Rejected] = []
        """Every send / edit / typing request answered with an error, in arrival order."""
        self.acknowledged: list[str] = []
        """Message ids of acknowledged (deleted) updates, in acknowledgement order."""
        self.acknowledged_updates: list[int] = []
        """Update ids of acknowledged updates, in acknowledgement order."""
        self.polls = 0
        """How many `updates` requests arrived (faulted ones included)."""
        self._port = port
        self._log_level = log_level
        self._pending: list[Update] = []
        self._messages: dict[str, Any] = {}
        self._texts: dict[str, str] = {}
        self._chats: dict[str, str] = {}
        self._update_ids = itertools.count(1)
        self._inbound_ids = itertools.count(1)
        self._outbound_ids = itertools.count(1)
        self._faults = _Faults()
        self._changes = Changes()
        self._local: LocalServer | None = None

    # -- where it listens -------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:<port>`: the loopback config's `url`."""
        return f"http://127.0.0.1:{self.port}"

    # -- inbound ------------------------------------------------------------------------------

    @property
    def pending(self) -> list[Update]:
        """The updates not yet acknowledged, oldest first."""
        return list(self._pending)

    def inject(
        self,
        chat_id: str,
        text: str,
        *,
        sender_id: str,
        sender_name: str = "",
        sender_is_bot: bool = False,
        chat_type: str = "private",
        thread_id: str | None = None,
        mentions_bot: bool = False,
        message_id: str | None = None,
        reply_to: str | None = None,
        date: float | None = None,
    ) -> str:
        """Queue a message from a user as a new update; return its message id.

        Ids default to `m1`, `m2`, …; `date` defaults to now (Unix seconds).
        """
        if message_id is None:
            message_id = next(f"m{n}" for n in self._inbound_ids if f"m{n}" not in self._messages)
        message = {
            "message_id": message_id,
            "chat": {"id": chat_id, "type": chat_type},
            "thread_id": thread_id,
            "from": {"id": sender_id, "name": sender_name, "is_bot": sender_is_bot},
            "text": text,
            "date": time.time() if date is None else date,
            "mentions_bot": mentions_bot,
            "reply_to": reply_to,
        }
        self._messages[message_id] = message
        self._enqueue(message)
        return message_id

    def inject_raw(self, message: Any) -> int:
        """Queue an update whose `message` is `message` exactly (junk included); its update id."""
        return self._enqueue(message)

    def duplicate(self, message_id: str) -> int:
        """Deliver an injected message again under a new update id (same message id).

        Returns the new update id; raises KeyError for a message never injected.
        """
        return self._enqueue(self._messages[message_id])

    async def wait_until_acknowledged(
        self,
        *message_ids: str,
        timeout: float = 10.0,
    ) -> None:
        """Wait until these messages (default: every pending update) are acknowledged.

        Raises TimeoutError after `timeout` seconds.
        """

        def done() -> bool:
            pending = {u.message_id for u in self._pending}
            if not message_ids:
                return not self._pending
            return all(m in self.acknowledged and m not in pending for m in message_ids)

        await self.wait_for(done, timeout)

    # -- outbound -----------------------------------------------------------------------------

    def text_of(self, message_id: str) -> str:
        """The current text of a message the bot sent (after its edits); KeyError if unknown."""
        return self._texts[message_id]

    def texts_in(self, chat_id: str) -> list[str]:
        """The current texts of the messages the bot sent to `chat_id`, in send order."""
        return [self._texts[s.message_id] for s in self.sent if s.chat_id == chat_id]

    async def wait_for_sent(
        self,
        expected: int | Callable[[Sent], bool],
        timeout: float = 10.0,
    ) -> list[Sent]:
        """Wait for sends: a count (return all sends) or a predicate (return the matches).

        Raises TimeoutError after `timeout` seconds.
        """
        return await self._changes.wait_for_items(self.sent, expected, timeout)

    # -- faults -------------------------------------------------------------------------------

    def rate_limit(self, chat_id: str, count: int = 1, retry_after: float = 1.0) -> None:
        """The next `count` sends to `chat_id` answer 429 with `retry_after` (seconds)."""
        self._faults.rate_limits[chat_id] = (count, retry_after)

    def fail_sends(self, count: int = 1, status: int = 500) -> None:
        """The next `count` sends (to any chat) answer `status` (a 5xx)."""
        self._faults.fail_sends, self._faults.fail_sends_status = count, status

    def reject_markup(self, marker: str | None = DEFAULT_MARKUP_MARKER) -> None:
        """Refuse markdown sends and edits whose text contains `marker` (None: stop refusing).

        They answer 400 "can't parse entities"; the same text as plain passes.
        """
        self._faults.markup_marker = marker

    def block_chat(self, chat_id: str, blocked: bool = True) -> None:
        """Sends, edits and typing in `chat_id` answer 403 "bot was blocked by the user"."""
        if blocked:
            self._faults.blocked_chats.add(chat_id)
        else:
            self._faults.blocked_chats.discard(chat_id)

    def fail_updates(self, count: int = 1, status: int = 500) -> None:
        """The next `count` polls answer `status` and acknowledge nothing."""
        self._faults.fail_updates, self._faults.fail_updates_status = count, status

    def drop_polls(self, count: int = 1) -> None:
        """The next `count` polls get their connection closed, no answer, nothing acknowledged."""
        self._faults.drop_polls = count

    def clear_faults(self) -> None:
        """Switch every fault off."""
        self._faults = _Faults()

    # -- state as JSON ------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Everything a test inspects, as JSON (what `GET /control/state` answers)."""
        return {
            "ok": True,
            "sent": [asdict(s) for s in self.sent],
            "edits": [asdict(e) for e in self.edits],
            "typing": list(self.typing),
            "rejected": [asdict(r) for r in self.rejected],
            "texts": dict(self._texts),
            "pending": len(self._pending),
            "pending_updates": [u.to_json() for u in self._pending],
            "acknowledged": list(self.acknowledged),
            "acknowledged_updates": list(self.acknowledged_updates),
            "polls": self.polls,
        }

    # -- lifecycle ----------------------------------------------------------------------------

    async def _start(self) -> None:
        self._local = LocalServer(self._app(), port=self._port, log_level=self._log_level)
        await self._local.start()

    async def _stop(self) -> None:
        self._changes.stop()  # ends long polls and control waits
        if self._local is not None:
            await self._local.stop()

    # -- internals ----------------------------------------------------------------------------

    def _enqueue(self, message: Any) -> int:
        update_id = next(self._update_ids)
        self._pending.append(Update(update_id, message))
        self._changes.notify()
        return update_id

    def _acknowledge(self, offset: int) -> None:
        """Delete every update below `offset` (Telegram's confirmation by a later offset)."""
        done = [u for u in self._pending if u.update_id < offset]
        if not done:
            return
        self._pending = [u for u in self._pending if u.update_id >= offset]
        for update in done:
            self.acknowledged_updates.append(update.update_id)
            if update.message_id is not None:
                self.acknowledged.append(update.message_id)
        self._changes.notify()

    def _authorized(self, request: Request) -> bool:
        given = str(request.path_params.get("token", ""))
        return secrets.compare_digest(given.encode(), self.token.encode())

    def _app(self) -> Starlette:
        bot = [
            ("me", self._me, "GET"),
            ("updates", self._updates, "GET"),
            ("send", self._send, "POST"),
            ("edit", self._edit, "POST"),
            ("typing", self._typing, "POST"),
        ]
        control: dict[str, tuple[ControlHandler[FakeChatServer], str]] = {
            "inject": (FakeChatServer._control_inject, "POST"),
            "fault": (FakeChatServer._control_fault, "POST"),
            "wait": (FakeChatServer._control_wait, "POST"),
        }
        routes = [Route(f"/bot{{token}}/{name}", self._guard(h), methods=[m]) for name, h, m in bot]
        routes += control_mounts(self, control)
        return Starlette(
            routes=routes,
            exception_handlers={HTTPException: self._http_error},
        )

    def _guard(
        self, handler: Callable[[Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        """The endpoint: token check on bot routes, 400 for `_BadRequest`."""

        async def endpoint(request: Request) -> Response:
            if "token" in request.path_params and not self._authorized(request):
                return _error(401, "unauthorized")
            try:
                return await handler(request)
            except _BadRequest as err:
                return _error(400, str(err))

        return endpoint

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        return _error(status, "not found" if status == 404 else str(exc))

    async def _me(self, request: Request) -> Response:
        return _ok(bot={"id": "bot", "name": self.bot_name, "is_bot": True})

    async def _updates(self, request: Request) -> Response:
        self.polls += 1
        self._changes.notify()
        faults = self._faults
        if faults.fail_updates > 0:
            faults.fail_updates -= 1
            return _error(faults.fail_updates_status, "internal server error")
        if faults.drop_polls > 0:
            faults.drop_polls -= 1
            return await hang_up(request)
        offset = _int(request.query_params.get("offset"), "offset", 0)
        timeout = min(_float(request.query_params.get("timeout"), "timeout", 0.0), MAX_POLL_TIMEOUT)
        self._acknowledge(offset)
        await self._long_wait(request, timeout, lambda: bool(self._pending))
        return _ok(updates=[u.to_json() for u in self._pending[:MAX_UPDATES]])

    async def _long_wait(self, request: Request, seconds: float, ready: Callable[[], bool]) -> None:
        """Wait until `ready()`, `seconds` pass, the client leaves or the server stops."""
        if seconds <= 0 or ready():
            return
        await self._changes.hold(request, seconds, ready)

    def _refuse(
        self,
        route: str,
        body: Any,
        status: int,
        error: str,
        *,
        headers: Mapping[str, str] | None = None,
        **extra: Any,
    ) -> Response:
        self.rejected.append(Rejected(route, status, error, body, time.monotonic()))
        self._changes.notify()
        return _error(status, error, headers=headers, **extra)

    def _markup_refused(self, text: str, text_format: str) -> bool:
        marker = self._faults.markup_marker
        return text_format == "markdown" and marker is not None and marker in text

    async def _send(self, request: Request) -> Response:
        body = await _json_object(request)
        chat_id = _id(body, "chat_id")
        text = _str(body, "text")
        text_format = body.get("format", "markdown")
        thread_id = _optional_str(body, "thread_id")
        reply_to = _optional_str(body, "reply_to")
        idempotency_key = _optional_str(body, "idempotency_key")
        recovered = body.get("recovered", False)
        if text_format not in TEXT_FORMATS:
            raise _BadRequest("bad request: format must be markdown or plain")
        if not isinstance(recovered, bool):
            raise _BadRequest("bad request: recovered must be a boolean")
        if not text.strip():
            return self._refuse("send", body, 400, "bad request: message text is empty")
        faults = self._faults
        if chat_id in faults.blocked_chats:
            return self._refuse("send", body, 403, "bot was blocked by the user")
        left, retry_after = faults.rate_limits.get(chat_id, (0, 0.0))
        if left > 0:
            faults.rate_limits[chat_id] = (left - 1, retry_after)
            return self._refuse(
                "send",
                body,
                429,
                f"too many requests: retry after {retry_after:g}",
                headers={"Retry-After": f"{retry_after:g}"},
                retry_after=retry_after,
            )
        if faults.fail_sends > 0:
            faults.fail_sends -= 1
            return self._refuse("send", body, faults.fail_sends_status, "internal server error")
        if self._markup_refused(text, text_format):
            return self._refuse("send", body, 400, "bad request: can't parse entities")
        message_id = f"s{next(self._outbound_ids)}"
        self._texts[message_id] = text
        self._chats[message_id] = chat_id
        self.sent.append(
            Sent(
                chat_id=chat_id,
                thread_id=thread_id,
                text=text,
                format=text_format,
                reply_to=reply_to,
                idempotency_key=idempotency_key,
                recovered=recovered,
                message_id=message_id,
                received_at=time.monotonic(),
            )
        )
        self._changes.notify()
        return _ok(message_id=message_id)

    async def _edit(self, request: Request) -> Response:
        body = await _json_object(request)
        chat_id = _id(body, "chat_id")
        message_id = _id(body, "message_id")
        text = _str(body, "text")
        text_format = body.get("format", "markdown")
        if text_format not in TEXT_FORMATS:
            raise _BadRequest("bad request: format must be markdown or plain")
        if not text.strip():
            return self._refuse("edit", body, 400, "bad request: message text is empty")
        if chat_id in self._faults.blocked_chats:
            return self._refuse("edit", body, 403, "bot was blocked by the user")
        if self._chats.get(message_id) != chat_id:
            return self._refuse("edit", body, 400, "message not found")
        if self._markup_refused(text, text_format):
            return self._refuse("edit", body, 400, "bad request: can't parse entities")
        self._texts[message_id] = text
        self.edits.append(Edit(chat_id, message_id, text, text_format, time.monotonic()))
        self._changes.notify()
        return _ok(message_id=message_id)

    async def _typing(self, request: Request) -> Response:
        body = await _json_object(request)
        chat_id = _id(body, "chat_id")
        _optional_str(body, "thread_id")
        if chat_id in self._faults.blocked_chats:
            return self._refuse("typing", body, 403, "bot was blocked by the user")
        self.typing.append(chat_id)
        self._changes.notify()
        return _ok()

    # -- control routes -----------------------------------------------------------------------

    async def _control_inject(self, request: Request) -> Response:
        specs = await control_specs(request, "a message spec")
        calls = [_inject_arguments(spec) for spec in specs]  # all valid, or none injected
        return _ok(message_ids=[self.inject(*args, **kwargs) for args, kwargs in calls])

    async def _control_fault(self, request: Request) -> Response:
        spec = await control_fault_spec(request)
        kind = spec.kind
        if kind == "rate_limit":
            self.rate_limit(
                spec.text("chat_id"), spec.integer("count", 1), spec.number("retry_after", 1.0)
            )
        elif kind == "fail_sends":
            self.fail_sends(spec.integer("count", 1), spec.integer("status", 500))
        elif kind == "reject_markup":
            marker = spec.body.get("marker", DEFAULT_MARKUP_MARKER)
            self.reject_markup(None if marker is None else spec.text("marker", marker))
        elif kind == "block_chat":
            self.block_chat(spec.text("chat_id"), spec.flag("blocked", True))
        elif kind == "fail_updates":
            self.fail_updates(spec.integer("count", 1), spec.integer("status", 500))
        elif kind == "drop_polls":
            self.drop_polls(spec.integer("count", 1))
        elif kind == "duplicate":
            message_id = spec.body.get("message_id")
            if not isinstance(message_id, str) or message_id not in self._messages:
                raise ControlError("duplicate needs the message_id of an injection")
            return _ok(update_id=self.duplicate(message_id))
        elif kind == "clear":
            self.clear_faults()
        else:
            raise ControlError(f"unknown fault {kind!r}")
        return _ok()

    async def _control_wait(self, request: Request) -> Response:
        spec = await _json_object(request)
        timeout = min(_float(spec.get("timeout"), "timeout", 10.0), MAX_POLL_TIMEOUT)
        min_sent = _int(spec.get("min_sent"), "min_sent", 0)
        min_edits = _int(spec.get("min_edits"), "min_edits", 0)
        min_typing = _int(spec.get("min_typing"), "min_typing", 0)
        min_polls = _int(spec.get("min_polls"), "min_polls", 0)
        max_pending = spec.get("max_pending")
        if max_pending is not None:
            max_pending = _int(max_pending, "max_pending", 0)
        acknowledged = spec.get("acknowledged", [])
        if not isinstance(acknowledged, list) or not all(isinstance(m, str) for m in acknowledged):
            raise _BadRequest("bad request: acknowledged must be a list of message ids")

        def met() -> bool:
            pending = {u.message_id for u in self._pending}
            return (
                len(self.sent) >= min_sent
                and len(self.edits) >= min_edits
                and len(self.typing) >= min_typing
                and self.polls >= min_polls
                and (max_pending is None or len(self._pending) <= max_pending)
                and all(m in self.acknowledged and m not in pending for m in acknowledged)
            )

        return await wait_answer(self._changes, met, timeout, self.state)


_INJECT_FIELDS: dict[str, tuple[type, ...]] = {
    "chat_id": (str,),
    "text": (str,),
    "sender_id": (str,),
    "sender_name": (str,),
    "sender_is_bot": (bool,),
    "chat_type": (str,),
    "thread_id": (str,),
    "mentions_bot": (bool,),
    "message_id": (str,),
    "reply_to": (str,),
    "date": (int, float),
}
"""The fields of a control-route message spec and their JSON types."""


def _inject_arguments(spec: Any) -> tuple[tuple[str, str], dict[str, Any]]:
    """The `inject()` arguments a control-route message spec stands for (400 when invalid)."""
    args = checked_fields(
        spec, _INJECT_FIELDS, what="message", required=("chat_id", "text", "sender_id")
    )
    chat_id, text = args.pop("chat_id"), args.pop("text")
    if "date" in args:
        args["date"] = float(args["date"])
    return (chat_id, text), args


class ChatServerClient(ControlClient):
    """Drives a `FakeChatServer` in another process through its `/control/*` routes.

    `async with ChatServerClient("http://127.0.0.1:8100") as chat:`; every method raises
    `httpx.HTTPStatusError` when the server refuses the request.
    """

    def __init__(self, base_url: str, *, timeout: float = 10.0) -> None:
        super().__init__(base_url, timeout=timeout, max_wait=MAX_POLL_TIMEOUT)
        self.base_url = self.url

    async def inject(self, chat_id: str, text: str, *, sender_id: str, **fields: Any) -> str:
        """Like `FakeChatServer.inject`; returns the message id."""
        spec = {"chat_id": chat_id, "text": text, "sender_id": sender_id, **fields}
        return (await self.inject_many([spec]))[0]

    async def inject_many(self, specs: Iterable[Mapping[str, Any]]) -> list[str]:
        """Inject several messages in order (all or none); their message ids."""
        body = await self._call("POST", "/control/inject", [dict(s) for s in specs])
        return [str(m) for m in body["message_ids"]]

    async def fault(self, fault: str, **params: Any) -> dict[str, Any]:
        """Switch a fault on: `fault("rate_limit", chat_id="c1", count=2, retry_after=0.5)`."""
        return await self._call("POST", "/control/fault", {"fault": fault, **params})

    async def wait(
        self,
        timeout: float = 10.0,
        *,
        min_sent: int = 0,
        min_edits: int = 0,
        min_typing: int = 0,
        min_polls: int = 0,
        max_pending: int | None = None,
        acknowledged: Sequence[str] = (),
    ) -> dict[str, Any]:
        """Wait until every condition holds; return the state. TimeoutError after `timeout`."""
        spec = {
            "timeout": timeout,
            "min_sent": min_sent,
            "min_edits": min_edits,
            "min_typing": min_typing,
            "min_polls": min_polls,
            "max_pending": max_pending,
            "acknowledged": list(acknowledged),
        }
        return await self._wait(spec, lambda error: f"chat server: {error} waiting for {spec}")


async def _main(port: int, token: str) -> None:
    async with FakeChatServer(token, port=port, log_level="warning") as server:
        print(f"chat server serving {server.base_url}", flush=True)
        await until_signalled()


def main(argv: list[str] | None = None) -> None:
    """Serve on `--port` (0: any free port, printed) until SIGINT or SIGTERM."""
    parser = standalone.parser("tests.fakes.chat_server", __doc__)
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--token", default="test-token")
    args = parser.parse_args(argv)
    standalone.run(_main(args.port, args.token))


if __name__ == "__main__":
    main()
