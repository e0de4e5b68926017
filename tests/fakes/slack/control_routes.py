"""The `/control/*` routes of `FakeSlackServer` (driving it from another process), each taking the
server; `ROUTES` is what the server mounts (`tests.fakes.control.control_mounts`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tests.fakes.control import (
    ControlError,
    checked_fields,
    control_fault_spec,
    control_file_spec,
    control_json,
    control_object,
    control_specs,
    integer_limits,
    wait_answer,
    wait_timeout,
)
from tests.fakes.params import jsonable
from tests.fakes.slack.records import JSON, MAX_WAIT

if TYPE_CHECKING:
    from tests.fakes.slack.server import FakeSlackServer


async def control_inject(server: FakeSlackServer, request: Request) -> Response:
    specs = await control_specs(request, "an injection spec")
    calls = [_inject_call(spec) for spec in specs]  # all valid, or none injected
    injected: list[JSON] = []
    for kind, args in calls:
        try:
            made = getattr(server, _INJECT_KINDS[kind][0])(**args)
        except (KeyError, ValueError, TypeError) as err:
            raise ControlError(f"cannot inject {kind} {args}: {err!r}") from err
        injected.append(jsonable(made))
    return JSONResponse({"ok": True, "injected": injected})


async def control_file(server: FakeSlackServer, request: Request) -> Response:
    content, options = await control_file_spec(request, ("name", "mimetype", "title", "user"))
    return JSONResponse({"ok": True, "file": server.add_file(content, **options)})


async def control_mode(server: FakeSlackServer, request: Request) -> Response:
    spec = await control_json(request)
    if not isinstance(spec, dict) or not isinstance(spec.get("events_url"), str | None):
        raise ControlError('expected {"events_url": url or null}')
    server.use_events_api(spec.get("events_url"))
    return JSONResponse({"ok": True})


async def control_fault(server: FakeSlackServer, request: Request) -> Response:
    spec = await control_fault_spec(request)
    kind = spec.kind
    done: int | None = None
    if kind == "rate_limit":
        server.rate_limit(
            spec.text("target"), spec.integer("count", 1), spec.integer("retry_after", 1)
        )
    elif kind == "fail":
        server.fail(spec.text("method"), spec.integer("count", 1), spec.integer("status", 500))
    elif kind == "drop":
        server.drop(spec.text("method"), spec.integer("count", 1))
    elif kind == "drop_socket":
        done = server.drop_socket(spec.optional_integer("socket_id"))
    elif kind == "send_disconnect":
        close_after = spec.body.get("close_after")
        if close_after is not None and not isinstance(close_after, int | float):
            raise ControlError("close_after must be a number")
        done = server.send_disconnect(
            spec.text("reason", "refresh_requested"),
            spec.optional_integer("socket_id"),
            close_after=None if close_after is None else float(close_after),
        )
    elif kind == "silence_socket":
        done = server.silence_socket(spec.optional_integer("socket_id"))
    elif kind == "ignore_acks":
        server.ignore_acks(spec.integer("count", 1))
    elif kind == "refuse_connections":
        stage = spec.text("stage", "handshake")
        if stage not in ("open", "handshake"):
            raise ControlError("stage must be open or handshake")
        server.refuse_connections(
            spec.integer("count", 1), stage="open" if stage == "open" else "handshake"
        )
    elif kind == "clear":
        server.clear_faults()
    else:
        raise ControlError(f"unknown fault {kind!r}")
    return JSONResponse({"ok": True, "affected": done})


async def control_wait(server: FakeSlackServer, request: Request) -> Response:
    spec = await control_object(request)
    names = (
        "min_posted",
        "min_updates",
        "min_reactions",
        "min_uploads",
        "min_sockets_opened",
        "max_pending",
    )
    limits = integer_limits(spec, names)
    acked = spec.get("acked", [])
    if not isinstance(acked, list) or not all(isinstance(e, str) for e in acked):
        raise ControlError("acked must be a list of event ids")
    connected = spec.get("connected")
    if connected is not None and not isinstance(connected, bool):
        raise ControlError("connected must be a boolean")
    timeout = wait_timeout(spec)

    def met() -> bool:
        pending = len(server.pending)
        return (
            len(server.posted) >= limits.get("min_posted", 0)
            and len(server.updates) >= limits.get("min_updates", 0)
            and len(server.reactions) >= limits.get("min_reactions", 0)
            and len(server.uploads) >= limits.get("min_uploads", 0)
            and server.sockets_opened >= limits.get("min_sockets_opened", 0)
            and pending <= limits.get("max_pending", pending)
            and all(e in server.acked for e in acked)
            and (connected is None or server.connected == connected)
        )

    return await wait_answer(server._changes, met, min(timeout, MAX_WAIT), server.state)


_INJECT_KINDS: dict[str, tuple[str, dict[str, tuple[type, ...]]]] = {
    "message": (
        "inject_message",
        {
            "channel": (str,),
            "text": (str,),
            "user": (str,),
            "thread_ts": (str,),
            "files": (list,),
            "ts": (str,),
            "channel_type": (str,),
            "event_id": (str,),
        },
    ),
    "app_mention": (
        "inject_app_mention",
        {
            "channel": (str,),
            "text": (str,),
            "user": (str,),
            "thread_ts": (str,),
            "files": (list,),
            "ts": (str,),
            "with_message": (bool,),
        },
    ),
    "edit": ("inject_edit", {"channel": (str,), "ts": (str,), "text": (str,)}),
    "delete": ("inject_delete", {"channel": (str,), "ts": (str,)}),
    "bot_message": (
        "inject_bot_message",
        {
            "channel": (str,),
            "text": (str,),
            "bot_id": (str,),
            "username": (str,),
            "thread_ts": (str,),
        },
    ),
    "own_message": (
        "inject_own_message",
        {"channel": (str,), "text": (str,), "thread_ts": (str,)},
    ),
    "event": ("inject_event", {"event": (dict,), "event_id": (str,)}),
}
"""Injection kinds of `/control/inject`: the method, and its fields with their JSON types."""


def _inject_call(spec: Any) -> tuple[str, JSON]:
    """The injection kind and the method's keyword arguments a control spec stands for."""
    if not isinstance(spec, dict):
        raise ControlError("an injection spec must be a JSON object")
    kind = spec.get("kind", "message")
    if kind not in _INJECT_KINDS:
        raise ControlError(f"unknown kind {kind!r}; one of {sorted(_INJECT_KINDS)}")
    fields = _INJECT_KINDS[kind][1]
    required = ("event",) if kind == "event" else ("channel",)
    rest = {k: v for k, v in spec.items() if k != "kind"}
    return kind, checked_fields(rest, fields, what=kind, required=required)


ROUTES = {
    "inject": (control_inject, "POST"),
    "file": (control_file, "POST"),
    "fault": (control_fault, "POST"),
    "mode": (control_mode, "POST"),
    "wait": (control_wait, "POST"),
}
"""The control routes besides `state`, with their HTTP methods."""
