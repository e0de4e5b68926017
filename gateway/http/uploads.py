"""Pictures in HTTP API requests: OpenAI `image_url` content parts with a `data:` URL,
checked before anything runs (a picture Herald can read, within `files.max_upload_bytes`),
then kept in the session's folder like a picture received on a platform.

Remote `http(s)` URLs are refused: Herald does not fetch URLs a caller names.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError

from agent_core.media.images import FORMATS
from gateway.contracts.messages import Attachment

DATA_URL = re.compile(r"data:(?P<mime>[^;,]*)(?P<params>(?:;[^;,]*)*?);base64,(?P<data>.*)", re.S)
EXTENSIONS = {"JPEG": "jpg", "PNG": "png", "GIF": "gif", "WEBP": "webp", "BMP": "bmp"}
UNSUPPORTED = ("input_audio", "file")
"""Content part types Herald does not take over the API (refused rather than ignored)."""


class BadUpload(ValueError):
    """A content part Herald refuses; the message says why, `param` where."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class Picture:
    """A checked picture from a request."""

    data: bytes
    mime_type: str
    extension: str


def _url(part: dict[str, Any], where: str) -> str:
    value = part.get("image_url")
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url:
        raise BadUpload("an image_url part needs image_url.url", f"{where}.image_url")
    return url


def picture(part: dict[str, Any], where: str, max_bytes: int) -> Picture:
    """The picture an `image_url` part carries. Raises BadUpload."""
    url = _url(part, where)
    param = f"{where}.image_url.url"
    if url[:8].lower().startswith(("http://", "https://")):
        raise BadUpload(
            "pictures are taken only inline, as data: URLs (data:image/png;base64,...); "
            "Herald does not fetch URLs",
            param,
        )
    match = DATA_URL.fullmatch(url.strip())
    if match is None:
        raise BadUpload("not a base64 data: URL (data:image/png;base64,...)", param)
    if not match["mime"].lower().startswith("image/"):
        raise BadUpload(f"not a picture: the data URL says {match['mime'] or 'no type'}", param)
    if len(match["data"]) > (max_bytes + 2) // 3 * 4 + 4:
        raise BadUpload(f"the picture is larger than {max_bytes} bytes", param)
    try:
        data = base64.b64decode(match["data"], validate=True)
    except (binascii.Error, ValueError) as err:
        raise BadUpload("the picture's base64 cannot be decoded", param) from err
    if len(data) > max_bytes:
        raise BadUpload(f"the picture is larger than {max_bytes} bytes", param)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=FORMATS) as opened:
                fmt = opened.format or ""
    except (UnidentifiedImageError, Image.DecompressionBombError, Warning, OSError) as err:
        raise BadUpload(f"not a picture Herald can read ({type(err).__name__})", param) from err
    mime = Image.MIME.get(fmt, match["mime"].lower())
    return Picture(data, mime, EXTENSIONS.get(fmt, fmt.lower() or "img"))


def pictures(content: Any, where: str, max_bytes: int) -> list[Picture]:
    """The pictures of one message's content (a string has none). Raises BadUpload for a
    picture Herald refuses, or a part type it does not take."""
    if not isinstance(content, list):
        return []
    out: list[Picture] = []
    for n, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "image_url":
            out.append(picture(part, f"{where}.content[{n}]", max_bytes))
        elif kind in UNSUPPORTED:
            raise BadUpload(
                f"{kind} parts are not supported; send pictures as image_url parts and "
                "text as text parts",
                f"{where}.content[{n}]",
            )
    return out


def keep(found: Sequence[Picture], folder: Path) -> list[Attachment]:
    """Write the pictures into `folder` (the session's), each under a new name. Blocking."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    batch = uuid.uuid4().hex[:12]
    out: list[Attachment] = []
    for n, p in enumerate(found, 1):
        path = folder / f"api-{batch}-{n}.{p.extension}"
        part = path.with_name(path.name + ".part")
        part.write_bytes(p.data)
        part.replace(path)
        out.append(Attachment(path, p.mime_type, len(p.data), path.name))
    return out


def forget(kept: Sequence[Attachment]) -> None:
    """Delete pictures `keep` wrote for a request that did not run. Blocking."""
    for a in kept:
        a.path.unlink(missing_ok=True)
