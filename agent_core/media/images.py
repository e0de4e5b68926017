"""Pictures for the model: read within a pixel budget, turned upright, scaled down and
re-encoded when needed.

Memory is the cost to bound: a decoded picture takes up to 4 bytes a pixel whatever its file
size (a 343 KB PNG of 9400×9400 pixels decodes to 353 MB). So the size in the header is
checked before anything is decoded (JPEG at the smallest scale its decoder offers), larger
pictures are refused, and a picture is shrunk in strips: one full-size copy at most, never
the two or three a plain resize of a transparent picture makes.
"""

from __future__ import annotations

import asyncio
import base64
import ctypes
import io
import math
import threading
from pathlib import Path

from PIL import Image, UnidentifiedImageError

SHOWN = {"JPEG": "image/jpeg", "PNG": "image/png", "GIF": "image/gif", "WEBP": "image/webp"}
"""Formats the OpenAI image input takes as they are; anything else is converted."""
FORMATS = ("JPEG", "PNG", "GIF", "WEBP", "AVIF", "BMP", "TIFF")
"""The formats read at all (a camera's MPO opens as JPEG): what cameras, phones, browsers and
scanners make. Others (EPS, which runs Ghostscript; JPEG 2000; the rarities) are refused
unread."""
SCALED = ("JPEG", "MPO")
"""Formats whose decoder can decode at 1/2, 1/4 or 1/8 scale (`draft`)."""
DECODE_COST = {"WEBP": 4, "AVIF": 3}
"""Four-byte pixels each pixel of these formats costs while decoding (measured: the
decoder's own buffer and its copies); 1 for the others."""
ORIENTATION = 0x0112
"""The EXIF tag saying how a camera held the picture."""
UPRIGHT = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
"""How to turn a picture upright, by its EXIF orientation."""
MAX_DECODED_PIXELS = 32_000_000
"""The default budget: 128 MB decoded at 4 bytes a pixel, the shrinking's copies on top."""
STRIP_BYTES = 4 * 1024 * 1024
"""About how much of the full-size picture is copied at a time while shrinking it."""


class UnreadableImage(Exception):
    """The file is not a picture this process can read (its message says why)."""


class ImageTooLarge(UnreadableImage):
    """The picture has more pixels than the budget allows decoding; it was not decoded."""


class Pictures:
    """Pictures as `data:` URLs for the model (`image_data_url` with this Herald's limits), one
    at a time: however many turns, tools and requests ask at once, at most one decoded picture
    is in memory. Share one per process."""

    def __init__(self, max_pixels: int, max_decoded: int) -> None:
        self.max_pixels = max_pixels
        self.max_decoded = max_decoded
        self._decoding = threading.Lock()
        self._waiting = asyncio.Lock()  # async callers queue here, not in worker threads

    def data_url(self, source: Path | bytes) -> str:
        """Blocking; waits for any other decoding. Raises ImageTooLarge, UnreadableImage."""
        with self._decoding:
            return image_data_url(source, self.max_pixels, max_decoded=self.max_decoded)

    async def shown(self, source: Path | bytes) -> str:
        """`data_url` in a worker thread. Raises ImageTooLarge, UnreadableImage."""
        async with self._waiting:
            return await asyncio.to_thread(self.data_url, source)


def image_data_url(path: Path | bytes, max_pixels: int, *, max_decoded: int) -> str:
    """`path` (a file, or a picture's bytes) as a `data:` URL the model can see: at most about
    `max_pixels` pixels, in a format the model takes (JPEG, or PNG when the picture is
    transparent). Blocking; the memory it took is handed back to the system on return.

    A picture that would decode to more than `max_decoded` pixels (after JPEG's scaled
    decoding) or Pillow's `MAX_IMAGE_PIXELS` (a decompression bomb) is refused from its
    header, unread.

    Raises ImageTooLarge (over either limit), UnreadableImage (not an image Pillow can read,
    gone).
    """
    try:
        return _data_url_of(path, max_pixels, max_decoded)
    finally:
        _give_back_memory()


def _data_url_of(path: Path | bytes, max_pixels: int, max_decoded: int) -> str:
    try:
        source = io.BytesIO(path) if isinstance(path, bytes) else path
        with Image.open(source, formats=FORMATS) as opened:
            fmt = opened.format or ""
            width, height = opened.size
            drafted = fmt in SCALED and width * height > max_pixels
            if drafted:  # decode at a smaller scale: less memory, faster
                scale = math.sqrt(max_pixels / (width * height))
                opened.draft("RGB", (int(width * scale), int(height * scale)))
            _check_budget(opened, (width, height), max_decoded)
            opened.load()
            # Only now: a PNG's EXIF may follow its pixels, so reading it decodes them.
            held = opened.getexif().get(ORIENTATION)
            turn = UPRIGHT.get(held) if isinstance(held, int) else None
            if not (turn or drafted or fmt not in SHOWN or _over(opened.size, max_pixels)):
                data = path if isinstance(path, bytes) else path.read_bytes()
                return _data_url(SHOWN[fmt], data)
            image = _shrunk(opened, max_pixels)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise ImageTooLarge(_too_large(f"more pixels than allowed ({type(err).__name__})")) from err
    except UnidentifiedImageError as err:
        raise UnreadableImage(f"not a picture that can be shown ({type(err).__name__})") from err
    except OSError as err:
        raise UnreadableImage(f"cannot be read ({err.strerror or err})") from err
    except ValueError as err:  # a mode Pillow cannot convert
        raise UnreadableImage(f"cannot be converted ({err})") from err
    if turn is not None:
        image = image.transpose(turn)
    out = io.BytesIO()
    if image.mode == "RGBA":
        image.save(out, "PNG", optimize=True)
        return _data_url("image/png", out.getvalue())
    image.save(out, "JPEG", quality=85)
    return _data_url("image/jpeg", out.getvalue())


def _check_budget(opened: Image.Image, header: tuple[int, int], max_decoded: int) -> None:
    """Raise ImageTooLarge when `opened` would take more memory to decode than
    `max_decoded` pixels of 4 bytes (or more pixels than Pillow's `MAX_IMAGE_PIXELS`).

    Some decoders cost more than the picture (`DECODE_COST`). A progressive JPEG is the
    exception to scaled decoding: its decoder keeps every coefficient of the full-size picture
    (2 bytes each, per colour component as sampled), whatever the scale asked for.
    """
    width, height = opened.size
    bomb = Image.MAX_IMAGE_PIXELS or max_decoded
    factor = DECODE_COST.get(opened.format or "", 1)
    cost = width * height * factor + _coefficient_pixels(opened, header)
    if width * height <= bomb and cost <= max_decoded:
        return
    why = f"{header[0]}×{header[1]} pixels"
    if opened.info.get("progressive"):
        why += " (a progressive JPEG, decoded whole)"
    elif factor > 1:
        why += f" ({opened.format} takes {factor} times the memory to decode)"
    limit = min(max_decoded, bomb)
    raise ImageTooLarge(
        _too_large(f"{why}, more than the {limit:,} this Herald decodes (media.max_image_pixels)")
    )


def _coefficient_pixels(opened: Image.Image, header: tuple[int, int]) -> int:
    """What a progressive JPEG's coefficient buffers weigh, in 4-byte pixels (0 for others)."""
    layers: list[tuple[int, int, int, int]] = getattr(opened, "layer", None) or []
    if not opened.info.get("progressive") or not layers:
        return 0
    most = max(h * v for _, h, v, _ in layers) or 1
    sampled = sum(h * v for _, h, v, _ in layers) / most  # components, at full size
    return math.ceil(header[0] * header[1] * sampled * 2 / 4)


def _too_large(why: str) -> str:
    return f"too large to look at: {why}; ask for a smaller picture or a crop of what matters"


def _over(size: tuple[int, int], max_pixels: int) -> bool:
    return size[0] * size[1] > max_pixels


def _shrunk(full: Image.Image, max_pixels: int) -> Image.Image:
    """`full` (loaded) as RGB or RGBA of at most about `max_pixels` pixels.

    Whole multiples are taken first by averaging boxes of pixels, strip by strip (exact: a box
    never spans two strips), so no full-size copy is made; then `full` is let go and the
    small result resampled to the final size.
    """
    mode = "RGBA" if full.mode in ("RGBA", "LA", "PA") or "transparency" in full.info else "RGB"
    width, height = full.size
    scale = min(1.0, math.sqrt(max_pixels / (width * height)))
    size = (max(1, int(width * scale)), max(1, int(height * scale)))
    factor = max(1, min(width // size[0], height // size[1]))
    reduced = Image.new(mode, (-(-width // factor), -(-height // factor)))
    rows = max(1, STRIP_BYTES // (4 * width * factor)) * factor
    for top in range(0, height, rows):
        strip = full.crop((0, top, width, min(height, top + rows))).convert(mode)
        reduced.paste(strip.reduce(factor) if factor > 1 else strip, (0, top // factor))
    full.close()  # the decoded picture's memory goes back before the resampling
    if reduced.size == size:
        return reduced
    return reduced.resize(size, Image.Resampling.LANCZOS)


def _give_back_memory() -> None:
    """Return freed heap memory to the system (glibc keeps large freed blocks otherwise: a
    decoded picture's memory stayed with the process long after it was dropped)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to hand back this way
        return
    trim(0)


def _data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
