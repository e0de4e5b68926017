"""Pictures over the OpenAI-compatible HTTP API, the daemon in-process, the model at the fake
LLM: `image_url` parts with `data:` URLs reach the model as image parts (scaled down like
platform pictures, at most `llm.max_images_per_turn`), a session's picture is kept in its
folder and its history holds a reference line, not the bytes (`view_attachment` shows it
again); without vision the model is told it cannot see. Refused input (a remote URL, bad
base64, no picture, too large) is a 400 in the OpenAI shape and stores nothing."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image
from sqlalchemy import func, select

from gateway.store.blobs import BlobRecords
from gateway.store.tables import messages, sessions
from tests.contract.harness import PlatformHarness, started
from tests.e2e.daemon import free_port
from tests.fakes.llm import FakeLLM, Reply, last_user_text
from tests.integration.inproc import Herald, running_daemon
from tests.integration.media_rig import image_parts, picture

pytestmark = pytest.mark.timeout(90)

MAX_PIXELS = 10_000
MAX_UPLOAD = 20_000


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def asking(text: str, *urls: str) -> list[dict[str, Any]]:
    """One user message: its text and a picture part per URL."""
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    parts += [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [{"role": "user", "content": parts}]


def noise(side: int) -> bytes:
    """A PNG that does not compress: larger than MAX_UPLOAD at side 100."""
    out = io.BytesIO()
    Image.frombytes("RGB", (side, side), os.urandom(side * side * 3)).save(out, "PNG")
    return out.getvalue()


@pytest.fixture
async def telegram() -> AsyncIterator[PlatformHarness]:
    async with started("telegram") as harness:
        yield harness


@contextlib.asynccontextmanager
async def herald(
    tmp_path: Path, platform: PlatformHarness, llm: FakeLLM, *, vision: bool
) -> AsyncIterator[Herald]:
    port = free_port()
    section = {
        "base_url": llm.base_url,
        "api_key": "k",
        "memory_pass": False,
        "vision": vision,
        "image_max_pixels": MAX_PIXELS,
        "max_images_per_turn": 2,
    }
    async with running_daemon(
        tmp_path,
        llm,
        platform.platform,
        platform.section(port),
        port=port,
        extra={"llm": section, "files": {"max_upload_bytes": MAX_UPLOAD}},
    ) as h:
        yield h


async def post(h: Herald, messages: list[dict[str, Any]], user: str | None) -> httpx.Response:
    body: dict[str, Any] = {"model": "herald", "messages": messages}
    if user is not None:
        body["user"] = user
    async with httpx.AsyncClient(timeout=30.0, trust_env=False) as client:
        return await client.post(f"{h.url}/v1/chat/completions", json=body)


def kept_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


async def test_api_pictures_reach_the_model_and_history_keeps_a_reference(
    tmp_path: Path, telegram: PlatformHarness
) -> None:
    async with FakeLLM() as llm, herald(tmp_path, telegram, llm, vision=True) as h:
        files = h.config.state_dir / "cache" / "files"  # the blob store's local cache
        llm.script(Reply(text="a red square"))
        answer = await post(h, asking("what is this?", data_url(picture(400, 300))), "ann")
        assert answer.status_code == 200, answer.text
        [first] = await llm.wait_for_requests(1, timeout=20)
        [seen] = image_parts(first)
        assert seen.width * seen.height <= MAX_PIXELS
        assert "[attached file: api-" in last_user_text(first)
        [kept] = await asyncio.to_thread(kept_files, files)
        [recorded] = await BlobRecords(h.store).session_files("api:default:ann", 10)
        assert recorded.path == kept
        assert recorded.blob == kept.parent.name  # its bytes are in the blob store
        assert await BlobRecords(h.store).session_files("api:default:bob", 10) == []
        async with h.store.read() as conn:
            stored = (await conn.execute(select(messages.c.content))).scalars().all()
        assert any(f"saved at {kept}]" in c for c in stored)
        assert not any("base64" in c for c in stored)

        # Later: the picture is shown again only through the tool.
        llm.script(
            Reply(tool_calls=[("view_attachment", {"file": kept.name})]),
            Reply(text="still a red square"),
        )
        answer = await post(h, [{"role": "user", "content": "and the colour?"}], "ann")
        assert answer.status_code == 200, answer.text
        requests = await llm.wait_for_requests(3, timeout=20)
        assert image_parts(requests[1]) == []
        assert len(image_parts(requests[2])) == 1
        # Another session cannot see it.
        llm.script(Reply(tool_calls=[("view_attachment", {"file": str(kept)})]), Reply(text="no"))
        assert (await post(h, [{"role": "user", "content": "show"}], "bob")).status_code == 200
        requests = await llm.wait_for_requests(5, timeout=20)
        assert "no file" in str(requests[4]["messages"][-1]["content"])
        assert image_parts(requests[4]) == []

        # At most llm.max_images_per_turn pictures are shown; stateless requests too.
        three = [data_url(picture(40 + n, 30)) for n in range(3)]
        assert (await post(h, asking("three", *three), "ann")).status_code == 200
        requests = await llm.wait_for_requests(6, timeout=20)
        assert len(image_parts(requests[5])) == 2
        assert "more than 2 pictures" in last_user_text(requests[5])
        assert (await post(h, asking("stateless", *three), None)).status_code == 200
        requests = await llm.wait_for_requests(7, timeout=20)
        assert len(image_parts(requests[6])) == 2
        assert len(await asyncio.to_thread(kept_files, files)) == 4  # stateless keeps none


@pytest.mark.parametrize("user", ["carol", None])
async def test_refused_pictures_are_a_400_and_store_nothing(
    tmp_path: Path, telegram: PlatformHarness, user: str | None
) -> None:
    bad = {
        "remote": "https://example.com/cat.png",
        "base64": "data:image/png;base64,not*base64!",
        "type": data_url(b"hello", "text/plain"),
        "bytes": data_url(b"this is no picture at all"),
        "large": data_url(noise(100)),
        # Only common formats are read: JPEG 2000 (or EPS, run by Ghostscript) is refused.
        "format": data_url(picture(40, 30, "JPEG2000")),
    }
    async with FakeLLM() as llm, herald(tmp_path, telegram, llm, vision=True) as h:
        for why, url in bad.items():
            answer = await post(h, asking("look", url), user)
            assert answer.status_code == 400, (why, answer.text)
            error = answer.json()["error"]
            assert error["type"] == "invalid_request_error"
            assert "messages[0].content[1].image_url" in error["message"]
        assert "not fetch URLs" in (await post(h, asking("x", bad["remote"]), user)).text
        assert "larger than" in (await post(h, asking("x", bad["large"]), user)).text
        assert llm.requests == []
        assert await asyncio.to_thread(kept_files, h.config.state_dir / "files") == []
        async with h.store.read() as conn:
            assert await conn.scalar(select(func.count()).select_from(sessions)) == 0


async def test_without_vision_the_model_is_told_it_cannot_see(
    tmp_path: Path, telegram: PlatformHarness
) -> None:
    async with FakeLLM() as llm, herald(tmp_path, telegram, llm, vision=False) as h:
        url = data_url(picture(40, 30))
        for user in ("ann", None):
            assert (await post(h, asking("what is it?", url), user)).status_code == 200
        requests = await llm.wait_for_requests(2, timeout=20)
        for request in requests:
            assert image_parts(request) == []
            assert "you cannot see pictures" in last_user_text(request)
