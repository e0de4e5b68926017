"""Pictures for the model: read, turned upright, scaled down and re-encoded when needed."""

from __future__ import annotations

import base64
import io
import math
from pathlib import Path

from PIL import Image, ImageOps, UnidentifiedImageError

SHOWN = {"JPEG": "image/jpeg", "PNG": "image/png", "GIF": "image/gif", "WEBP": "image/webp"}
"""Formats the OpenAI image input takes as they are; anything else is converted."""
ORIENTATION = 0x0112
"""The EXIF tag saying how a camera held the picture."""


class UnreadableImage(Exception):
    """The file is not a picture this process can read (its message says why)."""


def image_data_url(path: Path | bytes, max_pixels: int) -> str:
    """`path` (a file, or a picture's bytes) as a `data:` URL the model can see: at most about
    `max_pixels` pixels, in a format the model takes (JPEG, or PNG when the picture is
    transparent). Blocking.

    Pictures over Pillow's `MAX_IMAGE_PIXELS` are refused unread (a decompression bomb).

    Raises UnreadableImage (not an image Pillow can read, a decompression bomb, gone).
    """
    try:
        with Image.open(io.BytesIO(path) if isinstance(path, bytes) else path) as opened:
            fmt = opened.format or ""
            pixels = opened.width * opened.height
            if Image.MAX_IMAGE_PIXELS and pixels > Image.MAX_IMAGE_PIXELS:
                raise Image.DecompressionBombError(f"{pixels} pixels")
            turned = opened.getexif().get(ORIENTATION, 1) != 1
            drafted = fmt == "JPEG" and pixels > max_pixels
            if drafted:  # decode at a smaller scale: faster
                scale = math.sqrt(max_pixels / pixels)
                opened.draft("RGB", (int(opened.width * scale), int(opened.height * scale)))
            image = ImageOps.exif_transpose(opened)
            image.load()
    except (
        UnidentifiedImageError,
        Image.DecompressionBombError,
        Image.DecompressionBombWarning,
    ) as err:
        raise UnreadableImage(f"not a picture that can be shown ({type(err).__name__})") from err
    except OSError as err:
        raise UnreadableImage(f"cannot be read ({err.strerror or err})") from err
    width, height = image.size
    changed = turned or drafted or fmt not in SHOWN
    if width * height > max_pixels:
        scale = math.sqrt(max_pixels / (width * height))
        size = (max(1, int(width * scale)), max(1, int(height * scale)))
        image = image.resize(size, Image.Resampling.LANCZOS)
        changed = True
    if not changed:
        return _data_url(SHOWN[fmt], path if isinstance(path, bytes) else path.read_bytes())
    out = io.BytesIO()
    if image.mode in ("RGBA", "LA") or "transparency" in image.info:
        image.convert("RGBA").save(out, "PNG", optimize=True)
        return _data_url("image/png", out.getvalue())
    image.convert("RGB").save(out, "JPEG", quality=85)
    return _data_url("image/jpeg", out.getvalue())


def _data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
