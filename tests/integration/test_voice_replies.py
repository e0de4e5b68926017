"""Voice replies through the platforms' fakes, the daemon in-process: a voice note (heard
through the fake LLM's transcription endpoint) is answered with a voice note whose audio came
from the fake speech endpoint (`tests/fakes/speech.py`), checked to be Ogg/Opus; a long
answer is spoken in part and the rest follows as text; a typed message gets text; a speech
endpoint that fails leaves the answer in text, logged once for the run of failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from agent_core.media.speech import is_ogg_opus
from gateway.store.tables import inbox, outbox
from tests.contract.harness import (
    DiscordHarness,
    EmailHarness,
    PlatformHarness,
    SlackHarness,
    TelegramHarness,
    TwilioHarness,
    started,
)
from tests.e2e.daemon import free_port
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.speech import FakeSpeech
from tests.integration.inproc import Herald, running_daemon
from tests.integration.media_rig import send_file

pytestmark = pytest.mark.timeout(60)

OGG = b"OggS" + b"\x00" * 200
"""What the person's voice note carries (the fake transcription does not look)."""
SECRET = "tts-secret-4f9a7c2e1b"
"""The speech endpoint's key: a configured secret, never spoken nor shown."""


@contextlib.asynccontextmanager
async def herald(
    tmp_path: Path,
    platform: PlatformHarness,
    llm: FakeLLM,
    speech: FakeSpeech,
    *,
    voice: str | None = None,
    section_extra: dict[str, Any] | None = None,
    sections: dict[str, Any] | None = None,
    **speech_extra: Any,
) -> AsyncIterator[Herald]:
    port = free_port()
    section = {**platform.section(port), **(section_extra or {})}
    if voice is not None:
        section["voice"] = {"reply": voice}
    async with running_daemon(
        tmp_path,
        llm,
        platform.platform,
        section,
        port=port,
        extra={
            "llm": {
                "base_url": llm.base_url,
                "api_key": "k",
                "memory_pass": False,
                "transcription": {"base_url": llm.base_url},
            },
            "speech": {
                "base_url": speech.base_url,
                "model": "tts-test",
                "voice": "nova",
                **speech_extra,
            },
            **(sections or {}),
        },
    ) as h:
        yield h


async def voice_note(platform: PlatformHarness, h: Herald, person: str) -> None:
    await send_file(platform, h, person, name="v.ogg", mime="audio/ogg", data=OGG)


def voices_to(platform: PlatformHarness, person: str) -> list[bytes]:
    """The audio of each voice reply Herald sent `person` (Discord: its size in zeros, the
    fake keeps only names and sizes)."""
    if isinstance(platform, TelegramHarness):
        return [
            s.upload.content
            for s in platform.tg.sent
            if s.method == "sendVoice" and s.upload is not None and s.chat_id == int(person)
        ]
    if isinstance(platform, SlackHarness):
        return [u.content for u in platform.slack.uploads if u.filename == "voice.ogg"]
    if isinstance(platform, TwilioHarness):
        return [m for s in platform.twilio.sent if s.to == person for m in s.media]
    if isinstance(platform, EmailHarness):
        out: list[bytes] = []
        for r in platform.smtp.received:
            for part in r.message.iter_attachments():
                if r.rcpt_tos == (person,) and part.get_filename() == "voice.ogg":
                    content = part.get_content()
                    assert isinstance(content, bytes)
                    out.append(content)
        return out
    if isinstance(platform, DiscordHarness):
        return [
            b"\x00" * size
            for p in platform.discord.posted
            if p.channel_id == platform.DMS[person]
            for name, size in p.files
            if name == "voice.ogg"
        ]
    raise NotImplementedError(type(platform).__name__)


@pytest.fixture
async def telegram() -> AsyncIterator[PlatformHarness]:
    async with started("telegram") as harness:
        yield harness


async def test_telegram_voice_note_answered_by_voice_long_answers_in_part_and_typed_in_text(
    tmp_path: Path, telegram: PlatformHarness
) -> None:
    assert isinstance(telegram, TelegramHarness)
    person = telegram.people[0]
    tg = telegram.tg
    long_answer = "First, **the short part**. It is spoken.\n\n" + "More words here. " * 80
    async with (
        FakeLLM() as llm,
        FakeSpeech() as speech,
        herald(tmp_path, telegram, llm, speech, max_chars=60) as h,
    ):
        llm.script(Reply(text="Yes, **tomorrow** at nine."))
        await voice_note(telegram, h, person)
        [sent] = await tg.wait_for_sent(lambda s: s.method == "sendVoice", 20)
        assert sent.upload is not None
        assert is_ogg_opus(sent.upload.content)
        assert sent.upload.filename == "voice.ogg"
        assert sent.plain_text == "Yes, tomorrow at nine."  # the caption
        [asked] = speech.requests
        assert asked["model"] == "tts-test"
        assert asked["voice"] == "nova"
        assert asked["response_format"] == "opus"
        assert asked["input"] == "Yes, tomorrow at nine."  # no Markdown read aloud
        assert sent.upload.content.endswith(b"SAID=Yes, tomorrow at nine.")

        # A long answer: its first part spoken (and shown as the caption), the rest text.
        llm.script(Reply(text=long_answer))
        await voice_note(telegram, h, person)
        texts = await telegram.wait_texts(person, 3)
        voices = [s for s in tg.sent if s.method == "sendVoice"]
        assert len(voices) == 2
        assert voices[1].plain_text == "First, the short part. It is spoken."
        assert speech.said[1] == "First, the short part. It is spoken."
        assert texts[2].startswith("More words here.")
        assert tg.sent[-1].method == "sendMessage"

        # Typed: answered in text, nothing spoken.
        llm.script(Reply(text="typed answer"))
        await telegram.send(h, person, "hello")
        assert (await telegram.wait_texts(person, 4))[3] == "typed answer"
        assert len(speech.requests) == 2

        async def all_sent() -> bool:
            async with h.store.read() as conn:
                found = await conn.execute(select(outbox.c.status))
                return all(status == "sent" for status in found.scalars())

        await h.until(all_sent)
        async with h.store.read() as conn:
            keys = (await conn.execute(select(outbox.c.idempotency_key))).scalars().all()
        assert sum(key.endswith(":voice") for key in keys) == 2


async def test_speech_endpoint_down_answers_in_text_logged_once(
    tmp_path: Path, telegram: PlatformHarness, caplog: pytest.LogCaptureFixture
) -> None:
    person = telegram.people[0]
    assert isinstance(telegram, TelegramHarness)
    caplog.set_level(logging.WARNING, logger="gateway.sessions.voice_replies")
    async with FakeLLM() as llm, FakeSpeech() as speech:
        speech.status = 503
        async with herald(tmp_path, telegram, llm, speech) as h:
            llm.script(Reply(text="answer one"), Reply(text="answer two"))
            await voice_note(telegram, h, person)
            assert await telegram.wait_texts(person, 1) == ["answer one"]
            await voice_note(telegram, h, person)
            assert await telegram.wait_texts(person, 2) == ["answer one", "answer two"]
            assert speech.said == ["answer one", "answer two"]
            assert not [s for s in telegram.tg.sent if s.method == "sendVoice"]
            told = [r for r in caplog.records if r.name == "gateway.sessions.voice_replies"]
            assert len(told) == 1
            assert "HTTP 503" in told[0].getMessage()

            # An endpoint answering something other than Ogg/Opus is a failure too.
            speech.status, speech.garbage = 200, True
            llm.script(Reply(text="answer three"))
            await voice_note(telegram, h, person)
            assert (await telegram.wait_texts(person, 3))[2] == "answer three"

            # Back: the next voice note gets its voice reply.
            speech.garbage = False
            llm.script(Reply(text="answer four"))
            await voice_note(telegram, h, person)
            [sent] = await telegram.tg.wait_for_sent(lambda s: s.method == "sendVoice", 20)
            assert sent.plain_text == "answer four"
            assert any("works again" in r.getMessage() for r in caplog.records)


async def test_voice_reply_never_always_and_after_a_streamed_preview(
    tmp_path: Path, telegram: PlatformHarness
) -> None:
    person = telegram.people[0]
    assert isinstance(telegram, TelegramHarness)
    tg = telegram.tg
    async with FakeLLM() as llm, FakeSpeech() as speech:
        async with herald(tmp_path / "never", telegram, llm, speech, voice="never") as h:
            llm.script(Reply(text="in text"))
            await voice_note(telegram, h, person)
            assert await telegram.wait_texts(person, 1) == ["in text"]
            assert speech.requests == []
        streaming = {"stream_edits": True, "min_edit_interval": 0.2}
        async with herald(
            tmp_path / "always",
            telegram,
            llm,
            speech,
            voice="always",
            section_extra=streaming,
            api_key=SECRET,
        ) as h:
            # Typed, and streamed: the preview grows into the answer, the voice note follows.
            words = " ".join(f"word{i}" for i in range(30))
            llm.script(Reply(text=words, chunk_delay=0.02))
            await telegram.send(h, person, "typed")
            [sent] = await tg.wait_for_sent(lambda s: s.method == "sendVoice", 20)
            assert sent.upload is not None
            assert is_ogg_opus(sent.upload.content)
            assert telegram.texts_to(person)[1:] == [words, ""]  # no caption: already shown
            assert [s.method for s in tg.sent][1:] == ["sendMessage", "sendVoice"]
            assert tg.edits
            assert speech.said == [words]

            # A configured secret is neither read out nor shown.
            llm.script(Reply(text=f"spoken anyway, and {SECRET} is not read out"))
            await telegram.send(h, person, "typed again")
            await tg.wait_for_sent(lambda s: s.method == "sendVoice", 20)
            await h.until(lambda: len(speech.said) == 2)
            assert speech.said[1].startswith("spoken anyway, and ")
            assert SECRET not in speech.said[1]
            await h.until(lambda: len([s for s in tg.sent if s.method == "sendVoice"]) == 2)
            assert not [t for t in telegram.texts_to(person) if SECRET in t]


@pytest.fixture(params=["slack", "whatsapp", "email", "discord"])
async def platform(request: pytest.FixtureRequest) -> AsyncIterator[PlatformHarness]:
    async with started(str(request.param)) as harness:
        yield harness


async def test_voice_note_answered_by_voice_on_each_platform(
    tmp_path: Path, platform: PlatformHarness
) -> None:
    person = platform.people[0]
    rest = "Then more words, read but not spoken. " * 3
    answer = f"Spoken back to you.\n\n{rest}".strip()
    async with (
        FakeLLM() as llm,
        FakeSpeech() as speech,
        herald(tmp_path, platform, llm, speech, max_chars=50) as h,
    ):
        llm.script(Reply(text=answer))
        await voice_note(platform, h, person)
        await platform.fake.wait_for(lambda: voices_to(platform, person) != [], 30)
        [audio] = voices_to(platform, person)
        assert speech.said == ["Spoken back to you."]
        if isinstance(platform, DiscordHarness):
            # The fake keeps names and sizes: the file is the endpoint's answer.
            assert len(audio) > 40
        else:
            assert is_ogg_opus(audio)
        if isinstance(platform, SlackHarness):
            [upload] = platform.slack.uploads
            assert upload.initial_comment == answer  # the whole answer fits the comment
        if isinstance(platform, TwilioHarness):
            # No caption on WhatsApp audio: the voice alone, then the rest as text.
            await platform.fake.wait_for(
                lambda: len([s for s in platform.twilio.sent if s.to == person]) >= 2, 30
            )
            [voice, text] = [s for s in platform.twilio.sent if s.to == person]
            assert (voice.body, len(voice.media)) == ("", 1)
            assert (text.body, text.media) == (rest.strip(), ())
        if isinstance(platform, EmailHarness | DiscordHarness):
            assert platform.texts_to(person) == [answer]  # one message: text and audio


async def test_a_strangers_voice_note_is_neither_heard_nor_answered_by_voice(
    tmp_path: Path, telegram: PlatformHarness
) -> None:
    assert isinstance(telegram, TelegramHarness)
    person, stranger = telegram.people[0], "777000111"
    assert stranger not in telegram.people
    async with (
        FakeLLM() as llm,
        FakeSpeech() as speech,
        herald(tmp_path, telegram, llm, speech, voice="always") as h,
    ):
        await voice_note(telegram, h, stranger)
        llm.script(Reply(text="for you"))
        await voice_note(telegram, h, person)  # after the stranger's, in the same poll order
        await telegram.tg.wait_for_sent(lambda s: s.method == "sendVoice", 20)
        assert len(llm.transcriptions) == 1  # the person's only
        assert speech.said == ["for you"]
        assert voices_to(telegram, stranger) == []
        assert not any(SECRET in t or "for you" in t for t in telegram.texts_to(stranger))


async def test_a_voice_note_the_platform_refuses_leaves_its_caption_as_text(
    tmp_path: Path, telegram: PlatformHarness
) -> None:
    """Telegram refuses voice notes to people who turned them off (400
    VOICE_MESSAGES_FORBIDDEN): the answer, carried as the caption, must not die with it."""
    assert isinstance(telegram, TelegramHarness)
    person = telegram.people[0]
    async with (
        FakeLLM() as llm,
        FakeSpeech() as speech,
        herald(
            tmp_path,
            telegram,
            llm,
            speech,
            sections={"delivery": {"max_attempts": 2, "backoff_initial": 0.05}},
        ) as h,
    ):
        telegram.tg.fail("sendVoice", status=400)
        llm.script(Reply(text="The **whole** answer, as a caption."))
        await voice_note(telegram, h, person)
        assert await telegram.wait_texts(person, 1) == ["The whole answer, as a caption."]
        assert speech.said == ["The whole answer, as a caption."]
        assert [s.method for s in telegram.tg.sent] == ["sendMessage"]

        # An upload that fails every time (a 5xx for each try) costs the voice, not the text.
        telegram.tg.fail("sendVoice", count=1000, status=500)
        llm.script(Reply(text="Second answer."))
        await voice_note(telegram, h, person)
        assert (await telegram.wait_texts(person, 2))[1] == "Second answer."
        assert [s.method for s in telegram.tg.sent] == ["sendMessage", "sendMessage"]


async def test_twilio_voice_refused_sends_the_spoken_part_as_text(tmp_path: Path) -> None:
    """No caption on Twilio: the spoken part is only heard. A number that takes no media
    (an SMS number without MMS) must still get those words, as text."""
    async with started("whatsapp") as twilio:
        assert isinstance(twilio, TwilioHarness)
        person = twilio.people[0]
        async with (
            FakeLLM() as llm,
            FakeSpeech() as speech,
            herald(tmp_path, twilio, llm, speech, max_chars=50) as h,
        ):
            twilio.twilio.refuse_media(21612)
            rest = ("Then more words, read but not spoken. " * 3).strip()
            llm.script(Reply(text=f"Spoken back to you.\n\n{rest}"))
            await voice_note(twilio, h, person)
            await twilio.fake.wait_for(lambda: len(twilio.twilio.bodies(person)) >= 2, 30)
            assert speech.said == ["Spoken back to you."]
            assert twilio.twilio.bodies(person) == ["Spoken back to you.", rest]  # in order
            assert all(s.media == () for s in twilio.twilio.sent)


async def test_a_voice_note_steered_into_a_typed_turn_makes_its_answer_spoken(
    tmp_path: Path, telegram: PlatformHarness
) -> None:
    assert isinstance(telegram, TelegramHarness)
    person = telegram.people[0]
    async with (
        FakeLLM() as llm,
        FakeSpeech() as speech,
        herald(tmp_path, telegram, llm, speech, section_extra={"busy_mode": "steer"}) as h,
    ):
        gate = asyncio.Event()
        llm.script(
            Reply(tool_calls=[("view_attachment", {"file": "nothing.txt"})], gate=gate),
            Reply(text="heard you"),
        )
        await telegram.send(h, person, "look into it")  # typed: not spoken, so far
        await llm.wait_for_requests(1, timeout=20)
        await voice_note(telegram, h, person)

        async def steered() -> bool:
            async with h.store.read() as conn:
                return bool(await conn.scalar(select(inbox.c.id).where(inbox.c.steer.is_(True))))

        await h.until(steered)
        gate.set()
        [sent] = await telegram.tg.wait_for_sent(lambda s: s.method == "sendVoice", 20)
        assert sent.plain_text == "heard you"
        assert speech.said == ["heard you"]
