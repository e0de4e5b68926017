"""The `/control/*` routes of `FakeTelegramServer` (driving it from another process), each taking
the server; `ROUTES` is what the server mounts (`tests.fakes.control.control_mounts`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tests.fakes.control import (
    ControlError,
    checked_fields,
    control_fault_spec,
    control_file_spec,
    control_object,
    control_specs,
    integer_limits,
    wait_answer,
    wait_timeout,
)
from tests.fakes.params import jsonable
from tests.fakes.telegram.records import JSON, MAX_POLL_TIMEOUT

if TYPE_CHECKING:
    from tests.fakes.telegram.server import FakeTelegramServer


async def control_inject(server: FakeTelegramServer, request: Request) -> Response:
    specs = await control_specs(request, "a message spec")
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
    content, options = await control_file_spec(request, ("file_path", "file_name", "mime_type"))
    return JSONResponse({"ok": True, "file_id": server.add_file(content, **options)})


async def control_fault(server: FakeTelegramServer, request: Request) -> Response:
    spec = await control_fault_spec(request)
    kind = spec.kind
    if kind == "rate_limit":
        server.rate_limit(
            spec.integer("chat_id"), spec.integer("count", 1), spec.number("retry_after", 1.0)
        )
    elif kind == "fail":
        server.fail(spec.text("method"), spec.integer("count", 1), spec.integer("status", 500))
    elif kind == "drop":
        server.drop(spec.text("method"), spec.integer("count", 1))
    elif kind == "reject_markup":
        server.reject_markup(spec.integer("count", 1))
    elif kind == "migrate_chat":
        server.migrate_chat(spec.integer("old_chat_id"), spec.integer("new_chat_id"))
    elif kind == "block_chat":
        server.block_chat(spec.integer("chat_id"), bool(spec.body.get("blocked", True)))
    elif kind == "delete_topic":
        server.delete_topic(spec.integer("chat_id"), spec.integer("thread_id"))
    elif kind == "stall_polls":
        server.stall_polls(spec.integer("count", 1))
    elif kind == "duplicate":
        update_id = spec.integer("update_id")
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
    if isinstance(spec, dict) and "update" in spec:
        if set(spec) != {"update"} or not isinstance(spec["update"], dict):
            raise ControlError('a raw update spec is {"update": {...}} alone')
        return {"update": spec["update"]}
    required = ("chat_id", "sender_id")
    if isinstance(spec, dict) and any(spec.get(name, 0) is None for name in required):
        raise ControlError(f"{' and '.join(required)} must not be null")
    return checked_fields(spec, _INJECT_FIELDS, what="message", required=required)


ROUTES = {
    "inject": (control_inject, "POST"),
    "file": (control_file, "POST"),
    "fault": (control_fault, "POST"),
    "wait": (control_wait, "POST"),
}
"""The control routes besides `state`, with their HTTP methods."""
