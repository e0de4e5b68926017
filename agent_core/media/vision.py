"""Pictures of the current turn as image parts of its user messages (or a note saying the
model cannot see them)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

from agent_core.media.images import Pictures, UnreadableImage
from agent_core.media.refs import FileRef, file_refs
from agent_core.media.turn import SessionFiles
from gateway.contracts.errors import FileGone, FileStoreUnavailable
from gateway.contracts.history import ChatMessage, Role, SessionInfo
from gateway.contracts.messages import Attachment

logger = logging.getLogger(__name__)

BLIND_NOTE = (
    "[A picture arrived with this message, but you cannot see pictures (this model has no "
    "vision). Tell the person you cannot see it, and ask them to describe it if it matters.]"
)


@dataclass(frozen=True, slots=True)
class VisionSettings:
    """`llm.vision`, `llm.image_max_pixels`, `llm.max_images_per_turn`,
    `media.max_image_pixels`."""

    enabled: bool = False
    max_pixels: int = 1_500_000
    max_per_turn: int = 4
    max_decoded: int = 32_000_000
    """Larger pictures are not decoded (`image_data_url`)."""


class Vision:
    """Shows the pictures a person just sent: only files stored for this session. Decodes
    through `pictures` (default: its own, from `settings`)."""

    def __init__(
        self, settings: VisionSettings, files: SessionFiles, pictures: Pictures | None = None
    ) -> None:
        self.settings = settings
        self.files = files
        self.pictures = pictures or Pictures(settings.max_pixels, settings.max_decoded)

    async def show(self, session: SessionInfo, context: list[ChatMessage]) -> list[ChatMessage]:
        """`context` with the pictures of its last user messages (those after the last answer)
        as image parts; unchanged when none refers to a picture."""
        start = len(context)
        while start > 0 and context[start - 1].role is Role.USER:
            start -= 1
        current = context[start:]
        if not any(r.is_image for m in current for r in file_refs(m.content)):
            return context
        received = {a.path: a for a in await self.files.received(session)}
        budget = self.settings.max_per_turn
        out = list(context[:start])
        for message in current:
            refs = [r for r in file_refs(message.content) if r.is_image and r.path in received]
            if not refs:
                out.append(message)
                continue
            if not self.settings.enabled:
                out.append(replace(message, content=f"{message.content}\n{BLIND_NOTE}"))
                continue
            images, notes = await self._load([(r, received[r.path]) for r in refs], budget)
            budget -= len(images)
            content = "\n".join([message.content, *notes])
            out.append(replace(message, content=content, images=tuple(images)))
        return out

    async def _load(
        self, refs: Sequence[tuple[FileRef, Attachment]], budget: int
    ) -> tuple[list[str], list[str]]:
        """Data URLs of up to `budget` pictures, and a note for each one not shown."""
        images: list[str] = []
        notes: list[str] = []
        for ref, attachment in refs:
            if len(images) >= budget:
                notes.append(
                    f"[picture {ref.name} not shown: more than "
                    f"{self.settings.max_per_turn} pictures this turn; view it with "
                    "view_attachment if it matters]"
                )
                continue
            try:
                url = await self.pictures.shown(await self.files.local(attachment))
            except (FileGone, FileStoreUnavailable) as err:
                notes.append(f"[picture {ref.name} not shown: {err}]")
                continue
            except UnreadableImage as err:
                notes.append(f"[picture {ref.name} ({ref.mime_type}) not shown: {err}]")
                continue
            images.append(url)
        return images, notes
