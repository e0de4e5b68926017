"""Voice replies without a daemon: their config (`speech`, `platforms.<name>.voice.reply`)
and its errors, the cut between the spoken part and the text, the format check, the outbox
row's voice mark, and the synthesizer against the fake speech endpoint (its failures)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent_core.config import SpeechConfig
from agent_core.media.speech import OpenAISynthesizer, SpeechFailed, is_ogg_opus
from gateway.chunking import split_spoken
from gateway.config import HeraldConfig, load_config, masked
from gateway.contracts.config import VoiceReply
from gateway.contracts.errors import ConfigError
from gateway.contracts.messages import Attachment
from gateway.media import synthesizer
from gateway.redact import secrets_of
from gateway.store.outbox import attachment_json, attachment_of
from tests.fakes.speech import FakeSpeech, ogg_opus

pytestmark = pytest.mark.timeout(30)

TELEGRAM = """
platforms:
  telegram:
    token: "123:abc"
    allowed_users: [1]
"""


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("HERALD_"):
            monkeypatch.delenv(name)


def load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "herald.yaml"
    path.write_text(text, encoding="utf-8")
    return load_config(path)


def load_config_text(tmp_path: Path, text: str) -> HeraldConfig:
    path = tmp_path / "herald.yaml"
    path.write_text(text, encoding="utf-8")
    return load_config(path)


def load_error(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text)
    return str(caught.value)


def test_defaults_speak_nothing_and_answer_voice_notes_by_voice_once_set(tmp_path: Path) -> None:
    config = load_config(None)
    assert not config.speech.enabled
    path = tmp_path / "herald.yaml"
    path.write_text(
        TELEGRAM + "speech:\n  base_url: http://127.0.0.1:9/v1\n  api_key: tts-secret\n",
        encoding="utf-8",
    )
    config = load_config(path)
    assert config.speech.enabled
    assert (config.speech.model, config.speech.voice) == ("tts-1", "alloy")
    section = config.platforms.accounts()[("telegram", "default")]
    assert section.voice.reply is VoiceReply.WHEN_SPOKEN_TO
    assert masked(config)["speech"]["api_key"] == "***"
    assert "tts-secret" in secrets_of(config)


def test_voice_reply_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERALD_PLATFORMS__TELEGRAM__VOICE__REPLY", "never")
    path = tmp_path / "herald.yaml"
    path.write_text(TELEGRAM, encoding="utf-8")
    section = load_config(path).platforms.accounts()[("telegram", "default")]
    assert section.voice.reply is VoiceReply.NEVER


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            "    voice: {reply: always}\n",
            "platforms.telegram.voice.reply: 'always' needs a speech endpoint",
        ),
        ("    voice: {reply: sometimes}\n", "platforms.telegram.voice.reply: Input should be"),
        ("    voice: {replies: never}\n", "platforms.telegram.voice.replies: unknown key"),
        ("    voice: always\n", "platforms.telegram.voice: a section, not 'always': write"),
        ("speech: {base_url: tts.example.com}\n", "speech.base_url: 'tts.example.com' is not"),
        ("speech: {base_url: 'http://x/v1', max_chars: 10}\n", "speech.max_chars: Input should"),
        ("speech: {base_url: 'http://x/v1', api_key: ' '}\n", "speech.api_key: must not be"),
        ("speech: {url: 'http://x/v1'}\n", "speech.url: unknown key (known: base_url, api_key"),
        ("speech: {base_url: 'http://x/v1', voice: ''}\n", "speech.voice: String should have"),
        ("speech: {base_url: 'http://x/v1', model: ''}\n", "speech.model: String should have"),
    ],
)
def test_config_errors_name_the_key(tmp_path: Path, extra: str, expected: str) -> None:
    assert expected in load_error(tmp_path, TELEGRAM + extra)


def test_always_with_a_speech_endpoint_is_fine(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        TELEGRAM + "    voice: {reply: always}\nspeech: {base_url: 'http://127.0.0.1:9/v1'}\n",
    )
    assert config is not None


def test_split_spoken_cuts_at_a_sentence_and_keeps_the_rest() -> None:
    text = "One sentence here. Another one follows.\n\nA second paragraph."
    assert split_spoken(text, 1000) == (text, "")
    assert split_spoken(text, 50) == (
        "One sentence here. Another one follows.",
        "A second paragraph.",
    )
    first, rest = split_spoken(text, 25)
    assert first == "One sentence here."
    assert rest.startswith("Another one follows.")
    assert split_spoken("   ", 100) == ("", "")
    code = "```python\n" + "x = 1\n" * 30 + "```\nDone."
    first, rest = split_spoken(code, 60)
    assert first.endswith("```")
    assert rest.startswith("```python")
    assert rest.endswith("Done.")


def test_ogg_opus_is_told_by_its_magic_bytes() -> None:
    assert is_ogg_opus(ogg_opus("hi"))
    assert not is_ogg_opus(b"ID3\x04" + b"\x00" * 60)
    assert not is_ogg_opus(b"OggS" + b"\x00" * 60)  # Ogg, but not Opus (Vorbis, say)


def test_the_outbox_row_keeps_the_voice_mark() -> None:
    voice = Attachment(
        Path("/c/voice.ogg"), "audio/ogg", 120, "voice.ogg", blob="a" * 64, voice=True
    )
    assert attachment_of(attachment_json(voice)) == voice
    plain = Attachment(Path("/c/r.txt"), "text/plain", 3, "r.txt")
    assert "voice" not in attachment_json(plain)
    assert attachment_of(attachment_json(plain)) == plain


async def test_synthesizer_asks_for_opus_and_refuses_what_is_not() -> None:
    async with FakeSpeech() as fake:
        url = fake.base_url
        speaker = OpenAISynthesizer(
            SpeechConfig(base_url=fake.base_url, model="m", voice="v", max_chars=100)
        )
        try:
            audio = await speaker.speak("hello there")
            assert is_ogg_opus(audio)
            assert fake.requests == [
                {"model": "m", "voice": "v", "input": "hello there", "response_format": "opus"}
            ]
            fake.garbage = True
            with pytest.raises(SpeechFailed, match="did not answer with Ogg/Opus"):
                await speaker.speak("again")
            fake.garbage, fake.status = False, 500
            with pytest.raises(SpeechFailed, match="HTTP 500"):
                await speaker.speak("again")
        finally:
            await speaker.aclose()
    gone = OpenAISynthesizer(SpeechConfig(base_url=url, timeout=2))
    try:
        with pytest.raises(SpeechFailed, match="unreachable"):
            await gone.speak("nobody listens")
    finally:
        await gone.aclose()


async def test_synthesizer_caps_an_answer_too_large_or_that_never_ends() -> None:
    async with FakeSpeech() as fake:
        speaker = OpenAISynthesizer(
            SpeechConfig(base_url=fake.base_url, timeout=1.0), max_bytes=256 * 1024
        )
        try:
            fake.huge = 10 * 1024 * 1024  # Ogg/Opus, but far over the cap: refused early
            with pytest.raises(SpeechFailed, match="more than 262144 bytes"):
                await speaker.speak("a long one")
            fake.huge, fake.endless = 0, True  # a byte now and then keeps a read timeout happy
            with pytest.raises(SpeechFailed, match="did not answer within 1 s"):
                await speaker.speak("and on and on")
        finally:
            fake.endless = False
            await speaker.aclose()


@pytest.mark.parametrize(
    ("llm_url", "sent"),
    [
        ("http://127.0.0.1:{port}/v1", "Bearer llm-secret"),  # the model's own server
        ("http://127.0.0.1:1/v1", "Bearer not-needed"),  # another port: another server
        (None, "Bearer not-needed"),  # OpenAI's key, and the speech host is not OpenAI
    ],
)
async def test_the_model_key_goes_only_to_the_model_server(
    tmp_path: Path, llm_url: str | None, sent: str
) -> None:
    async with FakeSpeech() as fake:
        llm = "llm:\n  api_key: llm-secret\n"
        if llm_url is not None:
            llm += f"  base_url: {llm_url.format(port=fake.port)}\n"
        config = load_config_text(tmp_path, llm + f"speech:\n  base_url: {fake.base_url}\n")
        speaker = synthesizer(config)
        assert speaker is not None
        try:
            await speaker.speak("hello")
        finally:
            await speaker.aclose()
        assert fake.authorizations == [sent]
