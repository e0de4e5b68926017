"""Text to voice notes through an OpenAI-compatible `/v1/audio/speech` endpoint.

Every voice reply is Ogg/Opus (`response_format: opus`): what Telegram plays as a voice note
and WhatsApp as a voice message, and what Discord, Slack and mail carry as an audio file.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

import openai

from agent_core.config import SpeechConfig

MIME_TYPE = "audio/ogg"
"""The type of every voice reply."""
FILENAME = "voice.ogg"
MAX_AUDIO_BYTES = 25 * 1024 * 1024
"""A longer answer from the endpoint is refused (a few minutes of speech is far less)."""


class SpeechFailed(Exception):
    """The text could not be spoken; the message says why (for the log)."""


def is_ogg_opus(data: bytes) -> bool:
    """Whether `data` starts like an Ogg stream carrying Opus (its first page holds the
    `OpusHead` identification header)."""
    return data.startswith(b"OggS") and b"OpusHead" in data[:512]


class Synthesizer(Protocol):
    """Speaks text."""

    max_chars: int
    """The longest text one call speaks."""

    async def speak(self, text: str) -> bytes:
        """The text spoken, as Ogg/Opus audio.

        Raises SpeechFailed (the endpoint refused, is away, or answered something else).
        """
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


class OpenAISynthesizer:
    """`audio.speech.create` of the `openai` SDK against the `speech` section."""

    def __init__(self, config: SpeechConfig, *, max_bytes: int = MAX_AUDIO_BYTES) -> None:
        self.max_chars = config.max_chars
        self.model = config.model
        self.voice = config.voice
        self.timeout = config.timeout
        self.max_bytes = max_bytes
        key = config.api_key.get_secret_value() if config.api_key is not None else ""
        self._client = openai.AsyncOpenAI(
            base_url=config.base_url,
            api_key=key or "not-needed",
            timeout=openai.Timeout(config.timeout, connect=min(10.0, config.timeout)),
            max_retries=0,  # a failure answers in text at once, not after a backoff
            http_client=openai.DefaultAioHttpClient(),
        )

    async def speak(self, text: str) -> bytes:
        """See `Synthesizer.speak`. The whole answer must arrive within `speech.timeout`
        (an endpoint that trickles bytes forever is cut off) and be at most `max_bytes`
        (read in pieces: no more than that is ever held)."""
        try:
            async with asyncio.timeout(self.timeout):
                data = await self._fetch(text)
        except TimeoutError as err:
            raise SpeechFailed(
                f"the speech service did not answer within {self.timeout:g} s"
            ) from err
        except openai.APIStatusError as err:
            raise SpeechFailed(f"the speech service refused it (HTTP {err.status_code})") from err
        except openai.APIError as err:
            raise SpeechFailed(f"the speech service is unreachable ({type(err).__name__})") from err
        if not is_ogg_opus(data):
            raise SpeechFailed(
                "the speech service did not answer with Ogg/Opus audio "
                f"(it began {data[:8]!r}); does it support response_format 'opus'?"
            )
        return data

    async def _fetch(self, text: str) -> bytes:
        async with self._client.audio.speech.with_streaming_response.create(
            model=self.model,
            voice=self.voice,
            input=text[: self.max_chars],
            response_format="opus",
        ) as response:
            data = bytearray()
            async for piece in response.iter_bytes(64 * 1024):
                data += piece
                if len(data) > self.max_bytes:
                    raise SpeechFailed(
                        f"the speech service answered more than {self.max_bytes} bytes"
                    )
            return bytes(data)

    async def aclose(self) -> None:
        """See `Synthesizer.aclose`."""
        await self._client.close()
