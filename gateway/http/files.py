"""`GET /files/<expires>/<signature>/<path>`: a file Herald sends by URL (Twilio MMS and
WhatsApp fetch media themselves), under a signed link that expires (`gateway/media.py`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, Response

from gateway.http.deps import AppDeps

router = APIRouter(tags=["files"])


@router.api_route(
    "/files/{expires}/{signature}/{path:path}", methods=["GET", "HEAD"], include_in_schema=False
)
async def signed_file(request: Request, expires: str, signature: str, path: str) -> Response:
    """The file, or 403 (forged link), 410 (expired) or 404 (gone, or links are off)."""
    deps: AppDeps = request.app.state.deps
    if deps.links is None:
        return Response("no such file", status_code=404, media_type="text/plain")
    checked = deps.links.check(expires, signature, path)
    if checked.path is None:
        return Response(checked.reason, status_code=checked.status, media_type="text/plain")
    return FileResponse(checked.path)
