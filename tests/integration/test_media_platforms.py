"""Pictures, files and voice notes through each platform's fake, the daemon in-process, the
model through the real OpenAI client against the fake LLM (which also serves the audio
transcription endpoint).

On every platform: a large photo reaches the model as an image part of the user message,
scaled down to `llm.image_max_pixels`; a PDF is described by name, type and size; a file the
agent sends with `send_file` arrives as the platform's own file upload (Twilio fetches it
from Herald's signed URL; an expired or forged URL is refused).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import pytest

from gateway.contracts.messages import Attachment
from gateway.media import MediaLinks, link_key
from tests.contract.harness import PlatformHarness, TwilioHarness, started
from tests.e2e.daemon import free_port
from tests.fakes.llm import FakeLLM, Reply, last_user_text
from tests.integration.inproc import Herald, running_daemon
from tests.integration.media_rig import (
    MEDIA_PLATFORMS,
    files_to,
    image_parts,
    picture,
    send_file,
)

pytestmark = pytest.mark.timeout(90)

MAX_PIXELS = 10_000


def llm_section(llm: FakeLLM, **extra: Any) -> dict[str, Any]:
    """The model at the fake, seeing pictures of at most MAX_PIXELS pixels."""
    return {
        "base_url": llm.base_url,
        "api_key": "k",
        "memory_pass": False,
        "vision": True,
        "image_max_pixels": MAX_PIXELS,
        **extra,
    }


@contextlib.asynccontextmanager
async def herald(
    tmp_path: Path, platform: PlatformHarness, llm: FakeLLM, **llm_extra: Any
) -> AsyncIterator[Herald]:
    """The daemon in-process with `platform` at its fake."""
    port = free_port()
    async with running_daemon(
        tmp_path,
        llm,
        platform.platform,
        platform.section(port),
        port=port,
        extra={"llm": llm_section(llm, **llm_extra)},
    ) as h:
        yield h


@pytest.fixture(params=MEDIA_PLATFORMS)
async def platform(request: pytest.FixtureRequest) -> AsyncIterator[PlatformHarness]:
    async with started(str(request.param)) as harness:
        yield harness


async def test_photo_seen_pdf_described_and_file_sent(
    tmp_path: Path, platform: PlatformHarness
) -> None:
    person = platform.people[0]
    async with FakeLLM() as llm, herald(tmp_path, platform, llm) as h:
        llm.script(Reply(text="a red square"))
        await send_file(
            platform,
            h,
            person,
            name="big.png",
            mime="image/png",
            data=picture(400, 300),
            caption="what is this?",
        )
        [first] = await llm.wait_for_requests(1, timeout=30)
        [seen] = image_parts(first)
        assert seen.width * seen.height <= MAX_PIXELS
        assert seen.width / seen.height == pytest.approx(4 / 3, rel=0.05)
        await platform.wait_texts(person, 1)

        llm.script(
            Reply(
                tool_calls=[
                    ("send_file", {"content": "made by the agent", "filename": "notes.txt"})
                ]
            ),
            Reply(text="here are your notes"),
        )
        await send_file(
            platform,
            h,
            person,
            name="report.pdf",
            mime="application/pdf",
            data=b"%PDF-1.4 x" * 50,
            caption="read this",
        )
        requests = await llm.wait_for_requests(2, timeout=30)
        described = last_user_text(requests[1])
        assert "[attached file: " in described
        assert "(application/pdf, 500 bytes)" in described
        assert image_parts(requests[1]) == []
        await platform.fake.wait_for(lambda: len(files_to(platform, person)) >= 1, 30)
        [(name, size)] = files_to(platform, person)
        assert size == len(b"made by the agent")
        assert name in ("notes.txt", "")  # Twilio media carry no name
        assert "here are your notes" in " ".join(await platform.wait_texts(person, 2))
        if isinstance(platform, TwilioHarness):
            await _links_refused_when_expired_or_forged(h, platform)


async def _links_refused_when_expired_or_forged(h: Herald, twilio: TwilioHarness) -> None:
    """The URL Twilio fetched served the file; the same file under an expired link is 410,
    under a forged signature 403."""
    [(url, status)] = twilio.twilio.media_pulls
    assert status == 200
    assert "/files/" in url
    prefix, _, rest = url.partition("/files/")
    expires, signature, path = rest.split("/", 2)
    blob, _, name = unquote(path).partition("/")
    sent = Attachment(Path(name), "text/plain", 17, name, blob=blob)
    expired = MediaLinks(await link_key(h.store), ttl=-5).link(sent, h.url)
    forged = f"{prefix}/files/{expires}/{signature[:-2]}xx/{path}"
    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
        served = await client.get(url.replace(prefix, h.url))
        assert served.content == b"made by the agent"
        assert served.headers["x-content-type-options"] == "nosniff"  # never run as a page
        assert served.headers["content-security-policy"].startswith("sandbox")
        assert (await client.head(url.replace(prefix, h.url))).status_code == 200
        assert (await client.get(expired)).status_code == 410
        assert (await client.get(forged.replace(prefix, h.url))).status_code == 403
        # Twilio itself is refused the expired link: the message fails (error 11200).
        fake = twilio.twilio
        answer = await client.post(
            f"{fake.base_url}/2010-04-01/Accounts/{fake.account_sid}/Messages.json",
            data={"To": twilio.people[0], "From": "+15550000000", "MediaUrl": expired},
            auth=(fake.account_sid, fake.auth_token),
        )
        assert answer.json()["code"] == 11200
        assert fake.media_pulls[-1] == (expired, 410)
