"""The `/control/*` routes of the fakes that run in another process, and their clients."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import itertools
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol, Self, TypeVar

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes.waiting import Changes

JSON = dict[str, Any]
Endpoint = Callable[[Request], Awaitable[Response]]


class ControlError(Exception):
    """A bad `/control/*` request (400 with `error` = the message)."""


def control_endpoint(handler: Endpoint) -> Endpoint:
    """`handler` answering 400 `{"ok": false, "error": ...}` for a `ControlError`."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except ControlError as err:
            return JSONResponse({"ok": False, "error": str(err)}, status_code=400)

    return endpoint


async def control_json(request: Request) -> Any:
    """The request's JSON body; ControlError when it is not JSON."""
    try:
        return json.loads(await request.body())
    except ValueError as err:
        raise ControlError("the body is not JSON") from err


async def control_object(request: Request) -> JSON:
    """The request's JSON body, an object; ControlError otherwise."""
    spec = await control_json(request)
    if not isinstance(spec, dict):
        raise ControlError("expected a JSON object")
    return spec


async def control_specs(request: Request, what: str) -> list[Any]:
    """The body's spec, or its non-empty list of specs (each still to be checked)."""
    body = await control_json(request)
    specs = [body] if isinstance(body, dict) else body
    if not isinstance(specs, list) or not specs:
        raise ControlError(f"expected {what} or a non-empty list of them")
    return specs


def checked_fields(
    spec: Any,
    fields: Mapping[str, tuple[type, ...]],
    *,
    what: str,
    required: Iterable[str] = (),
) -> JSON:
    """`spec` as keyword arguments: an object whose fields are all in `fields`, each of one
    of its JSON types (a boolean only where `bool` is named), the `required` ones present.
    Null fields are left out. ControlError names the first that is not so."""
    if not isinstance(spec, dict):
        raise ControlError(f"{what} must be a JSON object")
    args = {k: v for k, v in spec.items() if v is not None}
    unknown = set(args) - set(fields)
    if unknown:
        raise ControlError(f"unknown {what} fields {sorted(unknown)}")
    for name, value in args.items():
        kinds = fields[name]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise ControlError(f"{name} must be {' or '.join(k.__name__ for k in kinds)}")
    missing = [name for name in required if name not in args]
    if missing:
        raise ControlError(f"{what} needs {sorted(missing)}")
    return args


class Spec:
    """A control request's JSON object read field by field: each reader raises ControlError
    naming what the request (`kind`, e.g. a fault's name) needs."""

    def __init__(self, body: JSON, kind: object) -> None:
        self.body = body
        self.kind = kind

    def integer(self, name: str, default: int | None = None) -> int:
        value = self.body.get(name, default)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ControlError(f"{self.kind} needs an integer {name}")
        return value

    def optional_integer(self, name: str) -> int | None:
        return None if self.body.get(name) is None else self.integer(name)

    def number(self, name: str, default: float) -> float:
        """A number > 0."""
        value = self.body.get(name, default)
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            raise ControlError(f"{self.kind} needs a number {name} > 0")
        return float(value)

    def text(self, name: str, default: str | None = None) -> str:
        """A non-empty string."""
        value = self.body.get(name, default)
        if not isinstance(value, str) or not value:
            raise ControlError(f"{self.kind} needs a string {name}")
        return value

    def flag(self, name: str, default: bool) -> bool:
        value = self.body.get(name, default)
        if not isinstance(value, bool):
            raise ControlError(f"{self.kind} needs a boolean {name}")
        return value


async def control_fault_spec(request: Request) -> Spec:
    """A `/control/fault` body: an object whose `fault` names the fault."""
    body = await control_object(request)
    return Spec(body, body.get("fault"))


async def control_file_spec(
    request: Request, options: Iterable[str]
) -> tuple[bytes, dict[str, str]]:
    """A `/control/file` body: `content_b64` decoded, and the string `options` it gives."""
    spec = await control_json(request)
    names = tuple(options)
    if not isinstance(spec, dict) or not isinstance(spec.get("content_b64"), str):
        raise ControlError(f"expected {{content_b64, {'?, '.join(names)}?}}")
    try:
        content = base64.b64decode(spec["content_b64"], validate=True)
    except ValueError as err:
        raise ControlError("content_b64 is not base64") from err
    return content, {k: spec[k] for k in names if isinstance(spec.get(k), str)}


class Controlled(Protocol):
    """A fake that reports its state as JSON (what `GET /control/state` answers)."""

    def state(self) -> JSON: ...


F = TypeVar("F", bound=Controlled)
ControlHandler = Callable[[F, Request], Awaitable[Response]]


async def _state(server: Controlled, request: Request) -> Response:
    return JSONResponse(server.state())


def control_mounts(server: F, handlers: Mapping[str, tuple[ControlHandler[F], str]]) -> list[Route]:
    """`/control/<name>` for each of `handlers` (name → handler taking the server, and its
    HTTP method), plus `GET /control/state`; a ControlError is a 400."""
    every: dict[str, tuple[Callable[[Any, Request], Awaitable[Response]], str]] = {
        "state": (_state, "GET"),
        **handlers,
    }
    return [
        Route(
            f"/control/{name}",
            control_endpoint(functools.partial(handler, server)),
            methods=[method],
        )
        for name, (handler, method) in every.items()
    ]


def integer_limits(spec: JSON, names: Iterable[str]) -> dict[str, int]:
    """The integers `spec` gives for `names` (left out or null: absent)."""
    limits: dict[str, int] = {}
    for name in names:
        value = spec.get(name)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool):
                raise ControlError(f"{name} must be an integer")
            limits[name] = value
    return limits


def wait_timeout(spec: JSON) -> float:
    """The `timeout` of a wait spec (default 10 s)."""
    timeout = spec.get("timeout", 10.0)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout < 0:
        raise ControlError("timeout must be a number >= 0")
    return float(timeout)


async def wait_answer(
    changes: Changes, met: Callable[[], bool], timeout: float, state: Callable[[], JSON]
) -> Response:
    """Wait until `met()` (at most `timeout` seconds, or until the fake stops), then answer
    the state: 200, or 504 with `error` when the wait ended unmet."""
    with contextlib.suppress(TimeoutError):
        await changes.wait_for(lambda: met() or changes.stopping.is_set(), timeout)
    if met():
        return JSONResponse(state())
    error = "server stopping" if changes.stopping.is_set() else "timeout"
    return JSONResponse({**state(), "ok": False, "error": error}, status_code=504)


class ControlClient:
    """Drives a fake in another process through its `/control/*` routes at `url`.

    A request may take `timeout` seconds plus `max_wait` (the longest wait the fake grants).
    """

    def __init__(self, url: str, *, timeout: float, max_wait: float) -> None:
        self.url = url.rstrip("/")
        self._client = httpx.AsyncClient(
            base_url=self.url, timeout=timeout + max_wait, trust_env=False
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.aclose()

    async def state(self) -> JSON:
        """What the fake's `state()` returns."""
        return await self._call("GET", "/control/state")

    async def wait_up(self, timeout: float = 10.0) -> None:
        """Wait until the server answers; TimeoutError after `timeout` seconds."""
        async with asyncio.timeout(timeout):
            for attempt in itertools.count():
                try:
                    await self.state()
                except httpx.TransportError:
                    await asyncio.sleep(min(0.5, 0.01 * 2**attempt))
                else:
                    return

    async def _wait(self, spec: JSON, timed_out: Callable[[str], str]) -> JSON:
        """POST `spec` to `/control/wait`; the state, or TimeoutError(`timed_out(error)`)."""
        response = await self._client.post("/control/wait", json=spec)
        if response.status_code == 504:
            raise TimeoutError(timed_out(str(response.json().get("error"))))
        response.raise_for_status()
        state: JSON = response.json()
        return state

    async def _call(self, method: str, path: str, body: Any = None) -> JSON:
        response = await self._client.request(method, path, json=body)
        response.raise_for_status()
        answer: JSON = response.json()
        return answer
