"""Voice notes through Telegram's fake, the daemon in-process: transcribed before the turn
by the fake LLM's `/v1/audio/transcriptions` (the transcript is the stored, searchable
message text, marked transcribed); a failed or oversized transcription tells the person and
the message is dropped with that reason; without an endpoint the person hears so at once.
A voice note steered into a running turn is transcribed the same way before it is injected."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from gateway.store.tables import inbox, messages
from tests.contract.harness import PlatformHarness, started
from tests.e2e.daemon import free_port
from tests.fakes.llm import FakeLLM, Reply, last_user_text
from tests.integration.inproc import Herald, running_daemon
from tests.integration.media_rig import send_file

pytestmark = pytest.mark.timeout(60)

OGG = b"OggS" + b"\x00" * 2000


@contextlib.asynccontextmanager
async def herald(
    tmp_path: Path,
    platform: PlatformHarness,
    llm: FakeLLM,
    *,
    busy_mode: str | None = None,
    **llm_extra: Any,
) -> AsyncIterator[Herald]:
    port = free_port()
    section = {"base_url": llm.base_url, "api_key": "k", "memory_pass": False, **llm_extra}
    chat = platform.section(port)
    if busy_mode is not None:
        chat["busy_mode"] = busy_mode
    async with running_daemon(
        tmp_path,
        llm,
        platform.platform,
        chat,
        port=port,
        extra={"llm": section},
    ) as h:
        yield h


@pytest.fixture
async def telegram() -> AsyncIterator[PlatformHarness]:
    async with started("telegram") as harness:
        yield harness


async def test_voice_note_transcribed_failed_and_too_large(
    tmp_path: Path, telegram: PlatformHarness
) -> None:
    person = telegram.people[0]
    async with (
        FakeLLM() as llm,
        herald(
            tmp_path,
            telegram,
            llm,
            transcription={"base_url": llm.base_url, "model": "whisper-test", "max_bytes": 4000},
        ) as h,
    ):
        llm.script(Reply(text="got it"))
        await send_file(telegram, h, person, name="v.ogg", mime="audio/ogg", data=OGG)
        [request] = await llm.wait_for_requests(1, timeout=20)
        [heard] = llm.transcriptions
        assert heard.model == "whisper-test"
        assert heard.content == OGG
        seen = last_user_text(request)
        assert ", transcribed]: hello from a voice note" in seen
        assert await telegram.wait_texts(person, 1) == ["got it"]
        async with h.store.read() as conn:
            stored = (await conn.execute(select(messages.c.content))).scalars().all()
        assert any("hello from a voice note" in c for c in stored)

        llm.transcription_status = 500
        await send_file(telegram, h, person, name="v.ogg", mime="audio/ogg", data=OGG)
        texts = await telegram.wait_texts(person, 2)
        assert "couldn't transcribe your voice note" in texts[1]
        assert "HTTP 500" in texts[1]

        await send_file(telegram, h, person, name="v.ogg", mime="audio/ogg", data=OGG * 3)
        texts = await telegram.wait_texts(person, 3)
        assert "larger than" in texts[2]
        rows = await h.answered(3)
        assert [r["outcome"] for r in rows] == ["answered", "dropped", "dropped"]
        assert rows[1]["outcome_detail"] == "voice note not transcribed"
        assert len(llm.requests) == 1  # the failed ones never reached the model


async def test_voice_note_without_endpoint_gets_a_reply(
    tmp_path: Path, telegram: PlatformHarness
) -> None:
    person = telegram.people[0]
    async with FakeLLM() as llm, herald(tmp_path, telegram, llm) as h:
        await send_file(telegram, h, person, name="v.ogg", mime="audio/ogg", data=OGG)
        [text] = await telegram.wait_texts(person, 1)
        assert "can't listen to voice notes" in text
        [row] = await h.answered(1)
        assert row["outcome"] == "dropped"
        assert llm.requests == []


async def _steering(h: Herald, llm: FakeLLM, telegram: PlatformHarness, person: str) -> None:
    """A turn that holds in its first model call (a tool call follows), and a voice note the
    person sends meanwhile, stored as a steer message of that turn; then the call goes on."""
    gate = asyncio.Event()
    llm.script(
        Reply(tool_calls=[("view_attachment", {"file": "nothing.txt"})], gate=gate),
        Reply(text="done, with your note"),
    )
    await telegram.send(h, person, "look into it")
    await llm.wait_for_requests(1, timeout=20)
    await send_file(telegram, h, person, name="v.ogg", mime="audio/ogg", data=OGG)

    async def steered() -> bool:
        async with h.store.read() as conn:
            return bool(await conn.scalar(select(inbox.c.id).where(inbox.c.steer.is_(True))))

    await h.until(steered)
    gate.set()


async def test_voice_note_steered_into_a_running_turn_is_transcribed(
    tmp_path: Path, telegram: PlatformHarness
) -> None:
    person = telegram.people[0]
    async with FakeLLM() as llm:
        endpoint = {"base_url": llm.base_url, "model": "whisper-test"}
        async with herald(tmp_path, telegram, llm, busy_mode="steer", transcription=endpoint) as h:
            await _steering(h, llm, telegram, person)
            requests = await llm.wait_for_requests(2, timeout=20)
            assert ", transcribed]: hello from a voice note" in last_user_text(requests[1])
            assert [t.content for t in llm.transcriptions] == [OGG]
            rows = await h.answered(2)
            assert [r["outcome"] for r in rows] == ["answered", "steered"]
            assert rows[1]["turn_id"] == rows[0]["turn_id"]
            [note] = rows[1]["payload"]["attachments"]
            assert note["transcript"] == "hello from a voice note"
            async with h.store.read() as conn:
                stored = (await conn.execute(select(messages.c.content))).scalars().all()
            assert any("hello from a voice note" in c for c in stored)
            await telegram.fake.wait_for(
                lambda: any("done, with your note" in t for t in telegram.texts_to(person)), 20
            )


async def test_steered_voice_note_not_transcribed_is_told_and_dropped_once(
    tmp_path: Path, telegram: PlatformHarness
) -> None:
    person = telegram.people[0]
    async with FakeLLM() as llm:
        llm.transcription_status = 500
        endpoint = {"base_url": llm.base_url, "model": "whisper-test"}
        async with herald(tmp_path, telegram, llm, busy_mode="steer", transcription=endpoint) as h:
            await _steering(h, llm, telegram, person)
            requests = await llm.wait_for_requests(2, timeout=20)
            assert "voice note" not in last_user_text(requests[1])
            assert "v.ogg" not in str(requests[1]["messages"])
            rows = await h.answered(2)
            assert [r["outcome"] for r in rows] == ["answered", "dropped"]
            assert rows[1]["outcome_detail"] == "voice note not transcribed"
            await telegram.fake.wait_for(
                lambda: any("done, with your note" in t for t in telegram.texts_to(person)), 20
            )
            texts = telegram.texts_to(person)
            told = [t for t in texts if "couldn't transcribe your voice note" in t]
            assert len(told) == 1
            assert "HTTP 500" in told[0]


async def test_a_voice_note_is_heard_by_the_transcription_of_the_chats_profile(
    tmp_path: Path, telegram: PlatformHarness
) -> None:
    """A chat bound to a profile with its own transcription endpoint: its voice notes go
    there, never to the default profile's (the audio of one profile's chat is not sent to the
    service another profile chose)."""
    person = telegram.people[0]
    async with FakeLLM() as llm:
        port = free_port()
        llm_section = {
            "base_url": llm.base_url,
            "api_key": "k",
            "memory_pass": False,
            "transcription": {"base_url": llm.base_url, "model": "whisper-default"},
        }
        family = {"transcription": {"base_url": llm.base_url, "model": "whisper-family"}}
        extra = {
            "llm": llm_section,
            "profiles": {"family": {"llm": {"model": "family-model", **family}}},
            "bindings": [{"profile": "family", "platform": "telegram"}],
        }
        section = telegram.section(port)
        async with running_daemon(
            tmp_path, llm, telegram.platform, section, port=port, extra=extra
        ) as h:
            llm.script(Reply(text="got it"))
            await send_file(telegram, h, person, name="v.ogg", mime="audio/ogg", data=OGG)
            [request] = await llm.wait_for_requests(1, timeout=20)
            assert request["model"] == "family-model"
            assert ", transcribed]: hello from a voice note" in last_user_text(request)
            assert [t.model for t in llm.transcriptions] == ["whisper-family"]
