"""The Matrix connection: a matrix-nio `AsyncClient`, the `/sync` loop, and sending.

Receiving is a `/sync` long poll whose `since` token is stored (in the account's checkpoints)
only after every event of the batch it ends is in the inbox: a process that dies before that
reads the same batch again, and the inbox's UNIQUE event key answers each event once. A batch
whose timeline for a room was cut short (`limited`) has its gap read first through
`/messages`, from the stored token onwards, so nothing sent while Herald was away is skipped.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote, urlsplit

import aiohttp
from nio import (
    AsyncClient,
    AsyncClientConfig,
    ErrorResponse,
    MessageDirection,
    RoomMessagesError,
    SyncError,
    SyncResponse,
    UploadResponse,
    WhoamiResponse,
)

from adapters.files import download, keep, may_fetch, with_files
from adapters.inbound import Incoming, Skipped, log_skipped
from adapters.inflight import InFlight, TrackedSends
from adapters.matrix import PLATFORM
from adapters.matrix.config import Invites, MatrixConfig
from adapters.matrix.convert import (
    E2E_REFUSAL,
    MAX_EVENT_BYTES,
    NOT_ADDRESSED,
    Me,
    MediaRef,
    RoomView,
    edit_content,
    edited_event,
    error_from,
    inviter_of,
    ogg_duration_ms,
    reaction_from,
    reaction_of,
    relate,
    split_event_key,
    text_content,
    to_inbound,
    voice_content,
    with_buttons,
    within_event_limit,
)
from gateway.contracts.adapter import AdapterState, Checkpoints, InboundSink, ReactionSink
from gateway.contracts.errors import (
    AuthError,
    HeraldError,
    NotReady,
    PermanentSendError,
    RateLimited,
)
from gateway.contracts.ids import (
    AccountId,
    ChatId,
    ExternalUserId,
    Platform,
    PlatformMessageId,
    ThreadId,
)
from gateway.contracts.messages import (
    Attachment,
    DeliveryReceipt,
    InboundMessage,
    OutboundMessage,
    Sender,
    SendLimits,
    TextFormat,
    utcnow,
)

logger = logging.getLogger(__name__)

SINCE = "since"
"""The checkpoint of the last `/sync` batch whose events are all in the inbox."""
REFUSED_PREFIX = "e2e:"
"""Checkpoints of the encrypted rooms already told that Herald does not read them."""
REQUEST_TIMEOUT = 20.0
SYNC_GRACE = 15.0
"""Seconds a `/sync` may take beyond `sync_timeout` before the connection is replaced."""
GAP_PAGES = 20
"""At most this many pages of 100 events are read back to fill one room's gap."""
MAX_CHUNK = 4000
"""Characters of one message: with its HTML twice over and an edit's copy, well inside the
homeserver's 64 KiB event."""
SEND_FILE_MAX_BYTES = 50 * 1024 * 1024
"""The largest file sent (Synapse's default `max_upload_size`)."""
TIMELINE_LIMIT = 100
"""Events per room in one `/sync` batch; more are read through `/messages` (the gap)."""
MAX_PENDING_INVITES = 100
"""Invites left pending that are looked at again with each batch (the newest)."""


def sync_filter(timeline_limit: int) -> dict[str, Any]:
    """What Herald asks `/sync` for: rooms' timelines and state, nothing else."""
    return {
        "presence": {"types": []},
        "account_data": {"types": []},
        "room": {
            "timeline": {"limit": timeline_limit},
            "ephemeral": {"types": []},
            "account_data": {"types": []},
            "state": {"lazy_load_members": True},
        },
    }


class MatrixAdapter(TrackedSends):
    """One Matrix account: syncs, joins invited rooms, sends, edits, shows typing, moves files;
    passes edits (read with the event they replace) and reactions on, marks the message being
    answered (`working_reaction`), and sends voice replies as voice messages.

    Entering checks the access token with `whoami` (AuthError when refused, NotReady when the
    homeserver is unreachable).
    """

    platform: Platform = PLATFORM

    def __init__(
        self,
        config: MatrixConfig,
        files_dir: Path,
        checkpoints: Checkpoints,
        *,
        timeline_limit: int = TIMELINE_LIMIT,
    ) -> None:
        self.config = config
        self._filter = sync_filter(timeline_limit)
        self.files_dir = files_dir
        self.checkpoints = checkpoints
        self.account = AccountId(config.account)
        self.limits = SendLimits(
            max_chunk=MAX_CHUNK,
            min_edit_interval=config.min_edit_interval,
            min_send_interval=config.min_send_interval,
            max_file_bytes=SEND_FILE_MAX_BYTES,
            voice=True,  # an `m.audio` voice message, then its text as a message
            voice_caption=MAX_CHUNK,
        )
        self._working: dict[tuple[str, str], str] = {}
        """(room, event) → the id of the working reaction Herald put on that event."""
        self._inflight = InFlight()
        self._client: AsyncClient | None = None
        self._http: aiohttp.ClientSession | None = None
        self._me = Me(config.user_id)
        self._entered = False
        self._poll_started: float | None = None
        self._last_poll: float | None = None
        self._names: dict[tuple[str, str], str] = {}
        self._pending: dict[str, str] = {}
        """Invites left pending since this process started: room id → inviter."""

    def _new_client(self) -> AsyncClient:
        client = AsyncClient(
            self.config.homeserver.rstrip("/"),
            self.config.user_id,
            config=AsyncClientConfig(
                max_limit_exceeded=0, max_timeouts=0, request_timeout=REQUEST_TIMEOUT
            ),
        )
        client.access_token = self.config.access_token.get_secret_value()
        client.user_id = self.config.user_id
        return client

    async def __aenter__(self) -> Self:
        """Check the token; raises AuthError or NotReady."""
        client = self._new_client()
        try:
            self._me = await self._whoami(client)
        except BaseException:
            await client.close()
            raise
        self._client = client
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=REQUEST_TIMEOUT)
        )
        self._entered = True
        self._last_poll = time.monotonic()
        logger.info("matrix: connected as %s", self._me.user_id)
        return self

    async def __aexit__(self, *exc: object) -> None:
        client, self._client = self._client, None
        http, self._http = self._http, None
        try:
            await self._drain_sends()
        finally:
            if client is not None:
                await client.close()
            if http is not None:
                await http.close()

    async def _whoami(self, client: AsyncClient) -> Me:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                answer = await client.whoami()
                if not isinstance(answer, WhoamiResponse):
                    error = _error(answer, "whoami")
                    if isinstance(error, PermanentSendError):  # 403, 404: not this account
                        raise AuthError(f"{error} (check homeserver, user_id, access_token)")
                    raise error
                if answer.user_id != self.config.user_id:
                    raise AuthError(
                        f"matrix: the access token is {answer.user_id}'s, not "
                        f"{self.config.user_id}'s (check user_id)"
                    )
                name = await client.get_displayname(answer.user_id)
        except (aiohttp.ClientError, TimeoutError) as err:
            raise NotReady(f"matrix: whoami: {type(err).__name__}: {err}") from err
        display = getattr(name, "displayname", None) or ""
        return Me(answer.user_id, display)

    async def check(self) -> str:
        """Check the access token with `whoami` without syncing (for `herald doctor`)."""
        client = self._new_client()
        try:
            me = await self._whoami(client)
        finally:
            await client.close()
        named = f" ({me.display_name})" if me.display_name else ""
        return f"{me.user_id}{named} on {urlsplit(self.config.homeserver).netloc}"

    def liveness(self) -> AdapterState:
        """RECEIVING while syncs complete in time; RECONNECTING once one is overdue."""
        if self._client is None:
            return AdapterState.STOPPED if self._entered else AdapterState.STARTING
        window = self.config.sync_timeout + SYNC_GRACE
        now = time.monotonic()
        if self._poll_started is not None:
            late = now - self._poll_started > window
        else:
            late = self._last_poll is None or now - self._last_poll > window + SYNC_GRACE
        return AdapterState.RECONNECTING if late else AdapterState.RECEIVING

    def _connected(self) -> AsyncClient:
        if self._client is None:
            raise NotReady("matrix: the adapter is not connected")
        return self._client

    # -- receiving --------------------------------------------------------------------------

    async def run(self, sink: InboundSink) -> None:
        """Sync until cancelled. Raises NotReady, AuthError, or what `sink.accept` raised."""
        since = await self.checkpoints.get(SINCE)
        while True:
            try:
                batch = await self._sync(since)
            except _RefusedSince as err:
                logger.warning(
                    "matrix: the homeserver refused the stored sync token (%s); syncing in full "
                    "again (each event is still answered once, none older than "
                    "backlog_max_age)",
                    err,
                )
                since = None
                continue
            await self._invites(batch, sink)
            for room_id, info in batch.rooms.join.items():
                events = [e.source for e in info.timeline.events]
                if info.timeline.limited and since is not None:
                    events = await self._gap(room_id, since, events) + events
                await self._room_events(room_id, events, sink)
            await self.checkpoints.set(SINCE, batch.next_batch)
            since = batch.next_batch

    async def _sync(self, since: str | None) -> SyncResponse:
        client = self._connected()
        if since is None:
            # nio falls back to the token of its last answer, which may be past a batch that
            # failed before its events were stored: no stored token means a full sync.
            client.next_batch = ""
            client.loaded_sync_token = ""
        self._poll_started = time.monotonic()
        try:
            async with asyncio.timeout(self.config.sync_timeout + SYNC_GRACE):
                answer = await client.sync(
                    timeout=max(1, round(self.config.sync_timeout * 1000)) if since else 1,
                    sync_filter=self._filter,
                    since=since,
                )
        except TimeoutError as err:
            raise NotReady("matrix: a /sync hung; restarting the connection") from err
        except aiohttp.ClientError as err:
            raise NotReady(f"matrix: /sync: {type(err).__name__}: {err}") from err
        finally:
            self._poll_started = None
        if isinstance(answer, SyncError) or not isinstance(answer, SyncResponse):
            error = _error(answer, "/sync")
            status = getattr(getattr(answer, "transport_response", None), "status", None)
            if since is not None and status == 400:  # M_UNKNOWN "Invalid stream token"
                raise _RefusedSince(str(error)) from error
            raise error
        self._last_poll = time.monotonic()
        return answer

    async def _gap(
        self, room_id: str, since: str, timeline: Sequence[Mapping[str, Any]]
    ) -> list[Mapping[str, Any]]:
        """The events of `room_id` after `since` that a cut-short timeline left out."""
        client = self._connected()
        seen = {e.get("event_id") for e in timeline}
        found: list[Mapping[str, Any]] = []
        start = since
        for _ in range(GAP_PAGES):
            try:
                page = await client.room_messages(
                    room_id, start, direction=MessageDirection.front, limit=100
                )
            except (aiohttp.ClientError, TimeoutError) as err:
                raise NotReady(f"matrix: /messages: {type(err).__name__}") from err
            if isinstance(page, RoomMessagesError) or not hasattr(page, "chunk"):
                raise _error(page, "/messages")
            for event in page.chunk:
                if event.source.get("event_id") in seen:
                    return found
                found.append(event.source)
            if not page.chunk or not page.end or page.end == start:
                break
            start = page.end
        return found

    async def _room_events(
        self, room_id: str, events: Sequence[Mapping[str, Any]], sink: InboundSink
    ) -> None:
        client = self._connected()
        room = client.rooms.get(room_id)
        view = RoomView(
            room_id,
            members=room.member_count if room is not None else 2,
            encrypted=bool(room is not None and room.encrypted),
        )
        for event in events:
            kind = event.get("type")
            what = f"{PLATFORM}: event {event.get('event_id')}"
            if kind == "m.room.encrypted" and not view.encrypted:
                log_skipped(logger, what, Skipped("an encrypted event in a plain room"))
                continue
            sealed = kind in ("m.room.encrypted", "m.room.message") and view.encrypted
            if sealed and event.get("sender") != self._me.user_id:
                await self._refuse_encrypted(room_id)
                continue
            if reaction_of(event) is not None:
                await self._reacted(event, view, sink)
                continue
            incoming = await self._convert(event, view)
            if isinstance(incoming, Skipped):
                log_skipped(logger, what, incoming, quiet=(NOT_ADDRESSED, "our own event"))
                continue
            key = incoming.message.platform_message_id
            message = await with_files(
                incoming.message,
                incoming.files,
                functools.partial(self._download, key),
                sink=sink,
            )
            await sink.accept(message)
            await self._read(room_id, str(event["event_id"]))

    async def _convert(
        self, event: Mapping[str, Any], view: RoomView
    ) -> Incoming[MediaRef] | Skipped:
        """The message of one timeline event (an edit: read with the event it replaces)."""
        original: Mapping[str, Any] | None = None
        target = edited_event(event)
        if target is not None and event.get("sender") != self._me.user_id:
            original = await self._event(view.room_id, target)
        return to_inbound(
            event,
            room=view,
            me=self._me,
            account=self.account,
            config=self.config,
            now=utcnow(),
            display_name=self._name(view.room_id, str(event.get("sender", ""))),
            original=original,
        )

    async def _event(self, room_id: str, event_id: str) -> Mapping[str, Any] | None:
        """One event of the room as the homeserver has it, None when it does not give it
        (unknown, not visible to the bot: a 4xx). Raises NotReady, RateLimited or AuthError
        when it cannot be asked now (the batch is then read again)."""
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                found = await self._connected().room_get_event(room_id, event_id)
        except (aiohttp.ClientError, TimeoutError) as err:
            raise NotReady(f"matrix: reading an edited event: {type(err).__name__}") from err
        if isinstance(found, ErrorResponse):
            error = _error(found, "reading an edited event")
            if isinstance(error, PermanentSendError):
                return None
            raise error
        source = getattr(getattr(found, "event", None), "source", None)
        return source if isinstance(source, Mapping) else None

    async def _reacted(self, event: Mapping[str, Any], view: RoomView, sink: InboundSink) -> None:
        """A reaction, to the sink that takes them (it decides whether it means anything:
        an approval, a note, nothing)."""
        reaction = reaction_from(
            event,
            room=view,
            me=self._me,
            account=self.account,
            now=utcnow(),
            display_name=self._name(view.room_id, str(event.get("sender", ""))),
        )
        if isinstance(reaction, Skipped):
            what = f"{PLATFORM}: event {event.get('event_id')}"
            log_skipped(logger, what, reaction, quiet=("our own event",))
        elif isinstance(sink, ReactionSink):
            await sink.react(reaction)

    def _name(self, room_id: str, user_id: str) -> str:
        client = self._client
        room = client.rooms.get(room_id) if client is not None else None
        if room is not None:
            user = room.users.get(user_id)
            if user is not None and user.display_name:
                return str(user.display_name)
        return user_id

    async def _read(self, room_id: str, event_id: str) -> None:
        """Mark `event_id` read (a receipt the sender sees); best effort."""
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                await self._connected().room_read_markers(room_id, event_id, event_id)
        except (aiohttp.ClientError, TimeoutError, NotReady) as err:
            logger.debug("matrix: read receipt in %s failed: %s", room_id, err)

    async def _refuse_encrypted(self, room_id: str) -> None:
        """Tell an encrypted room, once, that Herald does not read it (and log it)."""
        if await self.checkpoints.get(REFUSED_PREFIX + room_id) is not None:
            return
        logger.warning(
            "matrix: room %s is end-to-end encrypted; Herald does not read encrypted rooms "
            "(its messages are left unanswered)",
            room_id,
        )
        content = {"msgtype": "m.notice", "body": E2E_REFUSAL}
        try:
            await self._put(room_id, "m.room.message", content, f"e2e-{room_id}")
        except (RateLimited, NotReady) as err:  # told with the next message (same txn id)
            logger.warning("matrix: could not tell room %s yet: %s", room_id, err)
            return
        except HeraldError as err:
            logger.warning("matrix: could not tell room %s: %s", room_id, err)
        await self.checkpoints.set(REFUSED_PREFIX + room_id, "told")

    async def _invites(self, batch: SyncResponse, sink: InboundSink) -> None:
        """Join rooms allowed people invited to; decline (or leave pending) the others.

        A pending invite is looked at again with every batch (an inviter paired since then is
        allowed now: inviting again changes nothing on the homeserver, so no new invite comes).
        """
        for room_id in (*batch.rooms.join, *batch.rooms.leave):
            self._pending.pop(room_id, None)
        found: dict[str, str] = dict(self._pending)
        for room_id, info in batch.rooms.invite.items():
            # nio keeps a member event's membership, not its content, in `source`.
            states = [
                {**e.source, "content": {"membership": getattr(e, "membership", None)}}
                for e in info.invite_state
                if isinstance(getattr(e, "source", None), Mapping)
            ]
            inviter = inviter_of(states, self._me)
            if inviter is not None:
                found[room_id] = inviter
        for room_id, inviter in found.items():
            await self._invite(room_id, inviter, sink)

    async def _invite(self, room_id: str, inviter: str, sink: InboundSink) -> None:
        client = self._connected()
        probe = InboundMessage(
            platform=PLATFORM,
            account=self.account,
            chat_id=ChatId(room_id),
            sender=Sender(ExternalUserId(inviter), inviter),
            text="",
            platform_message_id=PlatformMessageId(f"invite:{room_id}"),
        )
        try:
            if await may_fetch(sink, probe):
                answer = await client.join(room_id)
                verb = "joined"
            elif self.config.invites is Invites.ALLOWED:
                answer = await client.room_leave(room_id)
                verb = "declined"
            else:
                if room_id not in self._pending:
                    logger.info("matrix: invite to %s by %s left pending", room_id, inviter)
                    self._pending[room_id] = inviter
                    while len(self._pending) > MAX_PENDING_INVITES:
                        self._pending.pop(next(iter(self._pending)))
                return
        except (aiohttp.ClientError, TimeoutError) as err:
            raise NotReady(f"matrix: answering an invite: {type(err).__name__}") from err
        self._pending.pop(room_id, None)
        if isinstance(answer, ErrorResponse):
            logger.warning("matrix: invite to %s: %s", room_id, _error(answer, "join"))
            return
        logger.info("matrix: %s the invite to %s by %s", verb, room_id, inviter)

    async def _download(self, key: PlatformMessageId, index: int, ref: MediaRef) -> Attachment:
        """Fetch one file through the authenticated media API into `files_dir/<room>/`."""
        if self._http is None:
            raise NotReady("matrix: the adapter is not connected")
        server, _, media = ref.mxc.removeprefix("mxc://").partition("/")
        url = (
            f"{self.config.homeserver.rstrip('/')}/_matrix/client/v1/media/download/"
            f"{quote(server, safe='')}/{quote(media, safe='')}"
        )
        token = self.config.access_token.get_secret_value()
        data = await download(
            self._http,
            url,
            what=f"matrix: file {index}",
            limit=self.config.attachment_max_bytes,
            headers={"Authorization": f"Bearer {token}"},
        )
        room, _, event = key.rpartition(":")
        return await keep(
            self.files_dir,
            f"{room}:{event}",
            index,
            data,
            mime_type=ref.mime_type,
            filename=ref.filename,
        )

    # -- sending ----------------------------------------------------------------------------

    async def _send(self, message: OutboundMessage) -> DeliveryReceipt:
        """Deliver one chunk (its text, then its files). Raises RateLimited,
        PermanentSendError or NotReady."""
        room = str(message.chat_id)
        thread = str(message.thread_id) if message.thread_id else None
        parsed = split_event_key(message.reply_to) if message.reply_to else None
        reply = parsed[1] if parsed else None
        txn = hashlib.sha256(message.idempotency_key.encode()).hexdigest()[:32]
        first: str | None = None
        if len(message.attachments) == 1 and message.attachments[0].voice:
            # A spoken reply: the voice message first, its text after it (Element shows no
            # caption on a voice message). Each event has its own transaction id, so a retry
            # after either failed repeats neither.
            first = await self._send_file(room, message.attachments[0], thread, f"{txn}-0")
            message = replace(message, attachments=())
        if message.text.strip():
            content = text_content(
                message.text,
                markdown=message.format is TextFormat.MARKDOWN,
                thread=thread,
                reply_to=reply,
            )
            content = with_buttons(content, message.buttons)
            first = await self._put(room, "m.room.message", content, txn)
        for index, attachment in enumerate(message.attachments):
            event = await self._send_file(room, attachment, thread, f"{txn}-{index}")
            first = first or event
        if first is None:
            raise PermanentSendError("matrix: nothing to send (no text and no files)")
        return DeliveryReceipt(PlatformMessageId(f"{room}:{first}"))

    async def _send_file(
        self, room: str, attachment: Attachment, thread: str | None, txn: str
    ) -> str:
        client = self._connected()
        data = await asyncio.to_thread(attachment.path.read_bytes)
        name = attachment.filename or attachment.path.name
        try:
            uploaded, _ = await client.upload(
                _provider(data),
                content_type=attachment.mime_type,
                filename=name,
                filesize=len(data),
            )
        except (aiohttp.ClientError, TimeoutError) as err:
            raise NotReady(f"matrix: upload: {type(err).__name__}") from err
        if not isinstance(uploaded, UploadResponse):
            raise _error(uploaded, "upload")
        image = attachment.mime_type.startswith("image/")
        content: dict[str, Any]
        if attachment.voice:
            content = voice_content(
                uploaded.content_uri,
                size=len(data),
                mime_type=attachment.mime_type,
                filename=name,
                duration_ms=ogg_duration_ms(data),
            )
            relate(content, thread=thread, reply_to=None)
            return await self._put(room, "m.room.message", content, txn)
        content = {
            "msgtype": "m.image" if image else "m.file",
            "body": name,
            "filename": name,
            "url": uploaded.content_uri,
            "info": {"mimetype": attachment.mime_type, "size": len(data)},
            "m.mentions": {},
        }
        relate(content, thread=thread, reply_to=None)
        return await self._put(room, "m.room.message", content, txn)

    async def _put(self, room: str, kind: str, content: dict[str, Any], txn: str) -> str:
        """Send one event; its id. The transaction id makes a repeated PUT one event."""
        size = len(json.dumps(content, ensure_ascii=False).encode())
        content = within_event_limit(content, size)
        if len(json.dumps(content, ensure_ascii=False).encode()) > MAX_EVENT_BYTES - 2048:
            raise PermanentSendError("matrix: the message is larger than one event may be")
        client = self._connected()
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT + 5):
                answer = await client.room_send(room, kind, content, tx_id=txn)
        except (aiohttp.ClientError, TimeoutError) as err:
            raise NotReady(f"matrix: send: {type(err).__name__}") from err
        event_id = getattr(answer, "event_id", None)
        if isinstance(answer, ErrorResponse) or not isinstance(event_id, str):
            raise _error(answer, "send")
        return event_id

    async def edit(self, target: PlatformMessageId, message: OutboundMessage) -> DeliveryReceipt:
        """Replace the text of `target` (`m.replace`). Raises like `send`."""
        parsed = split_event_key(target)
        if parsed is None:
            raise PermanentSendError(f"matrix: {target!r} is not a Matrix event key")
        room, event = parsed
        new = text_content(message.text, markdown=message.format is TextFormat.MARKDOWN)
        async with self._inflight.track():
            await self._put(room, "m.room.message", edit_content(event, new), uuid.uuid4().hex)
        return DeliveryReceipt(target)

    async def typing(self, chat_id: ChatId, thread_id: ThreadId | None) -> None:
        """Show "typing…" for about five seconds. Raises like `send`."""
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                answer = await self._connected().room_typing(str(chat_id), True, timeout=5000)
        except (aiohttp.ClientError, TimeoutError) as err:
            raise NotReady(f"matrix: typing: {type(err).__name__}") from err
        if isinstance(answer, ErrorResponse):
            raise _error(answer, "typing")

    async def working(self, chat_id: ChatId, message: PlatformMessageId) -> None:
        """Put the working reaction on the message being answered. Raises like `send`."""
        parsed = split_event_key(message)
        if not self.config.working_reaction or parsed is None or parsed in self._working:
            return
        room, event = parsed
        key = self.config.working_reaction
        annotation = {"rel_type": "m.annotation", "event_id": event, "key": key}
        txn = hashlib.sha256(f"working:{room}:{event}".encode()).hexdigest()[:32]
        self._working[parsed] = await self._put(
            room, "m.reaction", {"m.relates_to": annotation}, txn
        )

    async def done(self, chat_id: ChatId, message: PlatformMessageId) -> None:
        """Take the working reaction off again (a redaction of it). Raises like `send`."""
        parsed = split_event_key(message)
        reaction = self._working.get(parsed) if parsed is not None else None
        if parsed is None or reaction is None:
            return
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                answer = await self._connected().room_redact(
                    parsed[0], reaction, tx_id=f"done-{reaction}"
                )
        except (aiohttp.ClientError, TimeoutError) as err:
            raise NotReady(f"matrix: redact: {type(err).__name__}") from err
        if isinstance(answer, ErrorResponse):
            raise _error(answer, "redact")
        self._working.pop(parsed, None)


class _RefusedSince(Exception):
    """The homeserver answered 400 to a `/sync` from the stored token (not one of its own)."""


def _provider(data: bytes) -> Any:
    """A data provider for nio's upload: the same bytes on every try."""

    def provide(_got_429: int, _got_timeouts: int) -> bytes:
        return data

    return provide


def _error(answer: object, doing: str) -> HeraldError:
    """The Herald error for a nio error response (or anything else unexpected)."""
    if not isinstance(answer, ErrorResponse):
        return NotReady(f"matrix: {doing}: unexpected answer {type(answer).__name__}")
    transport = getattr(answer, "transport_response", None)
    status = getattr(transport, "status", None)
    return error_from(
        answer.status_code,
        answer.message,
        status=status if isinstance(status, int) else None,
        retry_after_ms=answer.retry_after_ms,
        doing=doing,
    )
