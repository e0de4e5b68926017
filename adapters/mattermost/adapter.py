"""The Mattermost connection: REST API v4 through aiohttp, and the websocket event stream.

No maintained asyncio SDK exists (`mattermostdriver` is synchronous at heart and unkept), and
the wire is small: a handful of JSON routes and one websocket, so plain aiohttp (already a
dependency) carries both.

Receiving: the websocket (`/api/v4/websocket`, authenticated by its challenge) gives
`posted`, `post_edited` and `reaction_added`. Each channel's checkpoint `last:<channel>` is
the `create_at` of its newest post in the inbox, moved only after `sink.accept` returned.
After every `hello` (a new connection), and whenever an event's `seq` skips one, each channel
Herald has heard from (checkpoint `channels`, the most recent `backfill_channels`) is read back
from its checkpoint with `GET /channels/{id}/posts?since=`: what was posted while Herald was
away or the stream dropped reaches the inbox, whose UNIQUE post key answers each post once.

Sending: one post per chunk, its files uploaded first and attached by id (a voice reply is a
file post with the text as its message, one request after the upload). Each post carries a
`pending_post_id` made from the outbox key (the server answers a repeat within its dedupe
window with the post already made) and the prop `herald_send` (a digest of the key): a resend
after a crash (`recovered`) looks for it among the channel's recent posts first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote, urlsplit

import aiohttp

from adapters.files import download, keep, with_files
from adapters.inbound import FileRef, Incoming, Skipped, log_skipped
from adapters.inflight import InFlight, TrackedSends
from adapters.mattermost import PLATFORM
from adapters.mattermost.config import MattermostConfig
from adapters.mattermost.convert import (
    ACTION_PATH,
    COMMAND_PATH,
    DIRECT,
    NOT_ADDRESSED,
    OWN_POST,
    SEND_MARK,
    Me,
    button_props,
    embedded,
    error_from,
    event_of,
    json_of,
    mentions_of,
    pending_post_id,
    post_time,
    pressed,
    quiet_mentions,
    reaction_from,
    send_mark,
    slash_command,
    to_inbound,
)
from gateway.contracts.adapter import (
    AdapterState,
    Checkpoints,
    InboundSink,
    ReactionSink,
    WebhookResponse,
)
from gateway.contracts.errors import AuthError, NotReady, PermanentSendError, RateLimited
from gateway.contracts.ids import AccountId, ChatId, Platform, PlatformMessageId, ThreadId
from gateway.contracts.messages import (
    Attachment,
    DeliveryReceipt,
    InboundMessage,
    OutboundMessage,
    SendLimits,
    utcnow,
)

logger = logging.getLogger(__name__)

_POST_ID = re.compile(r"^[a-z0-9]{26}$")

REQUEST_TIMEOUT = 20.0
MAX_CHUNK = 16000
"""Characters of one post (the server takes 16383)."""
SEND_FILE_MAX_BYTES = 100 * 1024 * 1024
"""The largest file sent (the server's default `MaxFileSize`)."""
CHANNELS = "channels"
"""The checkpoint listing the channels Herald heard from, most recent last (JSON)."""
LAST_PREFIX = "last:"
"""A channel's checkpoint: `<create_at>:<post id>` of its newest post in the inbox."""
BACKFILL_PAGE = 200
RECENT_POSTS = 100
"""Posts of a channel looked through for a chunk sent before a crash."""
MAX_FILES = 5
"""Files one post takes (the server's limit)."""
TAKEN = 2000
"""Post ids remembered as handled."""


class MattermostAdapter(TrackedSends):
    """One Mattermost bot account: receives over the websocket (reading back what it missed),
    posts, edits, uploads and downloads files, shows typing, passes edits and reactions on,
    marks the post being answered (`working_reaction`), sends voice replies, and takes button
    presses and slash commands at `/webhooks/mattermost/{actions,command}`.

    Entering checks the token with `GET /users/me` (AuthError when refused, NotReady when the
    server is unreachable).
    """

    platform: Platform = PLATFORM

    def __init__(
        self,
        config: MattermostConfig,
        files_dir: Path,
        checkpoints: Checkpoints,
        *,
        webhook: str = "",
    ) -> None:
        self.config = config
        self.webhook = webhook or PLATFORM
        """The name after `/webhooks/` of this account's button presses and slash commands
        (`mattermost:<account>` on a platform with several accounts)."""
        self.files_dir = files_dir
        self.checkpoints = checkpoints
        self.account = AccountId(config.account)
        self.limits = SendLimits(
            max_chunk=MAX_CHUNK,
            min_edit_interval=config.min_edit_interval,
            min_send_interval=config.min_send_interval,
            max_file_bytes=SEND_FILE_MAX_BYTES,
            voice=True,  # an audio file post, the text as its message
            voice_caption=MAX_CHUNK,
        )
        self._inflight = InFlight()
        self._http: aiohttp.ClientSession | None = None
        self._me = Me("")
        self._entered = False
        self._receiving = False
        self._types: dict[str, str] = {}
        """Channel id → its type (`D`, `O`, `P`, `G`), as the server said."""
        self._channels: list[str] = []
        self._last: dict[str, int] = {}
        self._catching_up = asyncio.Lock()
        self._taken: OrderedDict[str, None] = OrderedDict()
        """The ids of the posts handled lately (a post read back and then seen on the stream,
        or the other way round, is handled once)."""

    # -- the connection ---------------------------------------------------------------------

    def _session(self) -> aiohttp.ClientSession:
        token = self.config.token.get_secret_value()
        return aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {token}", "X-Requested-With": "XMLHttpRequest"},
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=REQUEST_TIMEOUT),
        )

    async def __aenter__(self) -> Self:
        """Check the token; raises AuthError or NotReady."""
        http = self._session()
        try:
            self._me = await self._whoami(http)
        except BaseException:
            await http.close()
            raise
        self._http = http
        self._entered = True
        logger.info("mattermost: connected as @%s", self._me.username)
        return self

    async def __aexit__(self, *exc: object) -> None:
        http, self._http = self._http, None
        self._receiving = False
        try:
            await self._drain_sends()
        finally:
            if http is not None:
                await http.close()

    async def _whoami(self, http: aiohttp.ClientSession) -> Me:
        body = await self._call(http, "GET", "/users/me", doing="GET /users/me")
        if not isinstance(body, Mapping) or not isinstance(body.get("id"), str):
            raise NotReady("mattermost: GET /users/me: not a user")
        return Me(str(body["id"]), str(body.get("username") or ""))

    async def check(self) -> str:
        """Check the token with `GET /users/me` without receiving (for `herald doctor`)."""
        async with self._session() as http:
            me = await self._whoami(http)
        return f"@{me.username} ({me.user_id}) on {urlsplit(self.config.url).netloc}"

    def liveness(self) -> AdapterState:
        """RECEIVING while the websocket is up (pings answered); RECONNECTING otherwise."""
        if self._http is None:
            return AdapterState.STOPPED if self._entered else AdapterState.STARTING
        return AdapterState.RECEIVING if self._receiving else AdapterState.RECONNECTING

    def _connected(self) -> aiohttp.ClientSession:
        if self._http is None:
            raise NotReady("mattermost: the adapter is not connected")
        return self._http

    async def _call(
        self,
        http: aiohttp.ClientSession,
        method: str,
        path: str,
        *,
        doing: str,
        body: Any = None,
        data: aiohttp.FormData | None = None,
        params: Mapping[str, str] | None = None,
    ) -> Any:
        """One REST call; its JSON answer. Raises AuthError, RateLimited, NotReady or
        PermanentSendError."""
        url = f"{self.config.url}/api/v4{path}"
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT + 5):
                async with http.request(
                    method, url, json=body, data=data, params=params
                ) as response:
                    text = await response.text()
                    answer = event_of(text) if text.startswith("{") else None
                    if answer is None and text.startswith("["):
                        answer = json_of(text)
                    if response.status >= 300:
                        raise error_from(response.status, answer, response.headers, doing)
                    return answer
        except (aiohttp.ClientError, TimeoutError) as err:
            raise NotReady(f"mattermost: {doing}: {type(err).__name__}") from err

    async def _api(self, method: str, path: str, *, doing: str, **kwargs: Any) -> Any:
        return await self._call(self._connected(), method, path, doing=doing, **kwargs)

    # -- receiving --------------------------------------------------------------------------

    async def run(self, sink: InboundSink) -> None:
        """Receive until cancelled. Raises NotReady (the stream dropped), AuthError, or what
        `sink.accept` raised."""
        http = self._connected()
        known = await self.checkpoints.get(CHANNELS)
        with contextlib.suppress(ValueError, TypeError):
            self._channels = [c for c in json.loads(known or "[]") if isinstance(c, str)]
        for channel in self.config.channels:
            if channel not in self._channels:
                self._channels.insert(0, channel)
        ws_url = "ws" + self.config.url.removeprefix("http") + "/api/v4/websocket"
        try:
            async with http.ws_connect(
                ws_url, heartbeat=self.config.ping_interval, autoping=True, max_msg_size=0
            ) as ws:
                token = self.config.token.get_secret_value()
                await ws.send_str(
                    json.dumps(
                        {"seq": 1, "action": "authentication_challenge", "data": {"token": token}}
                    )
                )
                await self._stream(ws, sink)
        except aiohttp.WSServerHandshakeError as err:
            if err.status == 401:
                raise AuthError("mattermost: the websocket refused the token") from err
            raise NotReady(f"mattermost: websocket: HTTP {err.status}") from err
        except (aiohttp.ClientError, TimeoutError) as err:
            raise NotReady(f"mattermost: websocket: {type(err).__name__}: {err}") from err
        finally:
            self._receiving = False
        raise NotReady("mattermost: the websocket closed")

    async def _stream(self, ws: aiohttp.ClientWebSocketResponse, sink: InboundSink) -> None:
        seq: int | None = None
        async for frame in ws:
            if frame.type is not aiohttp.WSMsgType.TEXT:
                if frame.type in (aiohttp.WSMsgType.ERROR, aiohttp.WSMsgType.CLOSE):
                    break
                continue
            event = event_of(str(frame.data))
            if event is None:
                continue
            if "seq_reply" in event:  # the answer to our challenge
                if event.get("status") != "OK":
                    raise AuthError("mattermost: the websocket refused the token")
                continue
            kind = event.get("event")
            number = event.get("seq")
            if isinstance(number, int) and not isinstance(number, bool):
                if seq is not None and number <= seq:
                    continue  # a repeat of an event already handled
                gap = seq is not None and number > seq + 1
                seq = number
                if gap and kind != "hello":
                    logger.info("mattermost: events were missed (seq gap); reading back")
                    await self._catch_up(sink)
            if kind == "hello":
                self._receiving = True
                await self._catch_up(sink)
            elif kind in ("posted", "post_edited"):
                await self._posted(event, sink, edit=kind == "post_edited")
            elif kind == "reaction_added":
                await self._reacted(event, sink)

    async def _posted(self, event: Mapping[str, Any], sink: InboundSink, *, edit: bool) -> None:
        data = event.get("data")
        post = embedded(data, "post")
        if post is None:
            return
        channel = str(post.get("channel_id") or "")
        kind = data.get("channel_type") if isinstance(data, Mapping) else None
        if isinstance(kind, str) and kind and channel:
            self._types[channel] = kind
        mentions = mentions_of(data)
        await self._take(post, sink, mentions=mentions, edit=edit)

    async def _take(
        self,
        post: Mapping[str, Any],
        sink: InboundSink,
        *,
        mentions: tuple[str, ...] | None,
        edit: bool = False,
    ) -> None:
        """One post to the inbox (with its files), then its channel's checkpoint moved; a post
        handled already (read back, then on the stream) is passed over."""
        channel = str(post.get("channel_id") or "")
        post_id = str(post.get("id") or "")
        if not edit and post_id in self._taken:
            return
        kind = await self._channel_type(channel) if channel else None
        incoming = to_inbound(
            post,
            channel_type=kind,
            mentions=mentions,
            me=self._me,
            account=self.account,
            config=self.config,
            now=utcnow(),
            edit=edit,
        )
        if isinstance(incoming, Skipped):
            what = f"{PLATFORM}: post {post.get('id')}"
            log_skipped(logger, what, incoming, quiet=(NOT_ADDRESSED, OWN_POST))
        else:
            await self._accept(incoming, sink)
        if not edit:
            self._taken[post_id] = None
            while len(self._taken) > TAKEN:
                self._taken.popitem(last=False)
            await self._seen(channel, post_time(post), post_id)

    async def _accept(self, incoming: Incoming[FileRef], sink: InboundSink) -> None:
        key = incoming.message.platform_message_id
        message = await with_files(
            incoming.message,
            incoming.files,
            lambda index, ref: self._download(key, index, ref),
            sink=sink,
        )
        await sink.accept(message)

    async def _seen(self, channel: str, at: int | None, post_id: str) -> None:
        """Move `channel`'s checkpoint to `at` (never back) and list the channel as heard."""
        if not channel or at is None:
            return
        if channel not in self._channels or self._channels[-1] != channel:
            fresh = channel not in self._channels
            if not fresh:
                self._channels.remove(channel)
            self._channels.append(channel)
            await self._trim()
            if fresh:
                await self.checkpoints.set(CHANNELS, json.dumps(self._channels))
        if at > self._last.get(channel, 0):
            self._last[channel] = at
            await self.checkpoints.set(LAST_PREFIX + channel, f"{at}:{post_id}")

    async def _trim(self) -> None:
        """Keep `backfill_channels` channels, dropping the least recently heard first, but
        direct chats and `channels` only when nothing else is left: anyone may create
        channels and add the bot, and their chatter must not push the operator's direct
        chat out of what is read back."""
        excess = len(self._channels) - self.config.backfill_channels
        for channel in list(self._channels):
            if excess <= 0:
                return
            if channel in self.config.channels:
                continue
            try:
                kind = await self._channel_type(channel)
            except (NotReady, RateLimited):
                kind = None
            if kind != DIRECT:
                self._channels.remove(channel)
                excess -= 1
        del self._channels[: max(0, excess)]

    async def _catch_up(self, sink: InboundSink) -> None:
        """Read back every heard-from channel's posts since its checkpoint, oldest first."""
        async with self._catching_up:
            for channel in list(self._channels):
                stored = await self.checkpoints.get(LAST_PREFIX + channel)
                at, _, last_id = (stored or "").partition(":")
                if not at.isdigit():
                    continue
                self._taken.setdefault(last_id, None)
                since = max(int(at), self._last.get(channel, 0))
                try:
                    page = await self._api(
                        "GET",
                        f"/channels/{quote(channel, safe='')}/posts",
                        params={"since": str(since)},
                        doing="reading a channel back",
                    )
                except PermanentSendError as err:  # a channel gone, or left
                    logger.info("mattermost: channel %s not read back: %s", channel, err)
                    continue
                posts = page.get("posts") if isinstance(page, Mapping) else None
                if not isinstance(posts, Mapping):
                    logger.warning("mattermost: channel %s: its posts could not be read", channel)
                found = [
                    p
                    for p in (posts.values() if isinstance(posts, Mapping) else ())
                    if isinstance(p, Mapping) and (post_time(p) or 0) >= since
                ]
                found.sort(key=lambda p: post_time(p) or 0)
                for post in found:
                    await self._take(post, sink, mentions=None)

    async def _channel_type(self, channel: str) -> str | None:
        known = self._types.get(channel)
        if known is not None:
            return known
        try:
            body = await self._api(
                "GET", f"/channels/{quote(channel, safe='')}", doing="GET /channels"
            )
        except PermanentSendError:
            return None
        kind = body.get("type") if isinstance(body, Mapping) else None
        if isinstance(kind, str):
            self._types[channel] = kind
            return kind
        return None

    async def _reacted(self, event: Mapping[str, Any], sink: InboundSink) -> None:
        data = event.get("data")
        broadcast = event.get("broadcast")
        channel = broadcast.get("channel_id") if isinstance(broadcast, Mapping) else None
        channel = channel if isinstance(channel, str) and channel else None
        reaction = reaction_from(
            embedded(data, "reaction"),
            channel_id=channel,
            channel_type=await self._channel_type(channel) if channel else None,
            me=self._me,
            account=self.account,
            now=utcnow(),
        )
        if isinstance(reaction, Skipped):
            log_skipped(
                logger, f"{PLATFORM}: a reaction", reaction, quiet=("the bot's own reaction",)
            )
        elif isinstance(sink, ReactionSink):
            await sink.react(reaction)

    async def _download(self, key: PlatformMessageId, index: int, ref: FileRef) -> Attachment:
        """Fetch one file (`GET /files/{id}`) with the bot's token."""
        data = await download(
            self._connected(),
            ref.url,
            what=f"mattermost: file {index}",
            limit=self.config.attachment_max_bytes,
        )
        return await keep(
            self.files_dir, key, index, data, mime_type=ref.mime_type, filename=ref.filename
        )

    # -- buttons and slash commands ------------------------------------------------------------

    async def handle_webhook(
        self, path: str, headers: Mapping[str, str], body: bytes, sink: InboundSink
    ) -> WebhookResponse:
        """`/webhooks/mattermost/actions` (a button press: its signed command checked, 403 when
        it does not match) and `/webhooks/mattermost/command` (a slash command: its token
        checked, 401 when it does not match); each stored before the 200."""
        where = path.strip("/")
        if where == ACTION_PATH:
            return await self._press(body, sink)
        if where == COMMAND_PATH:
            return await self._command(body, sink)
        return WebhookResponse(404, b"no such webhook")

    async def _press(self, body: bytes, sink: InboundSink) -> WebhookResponse:
        secret = self.config.action_secret
        if secret is None or not self.config.buttons:
            return WebhookResponse(404, b"buttons are not configured")
        payload = event_of(body.decode("utf-8", "replace"))
        if payload is None:
            return WebhookResponse(400, b"not a JSON object")
        message = pressed(
            payload, secret=secret.get_secret_value(), me=self._me, account=self.account
        )
        if isinstance(message, Skipped):
            log_skipped(logger, f"{PLATFORM}: a button press", message)
            return WebhookResponse(403, b"not a press of Herald's buttons")
        message = await self._placed(message, str(payload.get("post_id") or ""))
        await sink.accept(message)
        answer = {"ephemeral_text": f"Sent {message.text}"}
        return WebhookResponse(200, json.dumps(answer).encode(), "application/json")

    async def _command(self, body: bytes, sink: InboundSink) -> WebhookResponse:
        token = self.config.command_token
        if token is None:
            return WebhookResponse(404, b"slash commands are not configured")
        message = slash_command(
            body, token=token.get_secret_value(), me=self._me, account=self.account
        )
        if isinstance(message, Skipped):
            log_skipped(logger, f"{PLATFORM}: a slash command", message)
            status = 401 if "token" in message.reason else 400
            return WebhookResponse(status, message.reason.encode())
        kind = await self._channel_type(str(message.chat_id))
        message = replace(message, is_direct=kind == "D")
        await sink.accept(message)
        # The command's name alone: the words go no further than the inbox (they are not
        # redacted here).
        said = message.text.split(None, 1)[0] if message.text.startswith("/") else None
        answer = {
            "response_type": "ephemeral",
            "text": f"Herald got {said}." if said else "Herald got your message.",
        }
        return WebhookResponse(200, json.dumps(answer).encode(), "application/json")

    async def _placed(self, message: InboundMessage, post_id: str) -> InboundMessage:
        """A press in the session of the post its button is under (its thread, its kind of
        channel)."""
        kind = await self._channel_type(str(message.chat_id))
        thread: ThreadId | None = None
        if post_id:
            try:
                post = await self._api(
                    "GET", f"/posts/{quote(post_id, safe='')}", doing="GET /posts"
                )
            except PermanentSendError:
                post = None
            root = post.get("root_id") if isinstance(post, Mapping) else None
            thread = ThreadId(root) if isinstance(root, str) and root else None
        return replace(message, is_direct=kind == "D", thread_id=thread)

    # -- sending ----------------------------------------------------------------------------

    async def _send(self, message: OutboundMessage) -> DeliveryReceipt:
        """One post: files uploaded, then the post carrying them and the text. Raises
        RateLimited, PermanentSendError, AuthError or NotReady."""
        channel = str(message.chat_id)
        mark = send_mark(message.idempotency_key)
        if message.recovered:
            found = await self._find_sent(channel, mark)
            if found is not None:
                logger.info("mattermost: chunk %s was already posted", message.idempotency_key)
                return DeliveryReceipt(PlatformMessageId(f"{channel}:{found}"))
        if len(message.attachments) > MAX_FILES:
            raise PermanentSendError(
                f"mattermost: {len(message.attachments)} files; a post takes {MAX_FILES}"
            )
        file_ids = [await self._upload(channel, a) for a in message.attachments]
        if not message.text.strip() and not file_ids:
            raise PermanentSendError("mattermost: nothing to send (no text and no files)")
        props: dict[str, Any] = {SEND_MARK: mark}
        public, secret = self.config.public_url, self.config.action_secret
        if message.buttons and public is not None and secret is not None:
            props.update(
                button_props(
                    message.buttons,
                    url=f"{public.rstrip('/')}/webhooks/{self.webhook}/{ACTION_PATH}",
                    secret=secret.get_secret_value(),
                )
            )
        body: dict[str, Any] = {
            "channel_id": channel,
            "message": quiet_mentions(message.text),
            "root_id": str(message.thread_id or ""),
            "file_ids": file_ids,
            "props": props,
            "pending_post_id": pending_post_id(self._me, message.idempotency_key),
        }
        post = await self._api("POST", "/posts", body=body, doing="POST /posts")
        post_id = post.get("id") if isinstance(post, Mapping) else None
        if not isinstance(post_id, str):
            raise NotReady("mattermost: POST /posts: no post id in the answer")
        return DeliveryReceipt(PlatformMessageId(f"{channel}:{post_id}"))

    async def _find_sent(self, channel: str, mark: str) -> str | None:
        """The id of the bot's recent post in `channel` carrying `mark`, None when none."""
        page = await self._api(
            "GET",
            f"/channels/{quote(channel, safe='')}/posts",
            params={"per_page": str(RECENT_POSTS)},
            doing="looking for a chunk already posted",
        )
        posts = page.get("posts") if isinstance(page, Mapping) else None
        for post in posts.values() if isinstance(posts, Mapping) else ():
            props = post.get("props") if isinstance(post, Mapping) else None
            if (
                isinstance(props, Mapping)
                and props.get(SEND_MARK) == mark
                and post.get("user_id") == self._me.user_id
            ):
                return str(post.get("id"))
        return None

    async def _upload(self, channel: str, attachment: Attachment) -> str:
        data = await asyncio.to_thread(attachment.path.read_bytes)
        form = aiohttp.FormData()
        form.add_field("channel_id", channel)
        form.add_field(
            "files",
            data,
            filename=attachment.filename or attachment.path.name,
            content_type=attachment.mime_type,
        )
        answer = await self._api("POST", "/files", data=form, doing="POST /files")
        infos = answer.get("file_infos") if isinstance(answer, Mapping) else None
        first = infos[0] if isinstance(infos, list) and infos else None
        file_id = first.get("id") if isinstance(first, Mapping) else None
        if not isinstance(file_id, str):
            raise NotReady("mattermost: POST /files: no file id in the answer")
        return file_id

    async def edit(self, target: PlatformMessageId, message: OutboundMessage) -> DeliveryReceipt:
        """Replace the text of post `target` (`PUT /posts/{id}/patch`). Raises like `send`."""
        _, _, post = str(target).rpartition(":")
        async with self._inflight.track():
            await self._api(
                "PUT",
                f"/posts/{quote(post, safe='')}/patch",
                body={"message": quiet_mentions(message.text)},
                doing="editing a post",
            )
        return DeliveryReceipt(target)

    async def typing(self, chat_id: ChatId, thread_id: ThreadId | None) -> None:
        """Show "typing…" (`POST /users/me/typing`). Raises like `send`."""
        body = {"channel_id": str(chat_id), "parent_id": str(thread_id or "")}
        await self._api("POST", "/users/me/typing", body=body, doing="typing")

    async def working(self, chat_id: ChatId, message: PlatformMessageId) -> None:
        """Put the working reaction on the post being answered (an edit's: the post edited;
        a slash command has none). Raises like `send`."""
        post = _post_of(message)
        if not self.config.working_reaction or not post:
            return
        body = {
            "user_id": self._me.user_id,
            "post_id": post,
            "emoji_name": self.config.working_reaction,
            "create_at": 0,
        }
        await self._api("POST", "/reactions", body=body, doing="adding a reaction")

    async def done(self, chat_id: ChatId, message: PlatformMessageId) -> None:
        """Take the working reaction off again. Raises like `send`."""
        post = _post_of(message)
        if not self.config.working_reaction or not post:
            return
        path = (
            f"/users/{quote(self._me.user_id, safe='')}/posts/{quote(post, safe='')}"
            f"/reactions/{quote(self.config.working_reaction, safe='')}"
        )
        await self._api("DELETE", path, doing="removing a reaction")


def _post_of(message: PlatformMessageId) -> str | None:
    """The post a message id names (`<channel>:<post>[:e<at>|:b<press>]`); None for a slash
    command's (`<channel>:s<trigger>`)."""
    parts = str(message).split(":")
    return parts[1] if len(parts) > 1 and _POST_ID.match(parts[1]) else None
