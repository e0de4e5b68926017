"""Error responses in the OpenAI shape: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    431: "invalid_request_error",
    429: "rate_limit_error",
    502: "api_error",
    503: "service_unavailable",
}


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """The JSON body of an error response."""
    return {
        "error": {
            "message": message,
            "type": ERROR_TYPES.get(status, "api_error"),
            "param": param,
            "code": None,
        }
    }


def error_response(
    status: int,
    message: str,
    *,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """An OpenAI-style error response."""
    return JSONResponse(error_body(status, message, param), status_code=status, headers=headers)


async def http_exception(request: Request, exc: Exception) -> JSONResponse:
    """Render HTTPException in the OpenAI error shape, its text without configured secrets."""
    assert isinstance(exc, HTTPException)
    deps = getattr(request.app.state, "deps", None)
    message = str(exc.detail) if deps is None else deps.redactor(str(exc.detail))
    return error_response(exc.status_code, message, headers=exc.headers)


async def validation_exception(request: Request, exc: Exception) -> JSONResponse:
    """A body that is not JSON, or not the expected JSON, is a 400 naming the bad field."""
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return error_response(400, "the request body is not valid JSON")
    param = ".".join(loc) or None
    message = str(first.get("msg", "invalid request"))
    return error_response(400, f"{param}: {message}" if param else message, param=param)
