"""`GET /files/<expires>/<signature>/<blob>/<name>`: a file Herald sends by URL (Twilio MMS
and WhatsApp fetch media themselves), under a signed link that expires (`gateway/media.py`),
streamed from the blob store by whichever instance the request reaches."""

from __future__ import annotations

import mimetypes

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from gateway.contracts.errors import FileGone, FileStoreUnavailable
from gateway.http.deps import AppDeps
from gateway.media import blob_response_body

router = APIRouter(tags=["files"])


@router.api_route(
    "/files/{expires}/{signature}/{path:path}", methods=["GET", "HEAD"], include_in_schema=False
)
async def signed_file(request: Request, expires: str, signature: str, path: str) -> Response:
    """The file, or 403 (forged link), 410 (expired), 404 (gone, or links are off) or 503
    (the blob store fails: the platform fetches again later)."""
    deps: AppDeps = request.app.state.deps
    if deps.links is None or deps.files is None:
        return Response("no such file", status_code=404, media_type="text/plain")
    checked = deps.links.check(expires, signature, path)
    if checked.blob is None:
        return Response(checked.reason, status_code=checked.status, media_type="text/plain")
    blobs = deps.files.blobs
    mime = mimetypes.guess_type(checked.name)[0] or "application/octet-stream"
    try:
        row = await blobs.records.get(checked.blob)
        if row is not None and row.media_type:
            mime = row.media_type
        body = await blob_response_body(blobs, checked.blob)
    except FileGone:
        return Response("no such file (pruned?)", status_code=404, media_type="text/plain")
    except FileStoreUnavailable as err:
        return Response(
            deps.redactor(f"the file store failed: {err}"),
            status_code=503,
            media_type="text/plain",
            headers={"Retry-After": "30"},
        )
    # The type is what the sender claimed: never let a browser run it on Herald's origin.
    headers = {
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "sandbox; default-src 'none'",
        "Cache-Control": "private, max-age=300",
    }
    if row is not None:
        headers["Content-Length"] = str(row.size)
    if request.method == "HEAD":
        await body.aclose()
        return Response(status_code=200, media_type=mime, headers=headers)
    return StreamingResponse(body, media_type=mime, headers=headers)
