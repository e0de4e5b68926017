"""Files in and out, on the gateway's side: the files a session received (for the agent's
media tools), where `send_file` may send, signed media links, and pruning old files.

Adapters download received files under `state_dir/files/<platform>/<account>/<chat>/`; when
a message is accepted, its files move to its session's own folder,
`state_dir/files/sessions/<folder>/` (`session_dir`: a name made from the session key, never
from a platform's file name), so people sharing a group chat with a session each keep their
files apart. Files of older rows stay where they were stored: lookups go through each row's
stored path. Files the agent sends are staged under `state_dir/files/outbox/`; everything is
pruned after `files.retention_days`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import logging
import mimetypes
import os
import re
import secrets
import shutil
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import quote

from agent_core.media import Destination, OutgoingFile, Vision, VisionSettings
from agent_core.media.images import Pictures
from agent_core.media.tools import SendFileTool, ViewAttachmentTool
from agent_core.media.transcribe import OpenAITranscriber, Transcriber
from agent_core.tools.base import ToolContext, ToolError
from gateway.channels import Channels
from gateway.config import HeraldConfig
from gateway.contracts.history import SessionInfo
from gateway.contracts.ids import (
    AccountId,
    ChatId,
    InboxId,
    SessionId,
    SessionKey,
    ThreadId,
    TurnId,
)
from gateway.contracts.messages import Attachment, TextFormat
from gateway.store import Store
from gateway.store.inbox import Inbox
from gateway.store.outbox import Chunk, OutboxKind, Target
from gateway.tools.places import Places

logger = logging.getLogger(__name__)

SESSIONS = "sessions"
"""The folder under `state_dir/files` with one folder per session."""


def session_dir(files_root: Path, key: SessionKey | str) -> Path:
    """The folder of the session `key`'s received files: `<files_root>/sessions/<name>`, the
    name a readable, filesystem-safe part of the key and a digest of all of it (two keys
    never share a folder, whatever characters they hold)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", str(key)).strip("._-")[:60] or "session"
    digest = hashlib.sha256(str(key).encode()).hexdigest()[:16]
    return files_root / SESSIONS / f"{slug}-{digest}"


def adopt_files(
    attachments: Sequence[Attachment], files_root: Path, key: SessionKey
) -> tuple[Attachment, ...]:
    """`attachments` as kept in the session's folder: each file under `files_root` is linked
    (or copied) there under its stored, already safe, name. The originals stay until
    `drop_originals` (the message may be a duplicate whose stored row names them). Blocking."""
    root = files_root.resolve()
    folder = session_dir(files_root, key)
    out: list[Attachment] = []
    for a in attachments:
        source = a.path.resolve()
        if not source.is_relative_to(root) or source.is_relative_to(folder.resolve()):
            out.append(a)
            continue
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", source.name).lstrip(".")[:150] or "file"
        kept = folder / name
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            part = kept.with_name(f"{kept.name}.{secrets.token_hex(4)}.part")
            try:
                os.link(source, part)
            except OSError:
                shutil.copy2(source, part)
            part.replace(kept)
        except OSError as err:
            logger.warning("files: cannot keep %s in its session folder: %s", source, err)
            out.append(a)
            continue
        out.append(replace(a, path=kept))
    return tuple(out)


def drop_originals(before: Sequence[Attachment], after: Sequence[Attachment]) -> None:
    """Delete the download of each file `adopt_files` kept elsewhere. Blocking."""
    for old, new in zip(before, after, strict=True):
        if old.path != new.path:
            with contextlib.suppress(OSError):
                old.path.unlink()


RECEIVED_LOOKBACK = 500
"""Inbound messages of a session searched for its files (the newest)."""


class StoredFiles:
    """`SessionFiles` from the inbox and the session's own folder: only rows of the
    session's own key and files in the folder made from that key count, so a path typed into
    a message never reaches another person's file."""

    def __init__(self, inbox: Inbox, files_root: Path | None = None) -> None:
        self.inbox = inbox
        self.files_root = files_root

    async def received(self, session: SessionInfo) -> Sequence[Attachment]:
        """The attachments of the session's inbound messages, oldest first, then the files in
        its folder no message names (pictures sent over the HTTP API)."""
        rows = await self.inbox.for_session(session.key, limit=RECEIVED_LOOKBACK)
        stored = [a for r in rows for a in r.attachments]
        if self.files_root is None:
            return stored
        folder = session_dir(self.files_root, session.key)
        known = {a.path for a in stored}
        more = await asyncio.to_thread(_folder_files, folder, known)
        return [*stored, *more]


def _folder_files(folder: Path, known: set[Path]) -> list[Attachment]:
    """The files in `folder` not in `known`, oldest first, typed by their name. Blocking."""
    try:
        entries = [(e.stat().st_mtime, Path(e.path)) for e in os.scandir(folder) if e.is_file()]
    except OSError:  # no folder (yet, or pruned)
        return []
    out: list[Attachment] = []
    for _, path in sorted(entries)[-RECEIVED_LOOKBACK:]:
        if path in known or path.name.endswith(".part"):
            continue
        mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        with contextlib.suppress(OSError):
            out.append(Attachment(path, mime, path.stat().st_size, path.name))
    return out


TargetResolver = Callable[[str, ToolContext], Awaitable[Destination]]
"""Turns a `send_file` target into a chat this person may send files to, or raises
ToolError: `send_message`'s rules (`gateway/tools/places.py`, `file_destination`)."""


def file_destination(places: Places) -> TargetResolver:
    """The resolver of `send_file` targets by `send_message`'s rules: this chat for everyone,
    other chats for operators among `tools.send_message.targets`; one chat per file."""

    async def resolve(target: str, ctx: ToolContext) -> Destination:
        chats = await places.resolve(target, ctx)
        if len(chats) != 1:
            raise ToolError(f"{target!r} names {len(chats)} chats; a file goes to one chat")
        to = chats[0]
        return Destination(to.platform, to.account, to.chat_id, to.thread_id)

    return resolve


async def no_other_targets(target: str, ctx: ToolContext) -> Destination:
    """The default resolver: files go only to the chat of the turn."""
    raise ToolError(
        f"sending files to {target!r} is not allowed here; leave `target` out to send the "
        "file to this chat"
    )


class ChatFileTargets:
    """`FileTargets`: this chat by its platform's file limit, other chats by `resolve`."""

    def __init__(self, channels: Channels, resolve: TargetResolver = no_other_targets) -> None:
        self.channels = channels
        self._resolve = resolve

    def max_bytes_here(self, ctx: ToolContext) -> int:
        """See `FileTargets.max_bytes_here`."""
        if ctx.session is None:
            raise ToolError("there is no chat to send a file to here")
        platform, _, rest = str(ctx.session.key).partition(":")
        account = rest.partition(":")[0]
        if not self.channels.known(platform, account):
            raise ToolError(f"files cannot be sent on {platform}")
        limit = self.channels.limits(platform, account).max_file_bytes
        if not limit:
            raise ToolError(f"{platform} cannot carry files from Herald")
        return limit

    async def resolve(self, target: str, ctx: ToolContext) -> Destination:
        """See `FileTargets.resolve`."""
        to = await self._resolve(target, ctx)
        limit = self.channels.limits(to.platform, to.account).max_file_bytes
        if not limit:
            raise ToolError(f"{to.platform} cannot carry files from Herald")
        return Destination(to.platform, to.account, to.chat_id, to.thread_id, limit)


def file_chunks(
    target: Target,
    files: Sequence[OutgoingFile],
    *,
    session_id: SessionId,
    turn_id: TurnId,
    inbox_id: InboxId | None = None,
    first_index: int = 0,
) -> list[Chunk]:
    """The files a turn's tools queued, after its reply chunks: one row each, keyed by
    (session, turn, file index), so a retry never sends one twice nor the text again."""
    return [
        Chunk(
            key=f"s{session_id}:t{turn_id}:f{i}",
            target=target
            if f.to is None
            else Target(
                f.to.platform,
                AccountId(f.to.account),
                ChatId(f.to.chat_id),
                None if f.to.thread_id is None else ThreadId(f.to.thread_id),
            ),
            text=f.caption,
            kind=OutboxKind.REPLY if f.to is None else OutboxKind.SEND,
            format=TextFormat.PLAIN,
            chunk_index=first_index + i,
            session_id=session_id,
            turn_id=turn_id,
            inbox_id=inbox_id,
            attachment=f.attachment,
        )
        for i, f in enumerate(files)
    ]


KEY_FILE = "media-links.key"


@dataclass(frozen=True, slots=True)
class Checked:
    """What `MediaLinks.check` found: the file, or why the link is refused."""

    path: Path | None
    status: int = 200
    reason: str = ""


class MediaLinks:
    """Signed, expiring URLs for files under `state_dir/files` (`FileLinks`): HMAC-SHA256
    with a secret kept in the state directory, so every instance sharing it signs alike."""

    PREFIX = "/files"

    def __init__(self, state_dir: Path, ttl: float) -> None:
        self.root = (state_dir / "files").resolve()
        self.ttl = ttl
        self._key = _load_key(state_dir / KEY_FILE)

    def link(self, path: Path, base_url: str) -> str:
        """See `FileLinks.link`: `<base_url>/files/<expires>/<signature>/<path>`."""
        relative = path.resolve().relative_to(self.root).as_posix()  # ValueError outside
        expires = int(time.time() + self.ttl)
        signature = self._sign(expires, relative)
        return f"{base_url.rstrip('/')}{self.PREFIX}/{expires}/{signature}/{quote(relative)}"

    def check(
        self, expires: str, signature: str, relative: str, now: float | None = None
    ) -> Checked:
        """The file a link names, or 403 (forged: bad signature, outside the files) / 410
        (expired) / 404 (gone)."""
        if not expires.isdigit() or not hmac.compare_digest(
            self._sign(int(expires), relative), signature
        ):
            return Checked(None, 403, "bad signature")
        if int(expires) < (time.time() if now is None else now):
            return Checked(None, 410, "link expired")
        path = (self.root / relative).resolve()
        if not path.is_relative_to(self.root):
            return Checked(None, 403, "outside the files")
        if not path.is_file():
            return Checked(None, 404, "no such file (pruned?)")
        return Checked(path)

    def _sign(self, expires: int, relative: str) -> str:
        mac = hmac.new(self._key, f"{expires}:{relative}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).decode("ascii").rstrip("=")


def _load_key(path: Path) -> bytes:
    """The secret in `path`, made (0600) when missing."""
    try:
        return bytes.fromhex(path.read_text(encoding="ascii").strip())
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another instance made it just now
        return bytes.fromhex(path.read_text(encoding="ascii").strip())
    key = secrets.token_bytes(32)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(key.hex())
    return key


def prune_files(root: Path, max_age: float, now: float | None = None) -> int:
    """Delete files under `root` older than `max_age` seconds and the folders left empty;
    the number deleted. Blocking."""
    cutoff = (time.time() if now is None else now) - max_age
    removed = 0
    if not root.is_dir():
        return 0
    for folder, dirs, names in os.walk(root, topdown=False):
        for name in names:
            path = Path(folder) / name
            try:
                if path.lstat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
            except OSError as err:
                logger.warning("files: cannot prune %s: %s", path, err.strerror)
        for name in dirs:
            with contextlib.suppress(OSError):  # not empty
                (Path(folder) / name).rmdir()
    return removed


async def prune_forever(root: Path, retention_days: float, interval: float = 3600.0) -> None:
    """Prune `root` now and every `interval` seconds until cancelled."""
    while True:
        removed = await asyncio.to_thread(prune_files, root, retention_days * 86400)
        if removed:
            logger.info("files: pruned %d file(s) older than %g days", removed, retention_days)
        await asyncio.sleep(interval)


@dataclass(frozen=True, slots=True)
class MediaParts:
    """What the agent gets for pictures, voice notes and files, built from config."""

    tools: tuple[ViewAttachmentTool, SendFileTool]
    vision: Vision
    transcriber: Transcriber | None


def media_parts(
    config: HeraldConfig,
    store: Store,
    channels: Channels,
    resolve: TargetResolver = no_other_targets,
) -> MediaParts:
    """The media tools, the vision step and the transcriber (close it: `aclose`)."""
    llm = config.llm
    settings = VisionSettings(
        llm.vision, llm.image_max_pixels, llm.max_images_per_turn, config.media.max_image_pixels
    )
    pictures = Pictures(settings.max_pixels, settings.max_decoded)  # one decoding at a time
    files = StoredFiles(Inbox(store), config.state_dir / "files")
    send = SendFileTool(
        ChatFileTargets(channels, resolve),
        files,
        roots=[config.state_dir / "workspace", *config.files.send_dirs],
        staging=config.state_dir / "files" / "outbox",
    )
    transcription = llm.transcription
    if transcription.api_key is None and llm.api_key is not None:
        transcription = transcription.model_copy(update={"api_key": llm.api_key})
    transcriber = OpenAITranscriber(transcription) if transcription.enabled else None
    return MediaParts(
        (ViewAttachmentTool(files, settings, pictures), send),
        Vision(settings, files, pictures),
        transcriber,
    )


def pictures_of(vision: Vision | None) -> Pictures | None:
    """The picture decoder the agent's vision step uses (None without one): the HTTP API
    decodes through it too, so the process decodes one picture at a time."""
    return None if vision is None else vision.pictures
