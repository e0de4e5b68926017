"""Files in and out, on the gateway's side: the files a session received (for the agent's
media tools), where `send_file` may send, signed media links, and pruning old files.

File bytes live in the blob store (`gateway/blobs.py`: the database or an S3 bucket), named
by their SHA-256 in each attachment (`Attachment.blob`); an attachment's `path` is where an
instance caches them, and any instance materialises them into its own `state_dir/cache`
(hash checked) when a real file is needed: vision, transcription, an adapter's upload.
Adapters download received files under `state_dir/files/<platform>/<account>/` (scratch);
when a message is accepted, each file goes into the blob store (`StoredFiles.keep_received`).
A session's files are those its own inbound rows carry, and the pictures it was sent over
the HTTP API (`session_files`): a path typed into a message never reaches another person's
file. Files the agent sends are staged under `state_dir/files/outbox/` and kept in the blob
store before their outbox row is written; everything is pruned after
`files.retention_days`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import quote, urlsplit

from pydantic import SecretStr

from agent_core.config import LLMConfig
from agent_core.media import Destination, OutgoingFile, Vision, VisionSettings
from agent_core.media.images import Pictures
from agent_core.media.speech import OpenAISynthesizer, Synthesizer
from agent_core.media.tools import SendFileTool, ViewAttachmentTool
from agent_core.media.transcribe import OpenAITranscriber, Transcriber
from agent_core.tools.base import ToolContext, ToolError
from gateway.blobs import Blobs, DatabaseBlobs, is_key
from gateway.channels import Channels
from gateway.config import HeraldConfig
from gateway.contracts.errors import FileGone, FileStoreUnavailable, FileTooLarge
from gateway.contracts.history import SessionInfo
from gateway.contracts.ids import (
    AccountId,
    ChatId,
    InboxId,
    SessionId,
    ThreadId,
    TurnId,
)
from gateway.contracts.messages import Attachment, InboundMessage, TextFormat
from gateway.store import Store
from gateway.store.blobs import BlobRecords
from gateway.store.inbox import Inbox
from gateway.store.outbox import Chunk, OutboxKind, Target
from gateway.tools.places import Places

logger = logging.getLogger(__name__)

RECEIVED_LOOKBACK = 500
"""Inbound messages of a session searched for its files (the newest)."""


def database_blobs(store: Store, config: HeraldConfig) -> Blobs:
    """The blob store in the database (`files.store: database`), caching under
    `state_dir/cache/files`."""
    records = BlobRecords(store)
    return Blobs(
        records,
        DatabaseBlobs(records),
        config.state_dir / "cache" / "files",
        max_bytes=config.files.max_file_bytes,
    )


class StoredFiles:
    """`SessionFiles` from the inbox, `session_files` and the blob store: only rows of the
    session's own key count, so a path typed into a message never reaches another person's
    file; bytes come from the blob store into this instance's cache."""

    def __init__(self, inbox: Inbox, blobs: Blobs) -> None:
        self.inbox = inbox
        self.blobs = blobs

    async def received(self, session: SessionInfo) -> Sequence[Attachment]:
        """The attachments of the session's inbound messages, oldest first, then the files
        it was sent otherwise (pictures over the HTTP API)."""
        # Not those another profile answered (the chat was bound to it then): one profile
        # never reads another's conversation, its files included.
        rows = await self.inbox.for_session(
            session.key, limit=RECEIVED_LOOKBACK, profile=session.profile
        )
        stored = [a for r in rows for a in r.attachments]
        more = await self.blobs.records.session_files(session.key, RECEIVED_LOOKBACK)
        return [*stored, *more]

    async def local(self, attachment: Attachment) -> Path:
        """See `SessionFiles.local`; a file from before the blob store is used where it is."""
        if attachment.blob is None:
            if await asyncio.to_thread(attachment.path.is_file):
                return attachment.path
            raise FileGone("the file is no longer kept")
        return await self.blobs.local(attachment.blob, attachment.filename or attachment.path.name)

    async def keep(self, path: Path, filename: str, mime_type: str) -> Attachment:
        """See `SessionFiles.keep`."""
        key, size, cached = await self.blobs.adopt(path, mime_type, filename or path.name)
        return Attachment(cached, mime_type, size, filename, blob=key)

    async def stored(self, attachment: Attachment) -> Attachment:
        """`attachment` with its bytes in the blob store (a file from before it is put now).
        Raises FileGone, FileTooLarge, FileStoreUnavailable."""
        if attachment.blob is not None:
            return attachment
        try:
            key, size = await self.blobs.put(attachment.path, attachment.mime_type)
        except OSError as err:
            raise FileGone("the file is no longer kept") from err
        return replace(attachment, blob=key, size=size)

    async def keep_received(self, message: InboundMessage) -> InboundMessage:
        """`message` with each downloaded file kept in the blob store (the download moved to
        the cache); a file that cannot be kept becomes a note in the text saying why."""
        kept: list[Attachment] = []
        notes: list[str] = []
        for a in message.attachments:
            name = a.filename or a.path.name
            if a.blob is not None:
                kept.append(a)
                continue
            try:
                kept.append(await self.keep(a.path, a.filename, a.mime_type))
            except FileTooLarge as err:
                notes.append(f"[file {name} not kept: {err}]")
            except (FileStoreUnavailable, OSError) as err:
                logger.warning("files: cannot keep %s: %s", name, err)
                notes.append(
                    f"[file {name} unavailable: the file store failed ({err}); ask the "
                    "person to send it again]"
                )
            with contextlib.suppress(OSError):
                await asyncio.to_thread(a.path.unlink, True)
        if not notes and len(kept) == len(message.attachments):
            return replace(message, attachments=tuple(kept))
        text = "\n".join([message.text, *notes]) if message.text else "\n".join(notes)
        return replace(message, attachments=tuple(kept), text=text)


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
"""Where the media-link key was kept before it moved to SQL (read once, by `MediaLinks.open`
and `import_files`)."""
LINK_KEY = "files.link_key"
"""The `settings` row holding the media-link key (hex), shared by every instance."""


@dataclass(frozen=True, slots=True)
class Checked:
    """What `MediaLinks.check` found: the blob and its name, or why the link is refused."""

    blob: str | None
    name: str = ""
    status: int = 200
    reason: str = ""


class MediaLinks:
    """Signed, expiring URLs for files in the blob store (`FileLinks`): HMAC-SHA256 with a
    key kept in the database, so every instance signs and verifies alike, and any of them
    serves the file."""

    PREFIX = "/files"

    def __init__(self, key: bytes, ttl: float) -> None:
        self.ttl = ttl
        self._key = key

    @classmethod
    async def open(cls, store: Store, ttl: float, legacy: Path | None = None) -> MediaLinks:
        """The links signed with the database's key: made once (the key of an older
        install's `legacy` file when there is one), then shared by every instance."""
        key = await link_key(store, legacy)
        return cls(key, ttl)

    def link(self, attachment: Attachment, base_url: str) -> str:
        """See `FileLinks.link`: `<base_url>/files/<expires>/<signature>/<blob>/<name>`."""
        if attachment.blob is None or not is_key(attachment.blob):
            raise ValueError("only files in the blob store can be linked")
        name = _link_name(attachment.filename or attachment.path.name)
        relative = f"{attachment.blob}/{name}"
        expires = int(time.time() + self.ttl)
        signature = self._sign(expires, relative)
        return f"{base_url.rstrip('/')}{self.PREFIX}/{expires}/{signature}/{quote(relative)}"

    def check(
        self, expires: str, signature: str, relative: str, now: float | None = None
    ) -> Checked:
        """The blob a link names, or 403 (forged: bad signature) / 410 (expired) / 404 (not a
        file's link)."""
        if not expires.isdigit() or not hmac.compare_digest(
            self._sign(int(expires), relative), signature
        ):
            return Checked(None, status=403, reason="bad signature")
        if int(expires) < (time.time() if now is None else now):
            return Checked(None, status=410, reason="link expired")
        blob, _, name = relative.partition("/")
        if not is_key(blob) or not name:
            return Checked(None, status=404, reason="no such file")
        return Checked(blob, name)

    def _sign(self, expires: int, relative: str) -> str:
        mac = hmac.new(self._key, f"{expires}:{relative}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).decode("ascii").rstrip("=")


def _link_name(name: str) -> str:
    """The name a link shows (no separators, printable)."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    return "".join(c for c in base if c.isprintable()).strip()[:150] or "file"


async def link_key(store: Store, legacy: Path | None = None) -> bytes:
    """The media-link key in `settings`, set when missing: the key in the `legacy` file of
    an older install (so links it signed stay valid), else a new random one. Every
    instance reads the same key back."""
    found = await store.get_setting(LINK_KEY)
    if found is None:
        old = None if legacy is None else await asyncio.to_thread(_read_key, legacy)
        found = await BlobRecords(store).setting_once(
            LINK_KEY, (old or secrets.token_bytes(32)).hex()
        )
    return bytes.fromhex(found)


def _read_key(path: Path) -> bytes | None:
    """The key in an older install's key file, or None. Blocking."""
    try:
        return bytes.fromhex(path.read_text(encoding="ascii").strip()) or None
    except (OSError, ValueError):
        return None


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


async def prune_forever(
    blobs: Blobs, scratch: Sequence[Path], retention_days: float, interval: float = 3600.0
) -> None:
    """Prune the blob store and the local `scratch` folders (downloads, staging, the cache)
    now and every `interval` seconds until cancelled."""
    max_age = retention_days * 86400
    while True:
        try:
            removed = await blobs.prune(max_age)
            for root in scratch:
                removed += await asyncio.to_thread(prune_files, root, max_age)
        except Exception as err:  # the store away, a disk error: try again next time
            logger.warning("files: pruning failed (tried again in %gs): %s", interval, err)
        else:
            if removed:
                logger.info("files: pruned %d file(s) older than %g days", removed, retention_days)
        await asyncio.sleep(interval)


async def blob_response_body(blobs: Blobs, key: str) -> AsyncGenerator[bytes, None]:
    """The bytes of `key`, its first chunk already fetched (so a missing file or a failing
    store is known before a response starts). Raises FileGone, FileStoreUnavailable."""
    chunks = blobs.read(key)
    first = await anext(chunks, b"")

    async def body() -> AsyncGenerator[bytes, None]:
        try:
            yield first
            async for block in chunks:
                yield block
        finally:
            await chunks.aclose()

    return body()


@dataclass(frozen=True, slots=True)
class MediaParts:
    """What the agent gets for pictures, voice notes and files, built from config."""

    tools: tuple[ViewAttachmentTool, SendFileTool]
    vision: Vision
    transcriber: Transcriber | None
    files: StoredFiles


def media_parts(
    config: HeraldConfig,
    store: Store,
    channels: Channels,
    resolve: TargetResolver = no_other_targets,
    blobs: Blobs | None = None,
    *,
    llm: LLMConfig | None = None,
) -> MediaParts:
    """The media tools, the vision step and the transcriber (close it: `aclose`), over
    `blobs` (default: the database's blob store), for the model `llm` (a profile's; default
    `config.llm`): its `vision` and `transcription` keys."""
    llm = config.llm if llm is None else llm
    settings = VisionSettings(
        llm.vision, llm.image_max_pixels, llm.max_images_per_turn, config.media.max_image_pixels
    )
    pictures = Pictures(settings.max_pixels, settings.max_decoded)  # one decoding at a time
    files = StoredFiles(Inbox(store), blobs or database_blobs(store, config))
    send = SendFileTool(
        ChatFileTargets(channels, resolve),
        files,
        roots=[config.state_dir / "workspace", *config.files.send_dirs],
        staging=config.state_dir / "files" / "outbox",
    )
    transcription = llm.transcription
    if transcription.api_key is None and transcription.base_url is not None:
        key = model_key_for(llm, transcription.base_url)
        transcription = transcription.model_copy(update={"api_key": key})
    transcriber = OpenAITranscriber(transcription) if transcription.enabled else None
    return MediaParts(
        (ViewAttachmentTool(files, settings, pictures), send),
        Vision(settings, files, pictures),
        transcriber,
        files,
    )


OPENAI_BASE_URL = "https://api.openai.com/v1"
"""Where the `openai` SDK goes without a `base_url`."""


def model_key_for(llm: LLMConfig, base_url: str) -> SecretStr | None:
    """`llm.api_key` for an endpoint on the model's own server (same scheme, host and port as
    `llm.base_url`, or OpenAI's without one), else None: the model's key is never sent to
    another host; a transcription or speech endpoint elsewhere needs its own `api_key`."""
    if llm.api_key is None:
        return None
    return llm.api_key if _origin(base_url) == _origin(llm.base_url or OPENAI_BASE_URL) else None


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or {"http": 80, "https": 443}.get(scheme)
    return scheme, (parts.hostname or "").lower(), port


def synthesizer(config: HeraldConfig) -> Synthesizer | None:
    """What speaks voice replies (`speech`, its key defaulting to `llm.api_key` when on the
    model's server: `model_key_for`; close it: `aclose`), or None without an endpoint."""
    speech = config.speech
    if speech.base_url is None:
        return None
    if speech.api_key is None:
        speech = speech.model_copy(update={"api_key": model_key_for(config.llm, speech.base_url)})
    return OpenAISynthesizer(speech)


def pictures_of(vision: Vision | None) -> Pictures | None:
    """The picture decoder the agent's vision step uses (None without one): the HTTP API
    decodes through it too, so the process decodes one picture at a time."""
    return None if vision is None else vision.pictures
