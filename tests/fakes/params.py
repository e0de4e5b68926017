"""Reading a fake's HTTP requests: parameters from the query string and the body (form,
multipart or JSON), hanging up without an answer, and recorded values as JSON."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Part:
    """A file of a multipart body."""

    filename: str | None
    content_type: str | None
    content: bytes


class Params:
    """A request's parameters (`values`) and uploaded files (`files`)."""

    def __init__(self, values: Mapping[str, Any], files: Mapping[str, Part]) -> None:
        self.values = dict(values)
        self.files = dict(files)

    def string(self, key: str) -> str | None:
        """The value as a string: JSON values written the way JSON writes them."""
        value = self.values.get(key)
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int | float):
            return str(value)
        return json.dumps(value)

    def boolean(self, key: str, default: bool = False) -> bool:
        """The value as a boolean: "true" or "1" in a form, any truthy value in JSON."""
        value = self.values.get(key)
        if value is None:
            return default
        if isinstance(value, str):
            return value.strip().lower() in ("true", "1")
        return bool(value)

    def described_files(self) -> JSON:
        """The files as a test reads them: described, not included."""
        return {
            key: {
                "filename": part.filename,
                "content_type": part.content_type,
                "size": len(part.content),
            }
            for key, part in self.files.items()
        }


async def read_params(
    request: Request,
    *,
    max_part_size: int,
    invalid_json: Callable[[], Exception],
    not_object: Callable[[], Exception],
) -> tuple[JSON, dict[str, Part]]:
    """The query string's values updated with the body's, and the body's files.

    A JSON body that does not parse raises `invalid_json()`, one that is not an object
    `not_object()`.
    """
    values: JSON = dict(request.query_params)
    files: dict[str, Part] = {}
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "multipart/form-data":
        async with request.form(max_part_size=max_part_size) as form:
            for key, value in form.multi_items():
                if isinstance(value, UploadFile):
                    files[key] = Part(value.filename, value.content_type, await value.read())
                else:
                    values[key] = value
        return values, files
    body = await request.body()
    if not body:
        return values, files
    if content_type == "application/json":
        try:
            decoded = json.loads(body)
        except ValueError as err:
            raise invalid_json() from err
        if not isinstance(decoded, dict):
            raise not_object()
        values.update(decoded)
    else:
        values.update(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
    return values, files


async def client_left(request: Request) -> None:
    """Return once the client of `request` disconnects."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def hang_up(request: Request) -> Response:
    """Close the connection without an answer (the client sees it dropped)."""
    # uvicorn's h11 `receive` is a bound method of the request cycle, which holds the
    # connection's transport; the ASGI interface itself has no way to hang up.
    transport = getattr(getattr(request.receive, "__self__", None), "transport", None)
    if not isinstance(transport, asyncio.Transport):
        raise RuntimeError("cannot drop the connection: no transport")  # pragma: no cover
    transport.abort()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(5):
            await client_left(request)
    return Response(status_code=500)  # never reaches the client


def jsonable(value: Any) -> Any:
    """`value` as JSON: dataclasses as objects, bytes as base64."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    return value


class EscapedJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped, as `json.dumps` writes it by default: a
    payload holding a lone surrogate (which JSON allows as `\\ud800`) goes out as a platform
    would send it, instead of failing to encode."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode("ascii")
