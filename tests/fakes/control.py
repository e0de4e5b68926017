"""The `/control/*` routes of the fakes that run in another process, and their clients."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Self

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

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
