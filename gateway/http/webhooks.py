"""`POST /webhooks/<platform>[/<path>]`: platforms push updates; the adapter verifies them.

The adapter answers only after the inbox commit. While Herald drains, or while the adapter is
not connected, the answer is 503 so that the platform delivers the update again later.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.contracts.errors import ShuttingDown, TransientError
from gateway.http.deps import AppDeps

logger = logging.getLogger(__name__)

router = APIRouter(tags=["webhooks"])

ANSWERS: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Taken (stored before this answer), or ignored",
        "content": {"text/plain": {}, "application/json": {}, "text/xml": {}},
    },
    400: {"description": "Malformed body"},
    401: {"description": "Missing or wrong signature or secret"},
    403: {"description": "Signature from another account, or a stale request"},
    404: {"description": "No such webhook (the platform is not configured for webhooks)"},
    413: {"description": "Body too large"},
    503: {"description": "Shutting down, or the adapter is not connected yet: deliver again"},
}
BODY: dict[str, Any] = {
    "requestBody": {
        "description": "The platform's payload, verified by its adapter",
        "content": {
            "application/json": {"schema": {}},
            "application/x-www-form-urlencoded": {"schema": {"type": "object"}},
        },
    }
}
"""The platforms' own payloads: documented as any body (each adapter checks its own)."""


def _unavailable(detail: str) -> Response:
    return Response(detail, status_code=503, media_type="text/plain", headers={"Retry-After": "5"})


@router.post("/webhooks/{platform}", responses=ANSWERS, openapi_extra=BODY, response_class=Response)
@router.post(
    "/webhooks/{platform}/{path:path}",
    responses=ANSWERS,
    openapi_extra=BODY,
    response_class=Response,
)
async def webhook(request: Request, platform: str, path: str = "") -> Response:
    """Hand the request to the platform's adapter; 404 for a platform without webhooks."""
    deps: AppDeps = request.app.state.deps
    if platform not in deps.adapters():
        return Response("no such webhook", status_code=404, media_type="text/plain")
    if deps.state.draining:
        return _unavailable("Herald is shutting down; deliver again later")
    adapter = deps.webhooks(platform)
    if adapter is None:
        return _unavailable(f"the {platform} adapter is not connected yet")
    body = await request.body()
    try:
        answer = await adapter.handle_webhook(path, dict(request.headers), body, deps.manager)
    except ShuttingDown:
        return _unavailable("Herald is shutting down; deliver again later")
    except TransientError as err:
        logger.warning("webhook %s: %s", platform, err)
        return _unavailable("temporarily unable to take this update; deliver again later")
    return Response(answer.body, status_code=answer.status, media_type=answer.content_type)
