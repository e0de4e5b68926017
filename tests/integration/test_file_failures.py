"""A file is the message's problem, never the adapter's: a file whose download fails (a 404,
which python-telegram-bot reports as a refused token; a 5xx; a connection refused) reaches
the turn as a note saying it is unavailable, the message is answered, the adapter keeps
receiving and `/ready` stays 200. The daemon in-process, each platform at its fake.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.contract.harness import DiscordHarness, PlatformHarness, TelegramHarness, started
from tests.e2e.daemon import free_port
from tests.fakes.llm import FakeLLM, Reply, last_user_text
from tests.integration.inproc import Herald, running_daemon
from tests.integration.media_rig import picture

pytestmark = pytest.mark.timeout(90)


@contextlib.asynccontextmanager
async def herald(tmp_path: Path, platform: PlatformHarness, llm: FakeLLM) -> AsyncIterator[Herald]:
    """The daemon in-process with `platform` at its fake."""
    port = free_port()
    async with running_daemon(
        tmp_path,
        llm,
        platform.platform,
        platform.section(port),
        port=port,
        extra={"llm": {"base_url": llm.base_url, "api_key": "k", "memory_pass": False}},
    ) as h:
        yield h


async def still_ready(h: Herald) -> None:
    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
        response = await client.get(f"{h.url}/ready")
    assert response.status_code == 200, response.text


def no_refused_credentials(caplog: pytest.LogCaptureFixture) -> None:
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert refused == []


async def test_telegram_file_that_fails_to_download_is_marked_unavailable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    person = TelegramHarness.people[0]
    async with (
        started("telegram") as harness,
        FakeLLM() as llm,
        herald(tmp_path, harness, llm) as h,
    ):
        assert isinstance(harness, TelegramHarness)
        tg = harness.tg
        llm.script(Reply(text="the photo did not come through"), Reply(text="a 5xx too"))
        # getFile answers; the download itself is 404 (python-telegram-bot: InvalidToken).
        tg.fail_downloads(count=1, status=404)
        photo = tg.add_file(picture(40, 30), file_name="cat.png", mime_type="image/png")
        tg.inject_message(int(person), "look", sender_id=int(person), photo=photo)
        [first] = await llm.wait_for_requests(1, timeout=30)
        seen = last_user_text(first)
        assert "unavailable: Telegram did not serve the file" in seen, seen
        assert harness.TOKEN not in seen
        assert "the photo did not come through" in " ".join(await harness.wait_texts(person, 1))

        # A 5xx twice (the first try and its retry): the same, after one retry.
        tg.fail_downloads(count=2, status=502)
        again = tg.add_file(picture(40, 30), file_name="dog.png", mime_type="image/png")
        tg.inject_message(int(person), "and this", sender_id=int(person), photo=again)
        second = (await llm.wait_for_requests(2, timeout=30))[1]
        assert "unavailable: " in last_user_text(second)
        assert "a 5xx too" in " ".join(await harness.wait_texts(person, 2))

        # The adapter kept receiving: a plain message and a photo that downloads are answered.
        llm.script(Reply(text="hello again"), Reply(text="a red picture"))
        await harness.send(h, person, "still there?")
        await harness.wait_texts(person, 3)
        fine = tg.add_file(picture(40, 30), file_name="ok.png", mime_type="image/png")
        tg.inject_message(int(person), "this one?", sender_id=int(person), photo=fine)
        fourth = (await llm.wait_for_requests(4, timeout=30))[3]
        assert "unavailable" not in last_user_text(fourth)
        assert "[attached file: " in last_user_text(fourth)
        await harness.wait_texts(person, 4)
        await still_ready(h)
        no_refused_credentials(caplog)


async def test_discord_attachment_that_cannot_be_fetched_is_marked_unavailable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    person = DiscordHarness.people[0]
    async with (
        started("discord") as harness,
        FakeLLM() as llm,
        herald(tmp_path, harness, llm) as h,
    ):
        assert isinstance(harness, DiscordHarness)
        llm.script(Reply(text="the file did not come through"), Reply(text="hello again"))
        closed = f"http://127.0.0.1:{free_port()}/attachments/gone"  # nothing listens there
        attachment = {
            "id": str(secrets.randbelow(10**18)),
            "filename": "cat.png",
            "content_type": "image/png",
            "size": 100,
            "url": closed,
            "proxy_url": closed,
        }
        harness.discord.inject_message(
            harness.DMS[person], "look", author=person, attachments=[attachment]
        )
        [first] = await llm.wait_for_requests(1, timeout=30)
        assert "[file cat.png unavailable: " in last_user_text(first)
        assert "did not come through" in " ".join(await harness.wait_texts(person, 1))
        await harness.send(h, person, "still there?")
        assert "hello again" in " ".join(await harness.wait_texts(person, 2))
        await still_ready(h)
        no_refused_credentials(caplog)
