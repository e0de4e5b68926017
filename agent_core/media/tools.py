"""`view_attachment` (show a picture the person sent earlier) and `send_file`."""

from __future__ import annotations

import asyncio
import mimetypes
import re
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from agent_core.media.images import Pictures, UnreadableImage
from agent_core.media.turn import Destination, OutgoingFile, SessionFiles, TurnMedia
from agent_core.media.vision import VisionSettings
from agent_core.tools.base import ToolContext, ToolError, str_arg
from gateway.contracts.errors import FileGone, FileStoreUnavailable, FileTooLarge
from gateway.contracts.history import ChatMessage, Role
from gateway.contracts.messages import Attachment

MAX_FILES_PER_TURN = 10
MAX_CONTENT_CHARS = 1_000_000
TEXT_PREVIEW = 4_000
"""Characters of a text file `view_attachment` shows."""


def _media(ctx: ToolContext) -> TurnMedia:
    if ctx.media is None or ctx.session is None:
        raise ToolError(
            "files can only be shown or sent in a chat conversation or a scheduled job's run"
        )
    return ctx.media


class ViewAttachmentTool:
    """Shows a file the person sent in this conversation again (a picture as an image)."""

    name = "view_attachment"
    description = (
        "Look at a file the person sent earlier in this conversation: a picture is shown to "
        "you again, a text file is read. Name it as its [attached file: ...] line does (the "
        "file name or the path after 'saved at')."
    )

    def __init__(
        self, files: SessionFiles, vision: VisionSettings, pictures: Pictures | None = None
    ) -> None:
        self.files = files
        self.vision = vision
        self.pictures = pictures or Pictures(vision.max_pixels, vision.max_decoded)

    @property
    def parameters(self) -> dict[str, Any]:
        """The argument schema."""
        return {
            "type": "object",
            "properties": {"file": {"type": "string", "description": "file name or path"}},
            "required": ["file"],
        }

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> str:
        """Queue the picture for the next model call, or return the text / a description."""
        media = _media(ctx)
        assert ctx.session is not None
        # `file` is the documented name; the names a model may guess are taken as well.
        key = next((k for k in ("file", "path", "name", "attachment") if k in args), "file")
        wanted = str_arg(args, key).strip()
        found = _find(await self.files.received(ctx.session), wanted)
        name = found.filename or found.path.name
        if found.transcript and not found.mime_type.lower().startswith("image/"):
            return f"{name} ({found.mime_type}, {found.size} bytes):\n{found.transcript}"
        if found.mime_type.lower().startswith("image/") and not self.vision.enabled:
            raise ToolError("this model cannot see pictures; tell the person so")
        path = await local_file(self.files, found)
        if found.mime_type.lower().startswith("image/"):
            try:
                url = await self.pictures.shown(path)
            except UnreadableImage as err:
                raise ToolError(f"{name} cannot be shown: {err}") from err
            media.shown.append(
                ChatMessage(
                    Role.USER, f"[picture {name}, shown again by view_attachment]", images=(url,)
                )
            )
            return f"{name} follows as a picture in the next message."
        if found.mime_type.startswith("text/"):
            text = await asyncio.to_thread(_head, path)
            return f"{name} ({found.mime_type}, {found.size} bytes):\n{text}"
        return f"{name} is a {found.mime_type} file of {found.size} bytes; it cannot be shown."


async def local_file(files: SessionFiles, found: Attachment) -> Path:
    """The real file of `found` on this instance; ToolError when it cannot be had."""
    name = found.filename or found.path.name
    try:
        return await files.local(found)
    except FileGone as err:
        raise ToolError(
            f"{name} is no longer kept (received files are pruned after a while)"
        ) from err
    except FileStoreUnavailable as err:
        raise ToolError(f"{name} cannot be read right now: {err}; try again later") from err


def _find(received: Sequence[Attachment], wanted: str) -> Attachment:
    for a in reversed(received):
        if wanted in (str(a.path), a.path.name, a.filename):
            return a
    names = ", ".join(dict.fromkeys(a.filename or a.path.name for a in received[-10:]))
    raise ToolError(
        f"no file {wanted!r} was sent in this conversation"
        + (f"; files here: {names}" if names else "")
    )


def _head(path: Path) -> str:
    with path.open("r", encoding="utf-8", errors="replace") as f:
        text = f.read(TEXT_PREVIEW + 1)
    return text if len(text) <= TEXT_PREVIEW else text[:TEXT_PREVIEW] + "\n[…cut]"


class FileTargets(Protocol):
    """Where `send_file` may send, and how large a file each place takes."""

    def max_bytes_here(self, ctx: ToolContext) -> int:
        """The largest file the chat of this turn takes. Raises ToolError (takes no files)."""
        ...

    async def resolve(self, target: str, ctx: ToolContext) -> Destination:
        """The chat `target` names, if this person may send files there.

        Raises ToolError: unknown or not allowed target, or a platform that takes no files.
        """
        ...


class SendFileTool:
    """Queues a file for the person: sent after the turn's reply, as its own outbox row."""

    name = "send_file"
    description = (
        "Send a file to the person in this chat (or to an allowed target): either a file from "
        "your working folder or one the person sent (`path`), or text you wrote (`content` "
        "with a `filename`). It is sent after your reply; in a scheduled job's run, to the "
        "chats its report goes to, after the report."
    )

    def __init__(
        self,
        targets: FileTargets,
        files: SessionFiles,
        *,
        roots: Sequence[Path],
        staging: Path,
    ) -> None:
        self.targets = targets
        self.files = files
        self.roots = [r.resolve() for r in roots]
        self.staging = staging

    @property
    def parameters(self) -> dict[str, Any]:
        """The argument schema."""
        return {
            "type": "object",
            "properties": {
                "path": {
                    "type": "string",
                    "description": "a file under "
                    + (", ".join(str(r) for r in self.roots) or "(no folder)")
                    + " (relative paths start in the first), or one the person sent",
                },
                "content": {"type": "string", "description": "text to send as a file"},
                "filename": {"type": "string", "description": "the name the person sees"},
                "caption": {"type": "string"},
                "target": {
                    "type": "string",
                    "description": "another allowed chat; default: this chat",
                },
            },
        }

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> str:
        """Check, copy to the outbox's files, and queue; ToolError when refused."""
        media = _media(ctx)
        if len(media.files) >= MAX_FILES_PER_TURN:
            raise ToolError(f"at most {MAX_FILES_PER_TURN} files can be sent in one turn")
        target = str_arg(args, "target", required=False).strip() or None
        caption = str_arg(args, "caption", required=False)
        path_arg = str_arg(args, "path", required=False).strip()
        content = args.get("content")
        filename = _display_name(str_arg(args, "filename", required=False))
        to = None if target is None else await self.targets.resolve(target, ctx)
        limits = self._limits(to, media, ctx)
        if content is not None:
            if path_arg:
                raise ToolError("give either `path` or `content`, not both")
            if not isinstance(content, str) or len(content) > MAX_CONTENT_CHARS:
                raise ToolError(f"`content` must be text of at most {MAX_CONTENT_CHARS} characters")
            if not filename:
                raise ToolError("`content` needs a `filename` (like notes.txt)")
            data = content.encode("utf-8")
            _check_size(len(data), limits)
            staged = await asyncio.to_thread(self._stage_bytes, data, filename)
        else:
            if not path_arg:
                raise ToolError("give `path` (a file) or `content` (text to send as a file)")
            source = await self._source(path_arg, ctx)
            filename = filename or _display_name(source.name)
            _check_size((await asyncio.to_thread(source.stat)).st_size, limits)
            staged = await asyncio.to_thread(self._stage_copy, source, filename)
        mime = mimetypes.guess_type(filename)[0] or "application/octet-stream"
        try:
            kept = await self.files.keep(staged, filename, mime)
        except FileTooLarge as err:
            raise ToolError(f"{err}; send a smaller file (compress or split it)") from err
        except FileStoreUnavailable as err:
            raise ToolError(f"the file cannot be stored right now: {err}") from err
        finally:
            await asyncio.to_thread(staged.unlink, True)
        size = kept.size
        media.files.append(OutgoingFile(kept, caption, to))
        if to is None and media.report_to is not None:
            chats = ", ".join(_chat(d) for d in media.report_to if d.max_bytes >= size)
            return f"{filename} ({size} bytes) will be sent after your report, to {chats}."
        return (
            f"{filename} ({size} bytes) will be sent to {target or 'this chat'} after your reply."
        )

    def _limits(
        self, to: Destination | None, media: TurnMedia, ctx: ToolContext
    ) -> list[tuple[str, int]]:
        """(platform, largest file it takes) of each chat the file is to go to."""
        if to is not None:
            return [(to.platform, to.max_bytes)]
        if media.report_to is None:  # the chat of the turn
            assert ctx.session is not None
            platform = str(ctx.session.key).partition(":")[0]
            return [(platform, self.targets.max_bytes_here(ctx))]
        if not media.report_to:
            raise ToolError(
                "this scheduled job has no chat to report to (no home channel and no "
                "usable target), so no file can be sent"
            )
        carrying = [(d.platform, d.max_bytes) for d in media.report_to if d.max_bytes]
        if not carrying:
            places = ", ".join(_chat(d) for d in media.report_to)
            raise ToolError(f"the chats this job reports to ({places}) take no files from Herald")
        return carrying

    async def _source(self, path_arg: str, ctx: ToolContext) -> Path:
        """The file `path_arg` names, if it may be sent: under a root, or received here."""
        assert ctx.session is not None
        found = await asyncio.to_thread(self._under_root, path_arg)
        if found is not None:
            return found
        received = next(
            (
                a
                for a in reversed(await self.files.received(ctx.session))
                if path_arg in (str(a.path), a.path.name, a.filename)
            ),
            None,
        )
        if received is not None:
            return await local_file(self.files, received)
        raise ToolError(
            f"{path_arg!r} is not a file I may send: send files from "
            + (", ".join(str(r) for r in self.roots) or "(no folder)")
            + " or files the person sent in this conversation"
        )

    def _under_root(self, path_arg: str) -> Path | None:
        """A file under a root (symlinks and `..` resolved first), or None. Blocking."""
        given = Path(path_arg).expanduser()
        candidates = [given] if given.is_absolute() else [r / given for r in self.roots]
        for candidate in candidates:
            resolved = candidate.resolve()
            if any(resolved.is_relative_to(r) for r in self.roots) and resolved.is_file():
                return resolved
        return None

    def _stage_bytes(self, data: bytes, filename: str) -> Path:
        path = self._staged(filename)
        path.write_bytes(data)
        return path

    def _stage_copy(self, source: Path, filename: str) -> Path:
        path = self._staged(filename)
        shutil.copyfile(source, path)
        return path

    def _staged(self, filename: str) -> Path:
        self.staging.mkdir(parents=True, exist_ok=True, mode=0o700)
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", filename).lstrip(".")[:100] or "file"
        return self.staging / f"{uuid.uuid4().hex}-{safe}"


def _display_name(name: str) -> str:
    """The last part of a name, without control characters (never used as a path)."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    return "".join(c for c in base if c.isprintable()).strip()[:200]


def _chat(to: Destination) -> str:
    return ":".join(p for p in (to.platform, to.chat_id, to.thread_id) if p)


def _check_size(size: int, limits: Sequence[tuple[str, int]]) -> None:
    """Raise ToolError naming the first platform whose limit `size` exceeds."""
    for platform, limit in limits:
        if size > limit:
            raise ToolError(
                f"the file is {size} bytes; {platform} takes files of at most {limit} bytes. "
                "Send a smaller file (compress or split it) or a link instead."
            )
