"""One picture may not cost the daemon more than 200 MB, whichever way it arrives. Under
`herald run`, with the default `media.max_image_pixels`: a 9400×9400 transparent PNG (a few
hundred KB; 353 MB decoded) sent over the HTTP API (a stateless request and a named session)
and as a Telegram photo is not decoded — the model is told it was too large — and a picture
just under the budget is shown, also three at once (decoded one after the other). The
daemon's peak and current RSS are read from /proc.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import struct
import zlib
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.daemon import Daemon
from tests.fakes.llm import FakeLLM, Reply, last_user_text
from tests.fakes.telegram import FakeTelegramServer
from tests.integration.media_rig import image_parts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

TOKEN = "123456:picture-memory-token"
PERSON = 4343
WAIT = 60.0
MB = 1024 * 1024
PEAK_LIMIT = 200 * MB
"""The most one picture may raise the daemon's peak RSS."""
KEPT_LIMIT = 100 * MB
"""The most the daemon may keep after the pictures (Pillow's modules, caches)."""


def transparent_png(width: int, height: int) -> bytes:
    """An RGBA PNG of one half-transparent colour, written row by row (the test process never
    holds the decoded picture)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    packer = zlib.compressobj(9)
    row = b"\x00" + bytes((200, 40, 90, 128)) * width
    compressed = [packer.compress(row) for _ in range(height)]
    compressed.append(packer.flush())
    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", b"".join(compressed))
        + chunk(b"IEND", b"")
    )


def memory(pid: int) -> tuple[int, int]:
    """(peak RSS, current RSS) of process `pid`, in bytes."""
    values: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            values[key] = int(value.split()[0]) * 1024
    return values["VmHWM"], values["VmRSS"]


def reset_peak(pid: int) -> None:
    """Set the peak RSS back to the current RSS (Linux >= 4.0); best effort."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def with_picture(png: bytes, **extra: Any) -> dict[str, Any]:
    """A chat-completions request carrying `png`."""
    content = [
        {"type": "text", "text": "what is in this picture?"},
        {"type": "image_url", "image_url": {"url": data_url(png)}},
    ]
    return {"messages": [{"role": "user", "content": content}], **extra}


async def test_one_picture_costs_at_most_200_mb_over_the_api_and_telegram(
    tmp_path: Path,
) -> None:
    huge = transparent_png(9400, 9400)
    assert len(huge) < 1 * MB  # small on the wire, 353 MB decoded
    under_budget = transparent_png(5600, 5600)  # 31.4 million pixels: decoded and shown
    async with FakeTelegramServer(TOKEN) as tg, FakeLLM() as llm:
        telegram = {
            "token": TOKEN,
            "base_url": tg.base_url,
            "base_file_url": tg.base_file_url,
            "allowed_users": [str(PERSON)],
            "poll_timeout": 1,
            "stream_edits": False,
            "min_send_interval": 0,
        }
        daemon = Daemon(
            tmp_path / "state",
            {
                "platforms": {"telegram": telegram},
                "llm": {
                    "base_url": llm.base_url,
                    "api_key": "k",
                    "memory_pass": False,
                    "vision": True,
                },
                "files": {"max_upload_bytes": 4 * MB},
                "api": {"max_body_bytes": 8 * MB},
            },
        )
        (tmp_path / "state").mkdir()
        await daemon.start()
        assert daemon.process is not None
        pid = daemon.process.pid
        try:
            async with httpx.AsyncClient(timeout=WAIT, trust_env=False) as client:
                # Warm up (Pillow imported, a small picture shown), then measure from here.
                llm.script(Reply(text="a small one"))
                small = tg.add_file(transparent_png(64, 48), mime_type="image/png")
                tg.inject_message(PERSON, "hi", sender_id=PERSON, photo=small)
                await llm.wait_for_requests(1, timeout=WAIT)
                await tg.wait_for(lambda: len(tg.texts_in(PERSON)) >= 1, WAIT)
                _, before = memory(pid)

                async def costs(send: Any, n: int) -> dict[str, Any]:
                    """Send a picture (`send()`), wait for the model's request `n`; check the
                    peak stayed within the limit; that request."""
                    reset_peak(pid)
                    await send()
                    body = (await llm.wait_for_requests(n, timeout=WAIT))[n - 1]
                    peak, _ = memory(pid)
                    assert peak - before < PEAK_LIMIT, f"peak {(peak - before) // MB} MB over"
                    return body

                async def api_stateless() -> None:
                    llm.script(Reply(text="too large for me"))
                    response = await client.post(
                        f"{daemon.url}/v1/chat/completions", json=with_picture(huge)
                    )
                    assert response.status_code == 200, response.text

                async def api_session() -> None:
                    llm.script(Reply(text="too large again"))
                    response = await client.post(
                        f"{daemon.url}/v1/chat/completions", json=with_picture(huge, user="ann")
                    )
                    assert response.status_code == 200, response.text

                async def telegram_photo(png: bytes, reply: str) -> None:
                    llm.script(Reply(text=reply))
                    photo = tg.add_file(png, file_name="p.png", mime_type="image/png")
                    tg.inject_message(PERSON, "and this?", sender_id=PERSON, photo=photo)

                async def telegram_huge() -> None:
                    await telegram_photo(huge, "too large on telegram")

                async def telegram_under_budget() -> None:
                    await telegram_photo(under_budget, "a pink square")

                async def api_three_at_once() -> None:
                    # Decoded one at a time: three at once cost what one does.
                    llm.script(*(Reply(text="pink") for _ in range(3)))
                    url = f"{daemon.url}/v1/chat/completions"
                    answers = await asyncio.gather(
                        *(client.post(url, json=with_picture(under_budget)) for _ in range(3))
                    )
                    assert [a.status_code for a in answers] == [200, 200, 200]

                for n, send in enumerate((api_stateless, api_session, telegram_huge), 2):
                    body = await costs(send, n)
                    assert "too large to look at: 9400×9400 pixels" in last_user_text(body)
                    assert image_parts(body) == []
                shown = await costs(telegram_under_budget, 5)
                [seen] = image_parts(shown)
                assert seen.width * seen.height <= 1_500_000
                await tg.wait_for(lambda: len(tg.texts_in(PERSON)) >= 3, WAIT)
                await costs(api_three_at_once, 8)
                assert [len(image_parts(body)) for body in llm.requests[-3:]] == [1, 1, 1]
                _, after = memory(pid)
                assert after - before < KEPT_LIMIT, f"{(after - before) // MB} MB kept"
            assert await daemon.stop() == 0
        finally:
            if daemon.process.returncode is None:
                daemon.process.kill()
                await daemon.process.wait()
