"""Voice replies: an answer spoken through the `speech` endpoint and sent as a voice note.

Whether a turn's answer is spoken is the platform's `voice.reply`: `never`, `always`, or
`when_spoken_to` (a message of the turn, or one steered into it, was a voice note, heard
through transcription). Only
an adapter that says so (`SendLimits.voice`) gets voice replies; loopback and the HTTP API
answer in text.

The first part of the answer (`speech.max_chars`, cut at a paragraph or sentence, and no
longer than the platform's caption) is spoken after the agent answered and before the turn
settles; its audio goes into the blob store, and the settlement writes it as one outbox row
(with the spoken text as its caption where the platform shows one, the whole answer when it
fits) ahead of the rest of the answer as text. So the voice note and each text chunk are
rows of their own, each sent once across a crash. A speech endpoint that fails leaves the
answer all text; the failure is logged when a run of failures starts, not for every answer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from agent_core.media.speech import FILENAME, MIME_TYPE, SpeechFailed, Synthesizer
from gateway.backoff import FailureLog
from gateway.chunking import markdown_to_plain, split_spoken, text_length
from gateway.contracts.config import VoiceReply
from gateway.contracts.errors import FileStoreUnavailable, FileTooLarge
from gateway.contracts.ids import InboxId, PlatformMessageId, SessionId, TurnId
from gateway.contracts.messages import Attachment, SendLimits, TextFormat
from gateway.sessions.context import SessionContext
from gateway.sessions.voice import is_audio
from gateway.store import inbox as inbox_sql
from gateway.store.inbox import InboxRow
from gateway.store.outbox import Chunk, OutboxKind, Target

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Spoken:
    """An answer's spoken part, ready for its outbox row."""

    attachment: Attachment
    """The audio, in the blob store, marked `voice`."""
    text: str
    """Its caption (Markdown): the part that was spoken, or the whole answer when it fits."""
    rest: str
    """What follows as text (may be empty)."""


@dataclass
class VoiceJob:
    """One turn's voice reply: set before the agent runs, filled when its answer is spoken."""

    target: Target
    spoken: Spoken | None = None
    asked: bool = True
    """False: the turn's messages were typed (`when_spoken_to`); spoken only if a voice note
    is steered into it."""


def spoken_to(row: InboxRow) -> bool:
    """Whether the message was a voice note (an audio file that was heard)."""
    return any(is_audio(a) and a.transcript is not None for a in row.attachments)


def voice_chunk(
    target: Target,
    spoken: Spoken,
    limits: SendLimits,
    *,
    session_id: SessionId,
    turn_id: TurnId,
    inbox_id: InboxId | None = None,
    reply_to: PlatformMessageId | None = None,
    not_before: datetime | None = None,
    chunk_index: int = 0,
) -> Chunk:
    """The outbox row of a voice reply, keyed by (session, turn): the audio, with the spoken
    text as its caption where the platform shows one. The row keeps that text where none is
    shown too (the adapter leaves it out): it goes alone if the platform refuses the audio."""
    return Chunk(
        key=f"s{session_id}:t{turn_id}:voice",
        target=target,
        text=spoken.text,
        kind=OutboxKind.REPLY,
        format=TextFormat.MARKDOWN,
        chunk_index=chunk_index,
        session_id=session_id,
        turn_id=turn_id,
        inbox_id=inbox_id,
        reply_to=reply_to,
        not_before=not_before,
        attachment=spoken.attachment,
    )


class VoiceReplies:
    """Decides which answers are spoken, and speaks them."""

    def __init__(self, ctx: SessionContext, synthesizer: Synthesizer | None) -> None:
        self.ctx = ctx
        self.synthesizer = synthesizer
        self.failures = FailureLog(logger, "voice replies (the speech endpoint)", interval=600.0)
        """A failing endpoint is told once per run of failures (the answers go as text)."""

    def job(self, target: Target, batch: Sequence[InboxRow]) -> VoiceJob | None:
        """A job when this turn's answer is to be spoken, else None."""
        if self.synthesizer is None or self.ctx.files is None:
            return None
        section = self.ctx.platforms.get((target.platform, target.account))
        if section is None or section.voice.reply is VoiceReply.NEVER:
            return None
        if not self._limits(target).voice:
            return None
        asked = section.voice.reply is VoiceReply.ALWAYS or any(map(spoken_to, batch))
        return VoiceJob(target, asked=asked)

    async def speak(self, job: VoiceJob, answer: str, steered: Sequence[InboxId] = ()) -> None:
        """Speak the first part of `answer` into `job.spoken` (a job not `asked`: only when
        one of the `steered` messages, taken into the turn, was a voice note); left None (the
        answer goes as text) when there is nothing to say or the endpoint or the file store
        fails. Raises nothing but cancellation: it runs in the turn's task, whose exception
        would stop the lanes."""
        try:
            if job.asked or await self._spoken_among(steered):
                await self._speak(job, answer)
        except Exception:  # a bug here must cost the voice, not the answer
            logger.exception("voice reply failed (answered in text)")

    async def _spoken_among(self, ids: Sequence[InboxId]) -> bool:
        rows = inbox_sql.Inbox(self.ctx.store)
        for row_id in ids:
            row = await rows.get(row_id)
            if row is not None and spoken_to(row):
                return True
        return False

    async def _speak(self, job: VoiceJob, answer: str) -> None:
        assert self.synthesizer is not None
        assert self.ctx.files is not None
        limits = self._limits(job.target)
        # No longer than the caption, or than one text message where none is shown: the row
        # carries these words, and sends them alone if the audio is refused.
        size = min(self.synthesizer.max_chars, limits.voice_caption or limits.max_chunk)
        text, rest = split_spoken(answer, size, utf16=limits.count_utf16)
        # The words leave Herald for the endpoint, and as audio for the chat: redacted here
        # (the caption is redacted on its way out like every chunk).
        words = self.ctx.redact(markdown_to_plain(text)).strip()
        if not words:
            return
        try:
            audio = await self.synthesizer.speak(words)
        except SpeechFailed as err:
            self.failures.failed(err, expected=True)
            return
        self.failures.recovered()
        blobs = self.ctx.files.blobs
        try:
            key, size = await blobs.put_bytes(audio, MIME_TYPE, blobs.cache)
        except (FileStoreUnavailable, FileTooLarge, OSError) as err:
            logger.warning("voice reply not kept (answered in text): %s", err)
            return
        attachment = Attachment(
            blobs.cached(key, FILENAME), MIME_TYPE, size, FILENAME, blob=key, voice=True
        )
        whole = answer.strip()
        if rest and text_length(whole, utf16=limits.count_utf16) <= limits.voice_caption:
            text, rest = whole, ""  # the whole answer fits the caption: one message
        job.spoken = Spoken(attachment, text, rest)

    def _limits(self, target: Target) -> SendLimits:
        return self.ctx.channels.limits(target.platform, target.account)
