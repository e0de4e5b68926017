"""The `llm` config section: which model the agent talks to, and how."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator

from gateway.contracts.config import Section, http_url, not_empty


class TranscriptionConfig(Section):
    """An OpenAI-compatible `/v1/audio/transcriptions` endpoint for voice notes (a local
    whisper server works). Without `base_url`, voice notes get a reply saying they cannot
    be listened to."""

    base_url: str | None = None
    model: str = "whisper-1"
    api_key: SecretStr | None = None
    """Default: `llm.api_key`."""
    max_bytes: int = Field(default=25 * 1024 * 1024, ge=1)
    """Larger audio files are refused with a reply (OpenAI's own limit is 25 MB)."""
    timeout: float = Field(default=60.0, gt=0)
    language: str | None = None
    """An ISO-639-1 hint (`en`, `de`); the endpoint detects the language when unset."""

    _api_key = field_validator("api_key")(not_empty)
    _base_url = field_validator("base_url")(http_url)

    @property
    def enabled(self) -> bool:
        """Whether voice notes can be transcribed."""
        return self.base_url is not None


class SpeechConfig(Section):
    """An OpenAI-compatible `/v1/audio/speech` endpoint for voice replies (`voice.reply` of
    each platform). Without `base_url`, every answer is text."""

    base_url: str | None = None
    api_key: SecretStr | None = None
    """Default: `llm.api_key`."""
    model: str = Field(default="tts-1", min_length=1)
    voice: str = Field(default="alloy", min_length=1)
    """The endpoint's voice name (OpenAI: alloy, echo, fable, onyx, nova, shimmer, …)."""
    max_chars: int = Field(default=1000, ge=50, le=4096)
    """The longest part of an answer that is spoken (cut at a paragraph or sentence); the
    rest follows as text."""
    timeout: float = Field(default=60.0, gt=0)

    _api_key = field_validator("api_key")(not_empty)
    _base_url = field_validator("base_url")(http_url)

    @property
    def enabled(self) -> bool:
        """Whether answers can be spoken."""
        return self.base_url is not None


class LLMConfig(Section):
    """The language model. With neither `base_url` nor `api_key`, the offline echo provider."""

    provider: Literal["auto", "openai", "echo"] = "auto"
    base_url: str | None = None
    api_key: SecretStr | None = None
    model: str = "gpt-4o-mini"
    context_window: int = Field(default=128_000, ge=1_000)
    compression_threshold: float = Field(default=0.5, gt=0.0, lt=1.0)
    history_window: int = Field(default=40, ge=2, le=10_000)
    """How many recent messages (after the latest summary) are loaded for a turn."""
    connect_timeout: float = Field(default=10.0, gt=0)
    request_timeout: float = Field(default=120.0, gt=0)
    max_retries: int = Field(default=2, ge=0, le=10)
    max_tool_iterations: int = Field(default=8, ge=1, le=100)
    memory_pass: bool = True
    """After each turn, ask the model whether anything is worth remembering."""
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    vision: bool = False
    """The model can see: pictures people send go to it as image parts."""
    image_max_pixels: int = Field(default=1_500_000, ge=10_000, le=50_000_000)
    """Larger pictures are scaled down to about this many pixels before the model sees them."""
    max_images_per_turn: int = Field(default=4, ge=0, le=50)
    transcription: TranscriptionConfig = TranscriptionConfig()

    _api_key = field_validator("api_key")(not_empty)
    _base_url = field_validator("base_url")(http_url)

    @property
    def effective_provider(self) -> Literal["openai", "echo"]:
        """`openai` when an endpoint or key is configured, else `echo`."""
        if self.provider != "auto":
            return self.provider
        return "openai" if (self.base_url or self.api_key) else "echo"


class MediaConfig(Section):
    """Limits on decoding pictures people send (every path: platforms, the HTTP API,
    `view_attachment`)."""

    max_image_pixels: int = Field(default=32_000_000, ge=1_000_000, le=89_000_000)
    """Pictures larger than this (width × height; a JPEG at the smallest scale its decoder
    offers) are not decoded: the turn gets a note saying the picture was too large. A decoded
    picture takes 4 bytes a pixel: the default keeps one picture under about 140 MB. (Pillow
    refuses more than about 89 million pixels anyway.)"""
