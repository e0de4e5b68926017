"""Media: pictures shown to the model, voice notes transcribed, files sent back.

The gateway stores what arrives (`Attachment`s of inbox rows); the transcript keeps a text
reference to each file (`[attached file: NAME (MIME, SIZE bytes) saved at PATH]`), never the
bytes. This package turns references of the current turn into image parts
(`vision.Vision`), transcribes audio (`transcribe`), and gives the model `view_attachment`
and `send_file` (`tools`).
"""

from agent_core.media.refs import FileRef, file_refs
from agent_core.media.turn import Destination, OutgoingFile, SessionFiles, TurnMedia
from agent_core.media.vision import Vision, VisionSettings

__all__ = [
    "Destination",
    "FileRef",
    "OutgoingFile",
    "SessionFiles",
    "TurnMedia",
    "Vision",
    "VisionSettings",
    "file_refs",
]
