"""The text references to received files that transcripts keep instead of their bytes."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gateway.contracts.messages import Attachment

_REF = re.compile(
    r"\[attached file: (?P<name>.*?) \((?P<mime>[^,()\s]+), (?P<size>\d+) bytes\) "
    r"saved at (?P<path>.+)\]$",
    re.MULTILINE,
)


@dataclass(frozen=True, slots=True)
class FileRef:
    """A file a message refers to."""

    name: str
    mime_type: str
    size: int
    path: Path

    @property
    def is_image(self) -> bool:
        """Whether the file is a picture."""
        return self.mime_type.lower().startswith("image/")


def reference(attachment: Attachment) -> str:
    """The line a message's text carries for `attachment` (what `file_refs` reads back)."""
    name = attachment.filename or attachment.path.name
    return (
        f"[attached file: {name} ({attachment.mime_type}, {attachment.size} bytes) "
        f"saved at {attachment.path}]"
    )


def file_refs(text: str) -> list[FileRef]:
    """The file references in `text`, in order."""
    return [
        FileRef(m["name"], m["mime"], int(m["size"]), Path(m["path"])) for m in _REF.finditer(text)
    ]
