"""`POST /hooks/<name>`: a trigger's signed request; `GET /api/triggers[/<name>]`: the
configured triggers and their recent runs (behind the API key, as all of `/api`).

The body is read only up to the trigger's `max_body_bytes` (413 beyond, nothing stored);
the answer comes after the delivery's commit and before its run (202). While Herald drains,
or when the database fails, the answer is 503 so that the sender delivers again later.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from gateway.http.deps import AppDeps
from gateway.triggers.config import TriggerConfig
from gateway.triggers.service import TriggerService, split_targets
from gateway.triggers.views import describe, run_view

logger = logging.getLogger(__name__)

router = APIRouter(tags=["triggers"])

ANSWERS: dict[int | str, dict[str, Any]] = {
    200: {"description": "Verified, but its filters skip it: nothing runs"},
    202: {"description": "Stored (before this answer); it runs once, a redelivery runs nothing"},
    401: {"description": "Missing, wrong or stale signature; nothing stored"},
    404: {"description": "No such trigger"},
    413: {"description": "Body larger than the trigger's max_body_bytes; nothing stored"},
    429: {"description": "Over the trigger's rate limit or queued runs; see Retry-After"},
    503: {"description": "Shutting down, or the database is away: deliver again"},
}
BODY: dict[str, Any] = {
    "requestBody": {
        "description": "The sender's payload (JSON), verified over its raw bytes",
        "content": {"application/json": {"schema": {}}},
    }
}


def _service(request: Request) -> TriggerService | None:
    deps: AppDeps = request.app.state.deps
    return deps.triggers


async def _body(request: Request, limit: int) -> bytes | None:
    """The body, or None once it passes `limit` bytes (the rest is not read)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        return None
    parts: list[bytes] = []
    size = 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            return None
        parts.append(part)
    return b"".join(parts)


@router.post("/hooks/{name}", responses=ANSWERS, openapi_extra=BODY, response_class=Response)
async def hook(request: Request, name: str) -> Response:
    """Verify, deduplicate and store one delivery of trigger `name`; 202 before its run."""
    deps: AppDeps = request.app.state.deps
    service = deps.triggers
    cfg = None if service is None else service.config(name)
    if service is None or cfg is None:
        if service is not None:
            service.count("", "unknown")
        return JSONResponse({"error": "no such trigger"}, status_code=404)
    if deps.state.draining:
        return JSONResponse(
            {"error": "Herald is shutting down; deliver again later"},
            status_code=503,
            headers={"Retry-After": "5"},
        )
    body = await _body(request, cfg.max_body_bytes)
    if body is None:
        service.count(name, "too_large")
        return JSONResponse(
            {"error": f"the body is larger than {cfg.max_body_bytes} bytes"}, status_code=413
        )
    try:
        answer = await service.receive(name, dict(request.headers), body)
    except Exception as err:  # the database may be away: the sender tries again
        logger.warning("trigger %s: could not store a delivery: %s", name, deps.redactor(str(err)))
        return JSONResponse(
            {"error": "temporarily unable to take this delivery; deliver again later"},
            status_code=503,
            headers={"Retry-After": "5"},
        )
    return JSONResponse(dict(answer.body), status_code=answer.status, headers=dict(answer.headers))


api = APIRouter(prefix="/api/triggers", tags=["triggers"])

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "Missing or wrong API key"},
    404: {"description": "No such trigger"},
    503: {"description": "Triggers are not available"},
}


def _configured(request: Request) -> tuple[TriggerService, dict[str, TriggerConfig]]:
    service = _service(request)
    if service is None:
        raise HTTPException(503, "triggers are not available")
    return service, service.triggers


@api.get("", responses=ERRORS)
async def list_triggers(request: Request) -> dict[str, Any]:
    """Every configured trigger (secrets never shown) with its waiting runs."""
    service, triggers = _configured(request)
    waiting = await service.runs.waiting()
    return {
        "triggers": [
            describe(name, cfg, waiting.get(name, 0)) for name, cfg in sorted(triggers.items())
        ]
    }


@api.get("/{name}", responses=ERRORS)
async def show_trigger(request: Request, name: str) -> dict[str, Any]:
    """One trigger and its newest runs."""
    service, triggers = _configured(request)
    cfg = triggers.get(name)
    if cfg is None:
        raise HTTPException(404, f"there is no trigger {name!r}")
    waiting = await service.runs.waiting()
    runs = await service.runs.runs(name, limit=20)
    deps: AppDeps = request.app.state.deps
    out = describe(name, cfg, waiting.get(name, 0))
    out["runs"] = [deps.redactor.data(run_view(r)) for r in runs]
    out["webhooks"] = split_targets(cfg.targets)[1]
    return out
