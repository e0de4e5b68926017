"""The `/control/*` routes of `FakeTelegramServer` (driving it from another process), each taking
the server."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tests.fakes.control import (
    ControlError,
    control_json,
    control_object,
    integer_limits,
    wait_answer,
    wait_timeout,
)
from tests.fakes.params import jsonable
from tests.fakes.telegram.records import (
    JSON,
    MAX_POLL_TIMEOUT,
)

if TYPE_CHECKING:
    from tests.fakes.telegram.server import FakeTelegramServer


# -- control routes ---------------------------------------------------------------------------


async def control_inject(server: FakeTelegramServer, request: Request) -> Response:
    body = await control_json(request)
    specs = [body] if isinstance(body, dict) else body
    if not isinstance(specs, list) or not specs:
        raise ControlError("expected a message spec or a non-empty list of them")
    calls = [_inject_arguments(spec) for spec in specs]  # all valid, or none injected
    injected: list[JSON] = []
    for args in calls:
        try:
            if "update" in args:
                injected.append({"update_id": server.inject_update(args["update"])})
            else:
                chat_id, text = args.pop("chat_id"), args.pop("text", "")
                made = server.inject_message(chat_id, text, **args)
                injected.append(jsonable(made))
        except (KeyError, ValueError) as err:
            raise ControlError(f"cannot inject {args}: {err!r}") from err
    return JSONResponse({"ok": True, "injected": injected})


async def control_file(server: FakeTelegramServer, request: Request) -> Response:
    spec = await control_json(request)
    if not isinstance(spec, dict) or not isinstance(spec.get("content_b64"), str):
        raise ControlError("expected {content_b64, file_path?, file_name?, mime_type?}")
    try:
        content = base64.b64decode(spec["content_b64"], validate=True)
    except ValueError as err:
        raise ControlError("content_b64 is not base64") from err
    names = ("file_path", "file_name", "mime_type")
    options = {k: spec.get(k) for k in names if isinstance(spec.get(k), str)}
    return JSONResponse({"ok": True, "file_id": server.add_file(content, **options)})


async def control_state(server: FakeTelegramServer, request: Request) -> Response:
    return JSONResponse(server.state())


async def control_fault(server: FakeTelegramServer, request: Request) -> Response:
    spec = await control_object(request)
    kind = spec.get("fault")

    def integer(name: str, default: int | None = None) -> int:
        value = spec.get(name, default)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ControlError(f"{kind} needs an integer {name}")
        return value

    def number(name: str, default: float) -> float:
        value = spec.get(name, default)
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            raise ControlError(f"{kind} needs a number {name} > 0")
        return float(value)

    def method() -> str:
        value = spec.get("method")
        if not isinstance(value, str) or not value:
            raise ControlError(f"{kind} needs a method")
        return value

    if kind == "rate_limit":
        server.rate_limit(integer("chat_id"), integer("count", 1), number("retry_after", 1.0))
    elif kind == "fail":
        server.fail(method(), integer("count", 1), integer("status", 500))
    elif kind == "drop":
        server.drop(method(), integer("count", 1))
    elif kind == "reject_markup":
        server.reject_markup(integer("count", 1))
    elif kind == "migrate_chat":
        server.migrate_chat(integer("old_chat_id"), integer("new_chat_id"))
    elif kind == "block_chat":
        server.block_chat(integer("chat_id"), bool(spec.get("blocked", True)))
    elif kind == "delete_topic":
        server.delete_topic(integer("chat_id"), integer("thread_id"))
    elif kind == "stall_polls":
        server.stall_polls(integer("count", 1))
    elif kind == "duplicate":
        update_id = integer("update_id")
        if update_id not in server._updates:
            raise ControlError(f"no update {update_id}")
        server.duplicate(update_id)
    elif kind == "clear":
        server.clear_faults()
    else:
        raise ControlError(f"unknown fault {kind!r}")
    return JSONResponse({"ok": True})


async def control_wait(server: FakeTelegramServer, request: Request) -> Response:
    spec = await control_object(request)
    limits = integer_limits(
        spec, ("min_sent", "min_edits", "min_actions", "min_polls", "max_pending")
    )
    confirmed = spec.get("confirmed", [])
    if not isinstance(confirmed, list) or not all(isinstance(u, int) for u in confirmed):
        raise ControlError("confirmed must be a list of update ids")
    timeout = wait_timeout(spec)

    def met() -> bool:
        pending = {queued.update.update_id for queued in server._queue}
        return (
            len(server.sent) >= limits.get("min_sent", 0)
            and len(server.edits) >= limits.get("min_edits", 0)
            and len(server.actions) >= limits.get("min_actions", 0)
            and server.polls >= limits.get("min_polls", 0)
            and len(server._queue) <= limits.get("max_pending", len(server._queue))
            and all(u in server.confirmed and u not in pending for u in confirmed)
        )

    return await wait_answer(server._changes, met, min(timeout, MAX_POLL_TIMEOUT), server.state)


_INJECT_FIELDS: dict[str, tuple[type, ...]] = {
    "chat_id": (int,),
    "text": (str,),
    "sender_id": (int,),
    "sender_name": (str,),
    "sender_username": (str,),
    "sender_is_bot": (bool,),
    "chat_type": (str,),
    "chat_title": (str,),
    "is_forum": (bool,),
    "thread_id": (int,),
    "reply_to": (int,),
    "entities": (list,),
    "photo": (str,),
    "document": (str,),
    "date": (int, float),
    "message_id": (int,),
    "edit_of": (int,),
}
"""The fields of a control-route message spec and their JSON types."""


def _inject_arguments(spec: Any) -> JSON:
    """The `inject_message()` keyword arguments (or `{"update": raw}`) a spec stands for."""
    if not isinstance(spec, dict):
        raise ControlError("a message spec must be a JSON object")
    if "update" in spec:
        if set(spec) != {"update"} or not isinstance(spec["update"], dict):
            raise ControlError('a raw update spec is {"update": {...}} alone')
        return {"update": spec["update"]}
    unknown = set(spec) - set(_INJECT_FIELDS)
    if unknown:
        raise ControlError(f"unknown message fields {sorted(unknown)}")
    for name in ("chat_id", "sender_id"):
        if name not in spec:
            raise ControlError(f"{name} is required")
    for name, value in spec.items():
        kinds = _INJECT_FIELDS[name]
        if value is None and name not in ("chat_id", "sender_id"):
            continue
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise ControlError(f"{name} must be {' or '.join(k.__name__ for k in kinds)}")
    return {k: v for k, v in spec.items() if v is not None}
