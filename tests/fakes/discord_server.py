"""A fake Discord for discord.py: REST and the gateway websocket, on 127.0.0.1.

discord.py talks to it unmodified but for the REST base (`api_base`, e.g.
`http://127.0.0.1:<port>/api/v10`); the gateway address comes from `GET /gateway/bot`, and the
resume address from READY's `resume_gateway_url`, as on Discord.

Two listeners:
- REST (`/api/v10/...`) and the attachment downloads: Starlette served by uvicorn
  (`LocalServer`, like the other fakes);
- the gateway websocket (`ws://127.0.0.1:<ws_port>/?v=10&encoding=json&compress=zlib-stream`):
  aiohttp (`WebSocketListener`), which can hang up without a close frame (a dropped
  connection: the client sees 1006) and close with any code.

REST, as discord.py sends it: `Authorization: Bot <token>` (401 `{"message": "401:
Unauthorized", "code": 0}` otherwise); JSON bodies, or multipart with `payload_json` and
`files[n]` parts. Routes: `GET /users/@me`, `GET /oauth2/applications/@me`, `GET /gateway/bot`,
`GET /channels/{id}` (with `last_message_id`), `GET /channels/{id}/messages` (`after` /
`before`, `limit`, newest first), `POST /channels/{id}/messages`, `PATCH
/channels/{id}/messages/{id}`, `POST /channels/{id}/typing`. A rate limit is 429 with
`retry_after` in the body, `Retry-After`, `X-RateLimit-Scope` and `Via` (without `Via`
discord.py takes a 429 for a Cloudflare ban).

Gateway: HELLO (`heartbeat_interval`), heartbeats answered with HEARTBEAT_ACK, IDENTIFY
(token checked: close 4004; the Message Content intent checked against `message_content`:
close 4014) answered with READY (`session_id`, `resume_gateway_url`), RESUME answered with the
events the session missed (unless `replay_on_resume` is off) and RESUMED, or INVALID_SESSION
(`false`) for an unknown session. Payloads are zlib-stream compressed when asked. Every
message created (injected or posted by the bot) is dispatched as MESSAGE_CREATE to every
ready session; a session without a socket keeps it for its resume.

Edits and reactions: `edit_message(message, content)` dispatches MESSAGE_UPDATE, `react(channel,
message, emoji, user=...)` MESSAGE_REACTION_ADD.

Buttons: a message posted with `components` (action rows of buttons, checked) keeps them;
`press_button(channel, message, custom_id, user=...)` dispatches INTERACTION_CREATE (a message
component interaction with its `id` and `token`), and `POST
/interactions/{id}/{token}/callback` (no bot token: the interaction's) records the response
(`interaction_responses`; a second one is 400, code 40060).

Faults: `rate_limit(channel, retry_after, times)`, `drop_connections()` (no close frame),
`close_connections(code)`, `invalidate_sessions()`, `stop_acking()`, `silence()` (the socket
stays open and acks heartbeats, but events are not sent), `refuse_connections(n)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

from aiohttp import WSMsgType, web
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes.params import hang_up, read_params
from tests.fakes.serving import LocalServer, Served, WebSocketListener
from tests.fakes.waiting import Changes, Waitable

JSON = dict[str, Any]

DEFAULT_TOKEN = "MTAwMA.fake.discord-bot-token"
BOT_ID = "1000000000000000001"
APPLICATION_ID = "1000000000000000002"
GUILD_ID = "1000000000000000003"
DISCORD_EPOCH_MS = 1_420_070_400_000
MESSAGE_CONTENT = 1 << 15
HELLO, DISPATCH, HEARTBEAT, IDENTIFY, RESUME, RECONNECT, INVALID_SESSION, ACK = (
    10,
    0,
    1,
    2,
    6,
    7,
    9,
    11,
)
MAX_PART = 50 * 1024 * 1024


@dataclass
class FakeChannel:
    """A channel: a DM (type 1), a server text channel (0) or a thread (11, with a parent)."""

    id: str
    type: int
    parent_id: str | None = None
    messages: list[JSON] = field(default_factory=list)

    @property
    def guild_id(self) -> str | None:
        return None if self.type == 1 else GUILD_ID


@dataclass(frozen=True, slots=True)
class Posted:
    """A message the bot created."""

    channel_id: str
    id: str
    content: str
    reference: str | None
    """The id of the message it replies to."""
    files: tuple[tuple[str, int], ...] = ()
    """(filename, size) of each attached file."""
    at: float = field(default_factory=time.monotonic)
    components: tuple[JSON, ...] = ()
    """The message components sent with it (action rows of buttons)."""


@dataclass(frozen=True, slots=True)
class Interaction:
    """A button press dispatched as INTERACTION_CREATE."""

    id: str
    token: str
    custom_id: str
    user_id: str
    channel_id: str
    message_id: str


@dataclass(frozen=True, slots=True)
class InteractionResponse:
    """An accepted interaction callback (`type` 6: deferred update; 4: a message)."""

    interaction_id: str
    type: int
    data: JSON | None


@dataclass(frozen=True, slots=True)
class Edited:
    """An edit the bot made."""

    channel_id: str
    id: str
    content: str


@dataclass
class _Session:
    id: str
    sequence: int = 0
    events: list[JSON] = field(default_factory=list)
    """Every dispatched payload, for a resume (`s` says which the client has)."""
    socket: _Gateway | None = None


@dataclass
class _Gateway:
    ws: web.WebSocketResponse
    transport: asyncio.Transport | None
    compress: Any | None
    session: _Session | None = None
    outgoing: asyncio.Queue[JSON] = field(default_factory=asyncio.Queue)
    """Payloads to send, in order (one writer per socket)."""


REST_KINDS = ("post", "edit", "typing", "other")
"""What a REST request does, for faults: post a message, edit one, show typing, or else."""


@dataclass
class _Faults:
    rate_limits: dict[tuple[str, str], tuple[float, int]] = field(default_factory=dict)
    """(channel, kind) -> (retry_after, times)."""
    global_limit: tuple[float, int] = (0.0, 0)
    failing: dict[str, tuple[int, int]] = field(default_factory=dict)
    """kind ("*": any) -> (status, times)."""
    drops: dict[str, int] = field(default_factory=dict)
    """kind ("*": any) -> times the connection is closed unanswered."""
    ack: bool = True
    silent: bool = False
    refuse: int = 0


class _Reject(Exception):
    def __init__(self, status: int, message: str, code: int = 0, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.extra = status, code, extra


def _kind(request: Request) -> str:
    """Which of REST_KINDS a request is."""
    path = request.url.path
    if path.endswith("/typing"):
        return "typing"
    if request.method == "PATCH" and "/messages/" in path:
        return "edit"
    if request.method == "POST" and path.endswith("/messages"):
        return "post"
    return "other"


def _countdown(counts: dict[str, int], kind: str) -> bool:
    """Whether a counted fault for `kind` (or "*") applies now; counts it down."""
    for key in (kind, "*"):
        if counts.get(key, 0) > 0:
            counts[key] -= 1
            return True
    return False


def _bucket_headers(request: Request) -> dict[str, str]:
    """Discord's rate limit headers on a success: a bucket per route with room to spare, so
    discord.py's header-based limiter runs as it does against Discord."""
    reset = time.time() + 1.0
    return {
        "X-RateLimit-Limit": "5",
        "X-RateLimit-Remaining": "4",
        "X-RateLimit-Reset": f"{reset:.3f}",
        "X-RateLimit-Reset-After": "1.000",
        "X-RateLimit-Bucket": f"fake-{request.method}-{request.url.path.rsplit('/', 1)[-1]}",
    }


def _action_row(row: Any) -> bool:
    """Whether a component is an action row of at most five valid buttons."""
    if not isinstance(row, dict) or row.get("type") != 1:
        return False
    buttons = row.get("components")
    if not isinstance(buttons, list) or not 1 <= len(buttons) <= 5:
        return False
    return all(
        isinstance(b, dict)
        and b.get("type") == 2
        and b.get("style") in (1, 2, 3, 4)
        and isinstance(b.get("custom_id"), str)
        and 1 <= len(b["custom_id"]) <= 100
        and isinstance(b.get("label"), str)
        and len(b["label"]) <= 80
        for b in buttons
    )


QUIET_HEARTBEAT = 5.0
"""A heartbeat interval for tests that are not about heartbeats: Herald replaces a socket
after 2 × interval + 0.5 s without an ack, and a 2-core machine running six test workers can
stall an event loop for over a second, which a 0.5 s interval turned into spurious resumes."""


class FakeDiscordServer(Served, Waitable):
    """A fake Discord with one bot in one server, for one test.

    `async with FakeDiscordServer() as discord:`; then `add_channel`, `inject_message`,
    faults, and the records: `posted`, `edits`, `typing`, `identifies`, `resumes`,
    `history_reads`, `rate_limited`, `connections`, `heartbeats`.
    """

    def __init__(
        self,
        *,
        token: str = DEFAULT_TOKEN,
        heartbeat_interval: float = 1.0,
        message_content: bool = True,
        replay_on_resume: bool = True,
        port: int = 0,
        ws_port: int = 0,
    ) -> None:
        self.token = token
        self.heartbeat_interval = heartbeat_interval
        self.message_content = message_content
        self.replay_on_resume = replay_on_resume
        self._port, self._ws_port = port, ws_port
        self._changes = Changes()
        self._faults = _Faults()
        self._local: LocalServer | None = None
        self._listener: WebSocketListener | None = None
        self._last_id = 0
        self._sessions: dict[str, _Session] = {}
        self._sockets: list[_Gateway] = []
        self._files: dict[str, bytes] = {}
        self.downloads: list[str] = []
        """The key of every attachment downloaded, in order."""
        self.channels: dict[str, FakeChannel] = {}
        self.users: dict[str, JSON] = {}
        self.posted: list[Posted] = []
        self.edits: list[Edited] = []
        self.typing: list[str] = []
        self.bot_reactions: list[tuple[str, str, str, str]] = []
        """(PUT or DELETE, channel, message, emoji) of every change of the bot's own
        reactions (`/channels/{id}/messages/{id}/reactions/{emoji}/@me`)."""
        self.identifies = 0
        self.resumes: list[tuple[str, bool]] = []
        """(session id, whether it was resumed)."""
        self.connections = 0
        self.heartbeats = 0
        self.history_reads: list[str] = []
        self.rate_limited: list[tuple[str, float]] = []
        """(channel id, monotonic time) of each 429."""
        self.rest_calls: list[str] = []
        self.interactions: list[Interaction] = []
        """Every button press dispatched, in order."""
        self.interaction_responses: list[InteractionResponse] = []
        """Every accepted interaction callback, in order."""

    # -- addresses ------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return self.url

    @property
    def api_base(self) -> str:
        """What `platforms.discord.api_base` is set to."""
        return f"{self.base_url}/api/v10"

    @property
    def gateway_url(self) -> str:
        assert self._listener is not None
        return f"ws://127.0.0.1:{self._listener.port}/"

    @property
    def kept_its_session(self) -> bool:
        """Identified once, then only resumed, at least once: no event was lost to a new
        session. (A busy machine may stall a heartbeat ack and make Herald replace a socket
        once more; that is one more resume, never a second identify.)"""
        resumed = [r for _, r in self.resumes]
        return len(resumed) >= 2 and not resumed[0] and all(resumed[1:])

    # -- setup ----------------------------------------------------------------------------------

    def add_user(self, user_id: str, name: str, *, bot: bool = False) -> JSON:
        """A user (people are made up on first use; this names them or makes a bot)."""
        user: JSON = {
            "id": user_id,
            "username": name,
            "global_name": name.title(),
            "discriminator": "0",
            "avatar": None,
        }
        if bot:
            user["bot"] = True
        self.users[user_id] = user
        return user

    def add_channel(self, channel_id: str, *, dm: bool = False, parent: str | None = None) -> None:
        """A channel: a server text channel, a DM, or a thread of `parent`."""
        kind = 1 if dm else (11 if parent is not None else 0)
        self.channels[channel_id] = FakeChannel(channel_id, kind, parent)

    def add_file(self, content: bytes) -> str:
        """Register attachment content; its download URL."""
        key = secrets.token_hex(6)
        self._files[key] = content
        return f"{self.base_url}/attachments/{key}"

    # -- injecting ------------------------------------------------------------------------------

    def inject_message(
        self,
        channel_id: str,
        content: str,
        *,
        author: str,
        mention_bot: bool = False,
        reply_to: str | None = None,
        attachments: Sequence[Mapping[str, Any]] = (),
        roles: Sequence[str] = (),
    ) -> JSON:
        """A person's message: stored in the channel's history and dispatched. `mention_bot`
        puts `<@bot>` in front of the text."""
        if mention_bot:
            content = f"<@{BOT_ID}> {content}"
        user = self.users.get(author) or self.add_user(author, f"user{author[-4:]}")
        return self._create(
            channel_id, content, user, reply_to=reply_to, attachments=attachments, roles=roles
        )

    def edit_message(self, message: Mapping[str, Any], content: str) -> JSON:
        """The author edited a message `inject_message` created: stored, and MESSAGE_UPDATE
        (the whole message, `edited_timestamp` set) dispatched."""
        channel = self._channel(str(message["channel_id"]))
        stored = next(m for m in channel.messages if m["id"] == message["id"])
        stored.update(content=content, edited_timestamp=datetime.now(UTC).isoformat())
        event = dict(stored)
        if channel.guild_id is not None:
            event["guild_id"] = channel.guild_id
            event["member"] = {"roles": [], "nick": None, "joined_at": None}
        self._dispatch("MESSAGE_UPDATE", event)
        self._changes.notify()
        return dict(stored)

    def react(self, channel_id: str, message_id: str, emoji: str, *, user: str) -> None:
        """`user` reacted with a Unicode `emoji` to a message: MESSAGE_REACTION_ADD."""
        channel = self._channel(channel_id)
        person = self.users.get(user) or self.add_user(user, f"user{user[-4:]}")
        event: JSON = {
            "user_id": user,
            "channel_id": channel_id,
            "message_id": message_id,
            "emoji": {"id": None, "name": emoji},
            "type": 0,
            "burst": False,
        }
        if channel.guild_id is not None:
            event["guild_id"] = channel.guild_id
            event["member"] = {"user": person, "roles": [], "nick": None, "joined_at": None}
        self._dispatch("MESSAGE_REACTION_ADD", event)
        self._changes.notify()

    def dispatch_again(self, message: Mapping[str, Any]) -> None:
        """MESSAGE_CREATE once more for a message `inject_message` created (a duplicate
        delivery, as after a resume that replays what the client already had)."""
        event = dict(message)
        guild_id = self._channel(str(message["channel_id"])).guild_id
        if guild_id is not None:
            event["guild_id"] = guild_id
        self._dispatch("MESSAGE_CREATE", event)
        self._changes.notify()

    def press_button(
        self, channel_id: str, message_id: str, custom_id: str, *, user: str
    ) -> Interaction:
        """`user` pressed the button `custom_id` of the bot's message: INTERACTION_CREATE (a
        message component interaction, as Discord sends it) to every ready session. KeyError
        when the message or the button is unknown."""
        channel = self._channel(channel_id)
        message = next(m for m in channel.messages if m["id"] == message_id)
        buttons = [
            c
            for row in message.get("components") or []
            for c in row.get("components") or []
            if c.get("custom_id") == custom_id
        ]
        if not buttons:
            raise KeyError(f"no button {custom_id!r} on message {message_id}")
        person = self.users.get(user) or self.add_user(user, f"user{user[-4:]}")
        interaction = Interaction(
            self._next_id(), secrets.token_urlsafe(32), custom_id, user, channel_id, message_id
        )
        channel_object: JSON = {"id": channel.id, "type": channel.type}
        payload: JSON = {
            "id": interaction.id,
            "application_id": APPLICATION_ID,
            "type": 3,
            "data": {"custom_id": custom_id, "component_type": buttons[0].get("type", 2)},
            "channel_id": channel.id,
            "channel": channel_object,
            "token": interaction.token,
            "version": 1,
            "message": dict(message),
            "locale": "en-US",
            "app_permissions": "2248473465835073",
            "entitlements": [],
            "context": 1 if channel.guild_id is None else 0,
        }
        if channel.guild_id is None:
            payload["user"] = person
        else:
            payload["guild_id"] = channel.guild_id
            payload["guild_locale"] = "en-US"
            channel_object.update(guild_id=channel.guild_id, name=f"channel-{channel.id[-4:]}")
            if channel.parent_id is not None:
                channel_object["parent_id"] = channel.parent_id
            payload["member"] = {"user": person, "roles": [], "nick": None, "joined_at": None}
        self.interactions.append(interaction)
        self._dispatch("INTERACTION_CREATE", payload)
        self._changes.notify()
        return interaction

    # -- faults ---------------------------------------------------------------------------------

    def rate_limit(
        self,
        channel_id: str,
        retry_after: float,
        times: int = 1,
        kinds: Sequence[str] = ("post",),
    ) -> None:
        """The next `times` requests of each of `kinds` (post, edit, typing) in the channel
        get 429 with `retry_after` (a per-route limit, `X-RateLimit-Scope: user`)."""
        for kind in kinds:
            self._faults.rate_limits[(channel_id, kind)] = (retry_after, times)

    def rate_limit_globally(self, retry_after: float, times: int = 1) -> None:
        """The next `times` REST requests, whatever they are, get the global 429
        (`"global": true`, `X-RateLimit-Global: true`)."""
        self._faults.global_limit = (retry_after, times)

    def fail_rest(self, status: int = 500, times: int = 1, kind: str = "*") -> None:
        """The next `times` REST requests of `kind` (post, edit, typing, other; "*": any)
        answer `status` (a 5xx; discord.py retries 500, 502, 504 and 524 by itself)."""
        self._faults.failing[kind] = (status, times)

    def drop_rest(self, times: int = 1, kind: str = "*") -> None:
        """The next `times` REST requests of `kind` get their connection closed unanswered."""
        self._faults.drops[kind] = times

    def drop_connections(self) -> None:
        """Hang up every gateway socket without a close frame (the client sees 1006)."""
        for sock in list(self._sockets):
            if sock.transport is not None:
                sock.transport.abort()

    async def close_connections(self, code: int) -> None:
        """Close every gateway socket with `code` (4000: resumable; 4004: token refused)."""
        for sock in list(self._sockets):
            await sock.ws.close(code=code)

    async def invalidate_sessions(self) -> None:
        """INVALID_SESSION (not resumable) on every socket; the sessions are forgotten."""
        for sock in list(self._sockets):
            if sock.session is not None:
                self._sessions.pop(sock.session.id, None)
            sock.outgoing.put_nowait({"op": INVALID_SESSION, "d": False})

    def stop_acking(self, stop: bool = True) -> None:
        """Heartbeats go unanswered (a zombie connection)."""
        self._faults.ack = not stop

    def silence(self, silent: bool = True) -> None:
        """Sockets stay open and ack heartbeats, but no event reaches them (they are still kept
        for a resume)."""
        self._faults.silent = silent

    def refuse_connections(self, count: int) -> None:
        """The next `count` gateway connections are refused (503 before the upgrade)."""
        self._faults.refuse = count

    # -- reading --------------------------------------------------------------------------------

    def texts_in(self, channel_id: str) -> list[str]:
        """What the bot posted in a channel, in order."""
        return [p.content for p in self.posted if p.channel_id == channel_id]

    @property
    def ready_sockets(self) -> int:
        """Open gateway sockets with a session."""
        return sum(1 for s in self._sockets if s.session is not None and not s.ws.closed)

    async def wait_for_posted(
        self, predicate: Callable[[Posted], bool], count: int = 1, timeout: float = 20.0
    ) -> list[Posted]:
        """Wait until `count` posts match; return the matches."""
        await self.wait_for(lambda: sum(1 for p in self.posted if predicate(p)) >= count, timeout)
        return [p for p in self.posted if predicate(p)]

    # -- lifecycle ------------------------------------------------------------------------------

    async def _start(self) -> None:
        self._local = LocalServer(self._app(), port=self._port)
        self._listener = WebSocketListener(self._gateway_endpoint, self._ws_port, "/")
        await self._local.start()
        await self._listener.start()

    async def _stop(self) -> None:
        self._changes.stop()
        for sock in list(self._sockets):
            if sock.transport is not None:
                sock.transport.abort()
        try:
            if self._listener is not None:
                await self._listener.stop()
        finally:
            if self._local is not None:
                await self._local.stop()

    # -- messages -------------------------------------------------------------------------------

    def _next_id(self) -> str:
        """A snowflake for now, strictly increasing."""
        stamp = (int(time.time() * 1000) - DISCORD_EPOCH_MS) << 22
        self._last_id = max(stamp, self._last_id + 1)
        return str(self._last_id)

    def _channel(self, channel_id: str) -> FakeChannel:
        channel = self.channels.get(channel_id)
        if channel is None:
            raise _Reject(404, "Unknown Channel", 10003)
        return channel

    def _bot_user(self) -> JSON:
        return {
            "id": BOT_ID,
            "username": "herald",
            "global_name": None,
            "discriminator": "0",
            "avatar": None,
            "bot": True,
            "verified": True,
            "flags": 0,
            "mfa_enabled": False,
        }

    def _create(
        self,
        channel_id: str,
        content: str,
        author: JSON,
        *,
        reply_to: str | None = None,
        attachments: Sequence[Mapping[str, Any]] = (),
        roles: Sequence[str] = (),
        components: Sequence[JSON] = (),
    ) -> JSON:
        channel = self._channel(channel_id)
        message_id = self._next_id()
        mentions = [
            self._bot_user() if uid == BOT_ID else self.users[uid]
            for uid in self.users.keys() | {BOT_ID}
            if f"<@{uid}>" in content or f"<@!{uid}>" in content
        ]
        message: JSON = {
            "id": message_id,
            "channel_id": channel_id,
            "type": 19 if reply_to else 0,
            "author": author,
            "content": content,
            "timestamp": datetime.now(UTC).isoformat(),
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": False,
            "mentions": mentions,
            "mention_roles": [],
            "attachments": [dict(a) for a in attachments],
            "embeds": [],
            "pinned": False,
            "flags": 0,
            "components": [dict(c) for c in components],
        }
        if reply_to is not None:
            message["message_reference"] = {
                "type": 0,
                "channel_id": channel_id,
                "message_id": reply_to,
                "guild_id": channel.guild_id,
            }
            message["referenced_message"] = next(
                (dict(m) for m in channel.messages if m["id"] == reply_to), None
            )
        channel.messages.append(message)
        event = dict(message)
        if channel.guild_id is not None:
            event["guild_id"] = channel.guild_id
            if not author.get("bot"):
                event["member"] = {"roles": list(roles), "nick": None, "joined_at": None}
        self._dispatch("MESSAGE_CREATE", event)
        self._changes.notify()
        return message

    def _dispatch(self, name: str, data: JSON) -> None:
        for session in self._sessions.values():
            session.sequence += 1
            payload = {"op": DISPATCH, "t": name, "s": session.sequence, "d": data}
            session.events.append(payload)
            sock = session.socket
            if sock is not None and not sock.ws.closed and not self._faults.silent:
                sock.outgoing.put_nowait(payload)

    # -- REST -----------------------------------------------------------------------------------

    def _app(self) -> Starlette:
        api = "/api/v10"
        return Starlette(
            routes=[
                Route(f"{api}/users/@me", self._rest(self._me)),
                Route(f"{api}/oauth2/applications/@me", self._rest(self._application)),
                Route(f"{api}/gateway/bot", self._rest(self._gateway_bot)),
                Route(f"{api}/channels/{{cid}}", self._rest(self._get_channel)),
                Route(
                    f"{api}/channels/{{cid}}/messages",
                    self._rest(self._messages),
                    methods=["GET", "POST"],
                ),
                Route(
                    f"{api}/channels/{{cid}}/messages/{{mid}}",
                    self._rest(self._edit),
                    methods=["PATCH"],
                ),
                Route(f"{api}/channels/{{cid}}/typing", self._rest(self._typing), methods=["POST"]),
                Route(
                    f"{api}/channels/{{cid}}/messages/{{mid}}/reactions/{{emoji}}/@me",
                    self._rest(self._own_reaction),
                    methods=["PUT", "DELETE"],
                ),
                Route(
                    f"{api}/interactions/{{iid}}/{{token}}/callback",
                    self._callback,
                    methods=["POST"],
                ),
                Route("/attachments/{key}", self._download),
            ]
        )

    def _rest(self, handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            self.rest_calls.append(f"{request.method} {request.url.path}")
            kind = _kind(request)
            try:
                if request.headers.get("authorization") != f"Bot {self.token}":
                    raise _Reject(401, "401: Unauthorized", 0)
                if _countdown(self._faults.drops, kind):
                    return await hang_up(request)
                self._fault(request, kind)
                answer = await handler(request)
            except _Reject as err:
                headers = {"Via": "1.1 google"}
                body: JSON = {"message": str(err), "code": err.code, **err.extra}
                if err.status == 429:
                    headers["Retry-After"] = str(max(1, round(err.extra["retry_after"])))
                    if err.extra.get("global"):
                        headers["X-RateLimit-Global"] = "true"
                        headers["X-RateLimit-Scope"] = "global"
                    else:
                        headers["X-RateLimit-Scope"] = "user"
                return JSONResponse(body, status_code=err.status, headers=headers)
            finally:
                self._changes.notify()
            headers = _bucket_headers(request)
            if answer is None:
                return Response(status_code=204, headers=headers)
            return JSONResponse(answer, headers=headers)

        return endpoint

    def _fault(self, request: Request, kind: str) -> None:
        """Raise the fault switched on for this request, if any."""
        seconds, times = self._faults.global_limit
        if times > 0:
            self._faults.global_limit = (seconds, times - 1)
            raise _Reject(
                429, "You are being rate limited.", 0, retry_after=seconds, **{"global": True}
            )
        failing = self._faults.failing.get(kind) or self._faults.failing.get("*")
        if failing is not None:
            status, times = failing
            key = kind if kind in self._faults.failing else "*"
            if times <= 1:
                del self._faults.failing[key]
            else:
                self._faults.failing[key] = (status, times - 1)
            raise _Reject(status, f"{status}: Server Error", 0)
        channel_id = request.path_params.get("cid")
        retry = self._faults.rate_limits.get((str(channel_id), kind))
        if retry is not None:
            seconds, times = retry
            if times <= 1:
                del self._faults.rate_limits[(str(channel_id), kind)]
            else:
                self._faults.rate_limits[(str(channel_id), kind)] = (seconds, times - 1)
            self.rate_limited.append((str(channel_id), time.monotonic()))
            raise _Reject(
                429, "You are being rate limited.", 0, retry_after=seconds, **{"global": False}
            )

    async def _me(self, request: Request) -> JSON:
        return self._bot_user()

    async def _application(self, request: Request) -> JSON:
        return {
            "id": APPLICATION_ID,
            "name": "Herald",
            "icon": None,
            "description": "",
            "bot_public": False,
            "bot_require_code_grant": False,
            "verify_key": "0" * 64,
            "owner": {
                "id": "1000000000000000009",
                "username": "owner",
                "discriminator": "0",
                "avatar": None,
            },
            "team": None,
            "flags": 1 << 19 if self.message_content else 0,
            "summary": "",
        }

    async def _gateway_bot(self, request: Request) -> JSON:
        return {
            "url": self.gateway_url,
            "shards": 1,
            "session_start_limit": {
                "total": 1000,
                "remaining": 1000 - self.identifies,
                "reset_after": 86_400_000,
                "max_concurrency": 1,
            },
        }

    async def _get_channel(self, request: Request) -> JSON:
        channel = self._channel(request.path_params["cid"])
        answer: JSON = {
            "id": channel.id,
            "type": channel.type,
            "last_message_id": channel.messages[-1]["id"] if channel.messages else None,
        }
        if channel.guild_id is not None:
            answer.update(guild_id=channel.guild_id, name=f"channel-{channel.id[-4:]}")
        if channel.parent_id is not None:
            answer["parent_id"] = channel.parent_id
        return answer

    async def _messages(self, request: Request) -> Any:
        channel = self._channel(request.path_params["cid"])
        if request.method == "GET":
            return self._history(channel, request)
        values, files = await read_params(
            request,
            max_part_size=MAX_PART,
            invalid_json=lambda: _Reject(400, "400: Bad Request", 50109),
            not_object=lambda: _Reject(400, "400: Bad Request", 50109),
        )
        if "payload_json" in values:
            values = {**values, **json.loads(values.pop("payload_json"))}
        content = values.get("content") or ""
        if len(content) > 2000:
            raise _Reject(400, "Invalid Form Body", 50035)
        if not content and not files:
            raise _Reject(400, "Cannot send an empty message", 50006)
        reference = values.get("message_reference")
        reply_to = reference.get("message_id") if isinstance(reference, dict) else None
        attachments = [
            {
                "id": self._next_id(),
                "filename": part.filename or "file",
                "size": len(part.content),
                "url": self.add_file(part.content),
                "content_type": part.content_type,
            }
            for part in files.values()
        ]
        components = values.get("components") or []
        if not isinstance(components, list) or not all(_action_row(c) for c in components):
            raise _Reject(400, "Invalid Form Body", 50035)
        message = self._create(
            channel.id,
            content,
            self._bot_user(),
            reply_to=reply_to,
            attachments=attachments,
            components=components,
        )
        self.posted.append(
            Posted(
                channel.id,
                message["id"],
                content,
                reply_to,
                tuple((str(a["filename"]), int(str(a["size"]))) for a in attachments),
                components=tuple(components),
            )
        )
        return message

    def _history(self, channel: FakeChannel, request: Request) -> list[JSON]:
        self.history_reads.append(channel.id)
        query = request.query_params
        limit = max(1, min(100, int(query.get("limit", "50"))))
        found = channel.messages
        if "after" in query:
            after = int(query["after"])
            found = [m for m in found if int(m["id"]) > after][:limit]
        elif "before" in query:
            before = int(query["before"])
            found = [m for m in found if int(m["id"]) < before][-limit:]
        else:
            found = found[-limit:]
        return [dict(m) for m in reversed(found)]

    async def _edit(self, request: Request) -> JSON:
        channel = self._channel(request.path_params["cid"])
        message_id = request.path_params["mid"]
        body = json.loads(await request.body() or b"{}")
        for message in channel.messages:
            if message["id"] == message_id:
                if message["author"]["id"] != BOT_ID:
                    raise _Reject(403, "Cannot edit a message authored by another user", 50005)
                if len(body.get("content") or "") > 2000:
                    raise _Reject(400, "Invalid Form Body", 50035)
                message["content"] = body.get("content", message["content"])
                self.edits.append(Edited(channel.id, message_id, message["content"]))
                return dict(message)
        raise _Reject(404, "Unknown Message", 10008)

    async def _callback(self, request: Request) -> Response:
        """An interaction response: no bot token needed, the interaction's own token is."""
        self.rest_calls.append(f"{request.method} {request.url.path}")
        try:
            found = next((i for i in self.interactions if i.id == request.path_params["iid"]), None)
            if found is None or not secrets.compare_digest(
                found.token, str(request.path_params["token"])
            ):
                return JSONResponse({"message": "Unknown interaction", "code": 10062}, 404)
            if any(r.interaction_id == found.id for r in self.interaction_responses):
                body = {"message": "Interaction has already been acknowledged.", "code": 40060}
                return JSONResponse(body, 400)
            answer = json.loads(await request.body() or b"{}")
            kind = answer.get("type") if isinstance(answer, dict) else None
            if kind not in (4, 5, 6, 7):
                return JSONResponse({"message": "Invalid Form Body", "code": 50035}, 400)
            data = answer.get("data")
            self.interaction_responses.append(
                InteractionResponse(found.id, kind, data if isinstance(data, dict) else None)
            )
            return Response(status_code=204)
        finally:
            self._changes.notify()

    async def _own_reaction(self, request: Request) -> None:
        channel = self._channel(request.path_params["cid"])
        message_id = request.path_params["mid"]
        if not any(m["id"] == message_id for m in channel.messages):
            raise _Reject(404, "Unknown Message", 10008)
        emoji = unquote(request.path_params["emoji"])
        self.bot_reactions.append((request.method, channel.id, message_id, emoji))

    async def _typing(self, request: Request) -> None:
        self.typing.append(self._channel(request.path_params["cid"]).id)

    async def _download(self, request: Request) -> Response:
        content = self._files.get(request.path_params["key"])
        if content is None:
            return Response(status_code=404)
        self.downloads.append(str(request.path_params["key"]))
        return Response(content, media_type="application/octet-stream")

    # -- the gateway ----------------------------------------------------------------------------

    async def _gateway_endpoint(self, request: web.Request) -> web.StreamResponse:
        if self._faults.refuse > 0:
            self._faults.refuse -= 1
            self._changes.notify()
            return web.Response(status=503, text="Service Unavailable")
        compress = None
        if request.query.get("compress") == "zlib-stream":
            compress = zlib.compressobj()
        elif request.query.get("compress"):
            return web.Response(status=400, text="unsupported compression")
        ws = web.WebSocketResponse(autoping=True, heartbeat=None, max_msg_size=0)
        await ws.prepare(request)
        transport = request.transport
        sock = _Gateway(
            ws, transport if isinstance(transport, asyncio.Transport) else None, compress
        )
        self._sockets.append(sock)
        self.connections += 1
        self._changes.notify()
        writer = asyncio.create_task(self._write(sock))
        try:
            sock.outgoing.put_nowait({"op": HELLO, "d": {"heartbeat_interval": self._interval_ms}})
            async for frame in ws:
                if frame.type is WSMsgType.TEXT:
                    await self._handle(sock, json.loads(frame.data))
        except ConnectionError:
            pass
        finally:
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            self._sockets.remove(sock)
            if sock.session is not None and sock.session.socket is sock:
                sock.session.socket = None
            self._changes.notify()
        return ws

    @property
    def _interval_ms(self) -> int:
        return int(self.heartbeat_interval * 1000)

    async def _handle(self, sock: _Gateway, payload: JSON) -> None:
        op, data = payload.get("op"), payload.get("d")
        if op == HEARTBEAT:
            self.heartbeats += 1
            if self._faults.ack:
                sock.outgoing.put_nowait({"op": ACK})
        elif op == IDENTIFY and isinstance(data, dict):
            await self._identify(sock, data)
        elif op == RESUME and isinstance(data, dict):
            await self._resume(sock, data)
        self._changes.notify()

    async def _identify(self, sock: _Gateway, data: JSON) -> None:
        if data.get("token") != self.token:
            await sock.ws.close(code=4004, message=b"Authentication failed.")
            return
        if int(data.get("intents") or 0) & MESSAGE_CONTENT and not self.message_content:
            await sock.ws.close(code=4014, message=b"Disallowed intent(s).")
            return
        self.identifies += 1
        session = _Session(secrets.token_hex(16))
        self._sessions[session.id] = session
        session.socket, sock.session = sock, session
        session.sequence += 1
        ready = {
            "v": 10,
            "user": self._bot_user(),
            "guilds": [],
            "session_id": session.id,
            "resume_gateway_url": self.gateway_url,
            "application": {"id": APPLICATION_ID, "flags": 0},
        }
        payload = {"op": DISPATCH, "t": "READY", "s": session.sequence, "d": ready}
        session.events.append(payload)
        self.resumes.append((session.id, False))
        sock.outgoing.put_nowait(payload)

    async def _resume(self, sock: _Gateway, data: JSON) -> None:
        session = self._sessions.get(str(data.get("session_id")))
        if session is None or data.get("token") != self.token:
            sock.outgoing.put_nowait({"op": INVALID_SESSION, "d": False})
            return
        old = session.socket
        session.socket, sock.session = sock, session
        if old is not None and old is not sock:
            old.session = None
        seq = data.get("seq") or 0
        if self.replay_on_resume:
            for event in session.events:
                if event["s"] > seq:
                    sock.outgoing.put_nowait(event)
        session.sequence += 1
        self.resumes.append((session.id, True))
        sock.outgoing.put_nowait({"op": DISPATCH, "t": "RESUMED", "s": session.sequence, "d": {}})

    async def _send(self, sock: _Gateway, payload: JSON) -> None:
        text = json.dumps(payload)
        if sock.compress is None:
            await sock.ws.send_str(text)
        else:
            data = sock.compress.compress(text.encode()) + sock.compress.flush(zlib.Z_SYNC_FLUSH)
            await sock.ws.send_bytes(data)

    async def _write(self, sock: _Gateway) -> None:
        """Send the socket's payloads in order until the socket goes."""
        with contextlib.suppress(ConnectionError, RuntimeError):
            while True:
                payload = await sock.outgoing.get()
                await self._send(sock, payload)
