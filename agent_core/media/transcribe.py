"""Voice notes to text through an OpenAI-compatible `/v1/audio/transcriptions` endpoint."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Protocol

import openai

from agent_core.config import TranscriptionConfig


class TranscriptionFailed(Exception):
    """The audio could not be transcribed; the message says why, in words for the person."""


class Transcriber(Protocol):
    """Turns one audio file into text."""

    max_bytes: int

    async def transcribe(self, path: Path, mime_type: str, filename: str) -> str:
        """The words said in the file (stripped; may be empty for silence).

        Raises TranscriptionFailed (too large, unreadable, the endpoint refused or is away).
        """
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


def _read(path: Path, limit: int) -> bytes:
    """The file's bytes; TranscriptionFailed when gone or larger than `limit`. Blocking."""
    try:
        size = path.stat().st_size
        if size > limit:
            raise TranscriptionFailed(
                f"it is larger than {limit / (1024 * 1024):g} MB, the most I can transcribe"
            )
        return path.read_bytes()
    except OSError as err:
        raise TranscriptionFailed("the audio file is no longer kept") from err


class OpenAITranscriber:
    """`audio.transcriptions.create` of the `openai` SDK against `llm.transcription`."""

    def __init__(self, config: TranscriptionConfig) -> None:
        self.max_bytes = config.max_bytes
        self.model = config.model
        self.language = config.language
        key = config.api_key.get_secret_value() if config.api_key is not None else ""
        self._client = openai.AsyncOpenAI(
            base_url=config.base_url,
            api_key=key or "not-needed",
            timeout=openai.Timeout(config.timeout, connect=min(10.0, config.timeout)),
            max_retries=1,
            http_client=openai.DefaultAioHttpClient(),
        )

    async def transcribe(self, path: Path, mime_type: str, filename: str) -> str:
        """See `Transcriber.transcribe`."""
        data = await asyncio.to_thread(_read, path, self.max_bytes)
        try:
            result = await self._client.audio.transcriptions.create(
                model=self.model,
                file=(filename or path.name, data, mime_type),
                language=self.language if self.language else openai.omit,
                response_format="json",
            )
        except openai.APIStatusError as err:
            raise TranscriptionFailed(
                f"the transcription service refused it (HTTP {err.status_code})"
            ) from err
        except openai.APIError as err:
            raise TranscriptionFailed(
                f"the transcription service is unreachable ({type(err).__name__})"
            ) from err
        return result.text.strip()

    async def aclose(self) -> None:
        """See `Transcriber.aclose`."""
        await self._client.close()
