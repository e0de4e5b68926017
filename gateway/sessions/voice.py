"""Voice notes before a turn: transcribed into the message (stored with its attachment, so
the transcript is in the history and searchable), or answered with a short reply saying why
not (no transcription endpoint, too large, the endpoint failed).

A voice note that cannot be heard and says nothing else is settled `dropped` with the reason;
one that also has text or other files goes on to its turn without the transcript.

A message steered into a running turn is made ready the same way when the turn reaches the
boundary where it is injected (`steered`).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from agent_core.media.transcribe import Transcriber, TranscriptionFailed
from gateway.contracts.errors import FileGone, FileStoreUnavailable
from gateway.contracts.ids import InboxId
from gateway.contracts.messages import Attachment
from gateway.sessions.context import SessionContext
from gateway.store import inbox as inbox_sql
from gateway.store.inbox import InboxRow, Outcome, Status
from gateway.store.outbox import Chunk, Target, enqueue

logger = logging.getLogger(__name__)

NO_ENDPOINT = (
    "🎤 I can't listen to voice notes here: no transcription service is set up. "
    "Please type your message instead."
)


def is_audio(attachment: Attachment) -> bool:
    """Whether the file is a voice note or another audio recording."""
    return attachment.mime_type.lower().startswith("audio/")


class VoiceNotes:
    """Transcribes the voice notes of a batch before its turn."""

    def __init__(self, ctx: SessionContext, transcriber: Transcriber | None) -> None:
        self.ctx = ctx
        self.transcriber = transcriber

    async def prepare(self, batch: list[InboxRow], target: Target) -> list[InboxRow]:
        """The batch with transcripts in its rows; rows left with nothing to answer are
        settled (dropped, their sender told why) and left out."""
        out: list[InboxRow] = []
        for row in batch:
            waiting = [a for a in row.attachments if is_audio(a) and a.transcript is None]
            if row.turn_id is not None or not waiting:
                out.append(row)
                continue
            kept = await self._row(row, target)
            if kept is not None:
                out.append(kept)
        return out

    async def steered(self, row_id: InboxId, text: str) -> str | None:
        """The text a steer message with files is injected as (`PrepareSteer`): its voice
        notes transcribed as before a turn, its other files named; None when it was settled
        instead (a voice note not heard and nothing else, or a /stop came first)."""
        row = await inbox_sql.Inbox(self.ctx.store).get(row_id)
        if row is None or row.status is Status.DONE:
            return None
        if any(is_audio(a) and a.transcript is None for a in row.attachments):
            target = Target(row.platform, row.account, row.chat_id, row.thread_id)
            kept = await self._row(row, target)
            if kept is None:
                return None
            row = kept
        return replace(row, text=text).content

    async def _row(self, row: InboxRow, target: Target) -> InboxRow | None:
        attachments: list[Attachment] = []
        failures: list[str] = []
        for a in row.attachments:
            if not is_audio(a) or a.transcript is not None:
                attachments.append(a)
                continue
            text, why = await self._transcribe(a)
            attachments.append(a if text is None else replace(a, transcript=text))
            if why is not None:
                failures.append(why)
        heard = any(a.transcript is not None for a in attachments)
        other = any(not is_audio(a) for a in attachments)
        rest = bool(row.text.strip()) or other or heard
        notices = [
            Chunk(f"voice:{row.id}:{i}", target, why, inbox_id=row.id)
            for i, why in enumerate(failures)
        ]
        async with self.ctx.store.write() as conn:
            if heard:
                await inbox_sql.set_attachments(conn, row, attachments)
            if notices:
                await enqueue(conn, notices)
            if not rest:
                await inbox_sql.settle(
                    conn, [row.id], Outcome.DROPPED, detail="voice note not transcribed"
                )
        if notices:
            self.ctx.on_outbox()
        if not rest:
            self.ctx.metrics.outcomes.labels(outcome=str(Outcome.DROPPED)).inc()
            return None
        return replace(row, attachments=tuple(attachments))

    async def _transcribe(self, a: Attachment) -> tuple[str | None, str | None]:
        """(transcript, None), or (None, what to tell the person)."""
        if self.transcriber is None:
            return None, NO_ENDPOINT
        name = a.filename or a.path.name
        try:
            path = a.path if self.ctx.files is None else await self.ctx.files.local(a)
        except (FileGone, FileStoreUnavailable) as err:
            logger.warning("voice note %s cannot be read: %s", name, err)
            return None, f"⚠ I couldn't read your voice note ({err}). Please send it again."
        try:
            text = await self.transcriber.transcribe(path, a.mime_type, name)
        except TranscriptionFailed as err:
            logger.warning("transcription of %s failed: %s", a.path, err)
            return None, f"⚠ I couldn't transcribe your voice note: {err}. Please type it instead."
        return text or "(nothing could be made out)", None
