"""A fake Mattermost server for Herald's Mattermost adapter: the REST API v4 and the
websocket event stream, on one aiohttp listener on 127.0.0.1.

REST (`/api/v4/...`), as the server answers it: `Authorization: Bearer <token>` (401 with
the server's error JSON `{id, message, detailed_error, request_id, status_code}` otherwise).
Routes: `GET /users/me`, `GET /channels/{id}`, `GET /channels/{id}/posts` (`since`, or
`page`/`per_page`; `{order, posts, next_post_id, prev_post_id}` newest first), `GET
/posts/{id}`, `POST /posts` (a repeated `pending_post_id` within `DEDUPE_SECONDS` answers the
post already made, as the server's pending-post cache does; `pending_post_id` is not kept
with the post), `PUT /posts/{id}/patch`, `POST /files` (multipart: `channel_id`, `files`),
`GET /files/{id}`, `POST /reactions`, `DELETE /users/{u}/posts/{p}/reactions/{emoji}`, `POST
/users/me/typing`.

Websocket (`/api/v4/websocket`): a client authenticated by its upgrade's bearer header, or by
`{"seq": 1, "action": "authentication_challenge", "data": {"token": …}}` (answered `{"status":
"OK", "seq_reply": 1}`), gets `hello` (seq 0), then every `posted`, `post_edited` and
`reaction_added` of the channels, each with the next `seq`; `data.post` / `data.reaction` are
JSON strings, `data.mentions` a JSON string list. Events while no socket is open go to no one
(the posts stay in the channel).

Buttons: a post's `props.attachments[].actions[]` are kept; `press(post, index, user)` posts
the action's request (`user_id`, `user_name`, `channel_id`, `post_id`, `trigger_id`, `type`,
`context`) to its integration URL, as the server does, and returns the answer.

Faults: `rate_limit(channel, reset, times)` (429 with `X-Ratelimit-Limit`, `-Remaining`,
`-Reset` on posts to that channel), `fail_posts(status, times)`, `drop_connections()` (no
close frame), `lose_next_event()` (its seq is used, the event never sent: a gap),
`duplicate_next_event()`, `remove_channel(id)` (404 after); `clear_faults()` switches off
every fault not yet used.

Hostile payloads: a prop whose value is `DEEP` (or `DEEPISH`) goes out (on the stream and
read back) as JSON nested `DEEP_LEVELS` (`DEEPISH_LEVELS`) deep, as the real server keeps and
sends a user's props (Go's decoder takes 10000 levels; Python's stops near 1000).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import WSMsgType, web

from tests.fakes.serving import AiohttpServer, Served
from tests.fakes.waiting import Changes, Waitable

JSON = dict[str, Any]

TOKEN = "fk9t3w5xq7b1c8d2e4f6g8h0ja"
BOT_ID = "b0tb0tb0tb0tb0tb0tb0tb0t0a"
BOT_NAME = "herald"
DEDUPE_SECONDS = 30.0
SERVER_VERSION = "9.11.0.9.11.0.abc.false"


DEEP = "\x00deep\x00"
DEEP_LEVELS = 5000
DEEPISH = "\x00deepish\x00"
DEEPISH_LEVELS = 900
"""Less deep than Python's parser stops at, deeper than it writes again further down."""


def dumps(value: Any) -> str:
    """JSON as the server writes it: a `DEEP` string becomes `DEEP_LEVELS` nested lists, a
    `DEEPISH` one `DEEPISH_LEVELS`."""
    return (
        json.dumps(value)
        .replace(json.dumps(DEEP), "[" * DEEP_LEVELS + "]" * DEEP_LEVELS)
        .replace(json.dumps(DEEPISH), "[" * DEEPISH_LEVELS + "]" * DEEPISH_LEVELS)
    )


def new_id() -> str:
    """A Mattermost id: 26 lowercase letters and digits."""
    alphabet = "abcdefghijkmnopqrstuwxyz13456789"
    return "".join(secrets.choice(alphabet) for _ in range(26))


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Channel:
    id: str
    type: str
    """`D` direct, `G` group message, `O` open, `P` private."""
    name: str = ""
    posts: list[str] = field(default_factory=list)


@dataclass
class _Socket:
    ws: web.WebSocketResponse
    transport: asyncio.Transport | None
    outgoing: asyncio.Queue[JSON] = field(default_factory=asyncio.Queue)
    seq: int = 0
    ready: bool = False


class FakeMattermostServer(Served, Waitable):
    """The fake; `async with FakeMattermostServer() as mm:` then `mm.add_user`,
    `mm.add_channel`, `mm.inject_post(...)`, faults, and `mm.posted`, `mm.edits`, …"""

    def __init__(self, token: str = TOKEN) -> None:
        self.token = token
        self._changes = Changes()
        self.users: dict[str, JSON] = {BOT_ID: {"id": BOT_ID, "username": BOT_NAME, "is_bot": True}}
        self.channels: dict[str, Channel] = {}
        self.posts: dict[str, JSON] = {}
        self.files: dict[str, tuple[JSON, bytes]] = {}
        self.posted: list[JSON] = []
        """Posts the bot made, in order (each the stored post)."""
        self.post_requests = 0
        self.edits: list[tuple[str, str]] = []
        self.reactions: list[JSON] = []
        self.removed_reactions: list[tuple[str, str]] = []
        self.typing: list[str] = []
        self.uploads: list[tuple[str, str, bytes]] = []
        self.downloads: list[str] = []
        self.connections = 0
        self.since_reads: list[tuple[str, int]] = []
        self._pending: dict[str, tuple[float, str]] = {}
        self._rate: dict[str, list[float]] = {}
        self._fail: list[int] = []
        self._lose = 0
        self._duplicate = 0
        self._sockets: list[_Socket] = []
        self._server: AiohttpServer | None = None

    # -- serving ------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the server is not started")
        return self._server.port

    @property
    def base_url(self) -> str:
        """What `platforms.mattermost.url` is."""
        return self.url

    async def _start(self) -> None:
        app = web.Application(client_max_size=200 * 1024 * 1024)
        api = "/api/v4"
        app.router.add_get(f"{api}/websocket", self._websocket)
        app.router.add_get(f"{api}/users/me", self._me)
        app.router.add_get(f"{api}/channels/{{id}}", self._channel)
        app.router.add_get(f"{api}/channels/{{id}}/posts", self._channel_posts)
        app.router.add_get(f"{api}/posts/{{id}}", self._post)
        app.router.add_post(f"{api}/posts", self._create_post)
        app.router.add_put(f"{api}/posts/{{id}}/patch", self._patch)
        app.router.add_post(f"{api}/files", self._upload)
        app.router.add_get(f"{api}/files/{{id}}", self._download)
        app.router.add_post(f"{api}/reactions", self._react)
        app.router.add_delete(
            f"{api}/users/{{user}}/posts/{{post}}/reactions/{{emoji}}", self._unreact
        )
        app.router.add_post(f"{api}/users/me/typing", self._typing)
        self._server = AiohttpServer(app)
        await self._server.start()

    async def _stop(self) -> None:
        self._changes.stop()
        try:
            for s in list(self._sockets):
                if s.transport is not None:
                    s.transport.abort()
        finally:
            if self._server is not None:
                await self._server.stop()

    # -- the world ----------------------------------------------------------------------------

    def add_user(self, user_id: str, username: str) -> None:
        self.users[user_id] = {"id": user_id, "username": username, "is_bot": False}

    def add_channel(self, channel_id: str, kind: str = "D", name: str = "") -> Channel:
        channel = Channel(channel_id, kind, name or channel_id)
        self.channels[channel_id] = channel
        return channel

    def remove_channel(self, channel_id: str) -> None:
        self.channels.pop(channel_id, None)

    def add_file(self, content: bytes, name: str, mime_type: str, user: str) -> str:
        """A file uploaded by `user`; its id (for `inject_post(files=…)`)."""
        file_id = new_id()
        info = {
            "id": file_id,
            "user_id": user,
            "post_id": "",
            "create_at": now_ms(),
            "name": name,
            "extension": name.rpartition(".")[2],
            "size": len(content),
            "mime_type": mime_type,
        }
        self.files[file_id] = (info, content)
        return file_id

    def _store(self, channel: Channel, post: JSON) -> JSON:
        self.posts[post["id"]] = post
        channel.posts.append(post["id"])
        return post

    def _new_post(self, channel: str, user: str, text: str, **fields: Any) -> JSON:
        at = max(now_ms(), max((p["create_at"] for p in self.posts.values()), default=0) + 1)
        file_ids = list(fields.pop("file_ids", ()) or ())
        post = {
            "id": new_id(),
            "create_at": at,
            "update_at": at,
            "edit_at": 0,
            "delete_at": 0,
            "is_pinned": False,
            "user_id": user,
            "channel_id": channel,
            "root_id": fields.pop("root_id", "") or "",
            "original_id": "",
            "message": text,
            "type": "",
            "props": fields.pop("props", None) or {},
            "hashtags": "",
            "pending_post_id": "",
            "reply_count": 0,
            "file_ids": file_ids,
            "metadata": {"files": [self.files[f][0] for f in file_ids if f in self.files]},
        }
        post.update(fields)
        return post

    def inject_post(
        self,
        channel_id: str,
        text: str,
        *,
        user: str,
        root_id: str = "",
        files: tuple[str, ...] = (),
        mention: bool = False,
        props: JSON | None = None,
    ) -> JSON:
        """`user` posts `text` in `channel_id`: stored, and sent as `posted` to the sockets
        (`mention`: the event's `mentions` names the bot)."""
        channel = self.channels[channel_id]
        post = self._store(
            channel,
            self._new_post(channel_id, user, text, root_id=root_id, file_ids=files, props=props),
        )
        self._posted(channel, post, mentions=[BOT_ID] if mention else None)
        return post

    def redeliver(self, post: JSON) -> None:
        """The same `posted` event once more."""
        self._posted(self.channels[post["channel_id"]], post, mentions=None)

    def edit_post(self, post_id: str, text: str) -> JSON:
        post = self.posts[post_id]
        at = max(now_ms(), post["update_at"] + 1)
        post.update(message=text, edit_at=at, update_at=at)
        self._broadcast("post_edited", {"post": json.dumps(post)}, post["channel_id"])
        return post

    def react(self, post_id: str, emoji: str, *, user: str, create_at: int | None = None) -> None:
        """`user` reacts (`create_at`: what the client put in its `POST /reactions`, which
        the server keeps when it is not 0)."""
        post = self.posts[post_id]
        reaction = {
            "user_id": user,
            "post_id": post_id,
            "emoji_name": emoji,
            "create_at": create_at or now_ms(),
            "channel_id": post["channel_id"],
        }
        self._broadcast("reaction_added", {"reaction": json.dumps(reaction)}, post["channel_id"])

    def _posted(self, channel: Channel, post: JSON, *, mentions: list[str] | None) -> None:
        user = self.users.get(post["user_id"], {})
        data: JSON = {
            "channel_display_name": channel.name,
            "channel_name": channel.name,
            "channel_type": channel.type,
            "post": dumps(post),
            "sender_name": f"@{user.get('username', '')}",
            "set_online": True,
            "team_id": "",
        }
        if mentions:
            data["mentions"] = json.dumps(mentions)
        self._broadcast("posted", data, channel.id)

    def _broadcast(self, event: str, data: JSON, channel_id: str) -> None:
        for s in self._sockets:
            if not s.ready:
                continue
            s.seq += 1
            frame = {
                "event": event,
                "data": data,
                "broadcast": {
                    "omit_users": None,
                    "user_id": "",
                    "channel_id": channel_id,
                    "team_id": "",
                    "connection_id": "",
                    "omit_connection_id": "",
                },
                "seq": s.seq,
            }
            if self._lose:
                continue
            s.outgoing.put_nowait(frame)
            if self._duplicate:
                s.outgoing.put_nowait(frame)
        if self._lose:
            self._lose -= 1
        elif self._duplicate:
            self._duplicate -= 1
        self._changes.notify()

    async def press(
        self, post_id: str, index: int, *, user: str, context: JSON | None = None
    ) -> tuple[int, str]:
        """Press button `index` of post `post_id` as `user`: the server's POST to the
        action's integration URL (`context` replaces the action's, to forge one)."""
        post = self.posts[post_id]
        actions = [
            a for att in post["props"].get("attachments", []) for a in att.get("actions", [])
        ]
        action = actions[index]
        integration = action["integration"]
        body = {
            "user_id": user,
            "user_name": self.users.get(user, {}).get("username", ""),
            "channel_id": post["channel_id"],
            "channel_name": self.channels[post["channel_id"]].name,
            "team_id": "",
            "team_domain": "",
            "post_id": post_id,
            "trigger_id": new_id(),
            "type": "button",
            "data_source": "",
            "context": integration.get("context") if context is None else context,
        }
        async with aiohttp.ClientSession() as http, http.post(integration["url"], json=body) as r:
            return r.status, await r.text()

    # -- faults -------------------------------------------------------------------------------

    def rate_limit(self, channel_id: str, reset: float, times: int = 1) -> None:
        self._rate.setdefault(channel_id, []).extend([reset] * times)

    def fail_posts(self, status: int, times: int = 1) -> None:
        self._fail.extend([status] * times)

    def drop_connections(self) -> None:
        for s in list(self._sockets):
            if s.transport is not None:
                s.transport.abort()

    def forget_pending(self) -> None:
        """The pending-post window passes: a repeated `pending_post_id` makes a new post."""
        self._pending.clear()

    def lose_next_event(self, count: int = 1) -> None:
        self._lose += count

    def duplicate_next_event(self) -> None:
        self._duplicate += 1

    def clear_faults(self) -> None:
        """Every 429, failure, lost and duplicated event not yet used is forgotten."""
        self._rate.clear()
        self._fail.clear()
        self._lose = 0
        self._duplicate = 0

    # -- reading what happened ----------------------------------------------------------------

    def texts_in(self, channel_id: str) -> list[str]:
        return [p["message"] for p in self.posted if p["channel_id"] == channel_id]

    def shown_in(self, channel_id: str) -> list[str]:
        return [
            self.posts[p["id"]]["message"] for p in self.posted if p["channel_id"] == channel_id
        ]

    @property
    def connected(self) -> int:
        return sum(1 for s in self._sockets if s.ready)

    # -- REST ---------------------------------------------------------------------------------

    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {self.token}"

    @staticmethod
    def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
        body = {
            "id": "api.context.error",
            "message": message,
            "detailed_error": "",
            "request_id": new_id(),
            "status_code": status,
        }
        return web.json_response(body, status=status, headers=headers)

    def _refuse(self, request: web.Request) -> web.Response | None:
        if not self._authorized(request):
            return self._error(401, "Invalid or expired session, please login again.")
        return None

    async def _me(self, request: web.Request) -> web.Response:
        return self._refuse(request) or web.json_response(
            {**self.users[BOT_ID], "roles": "system_user", "create_at": 1}
        )

    async def _channel(self, request: web.Request) -> web.Response:
        if (refused := self._refuse(request)) is not None:
            return refused
        channel = self.channels.get(request.match_info["id"])
        if channel is None:
            return self._error(404, "Unable to find the existing channel.")
        return web.json_response(
            {
                "id": channel.id,
                "type": channel.type,
                "name": channel.name,
                "display_name": channel.name,
            }
        )

    @staticmethod
    def _stored(post: JSON) -> JSON:
        return {**post, "pending_post_id": ""}

    async def _channel_posts(self, request: web.Request) -> web.Response:
        if (refused := self._refuse(request)) is not None:
            return refused
        channel = self.channels.get(request.match_info["id"])
        if channel is None:
            return self._error(404, "Unable to find the existing channel.")
        posts = [self.posts[p] for p in channel.posts]
        since = request.query.get("since")
        if since is not None:
            self.since_reads.append((channel.id, int(since)))
            posts = [p for p in posts if p["update_at"] >= int(since)]
        else:
            per_page = int(request.query.get("per_page", "60"))
            page = int(request.query.get("page", "0"))
            posts = list(reversed(posts))[page * per_page : (page + 1) * per_page]
        order = [p["id"] for p in sorted(posts, key=lambda p: -p["create_at"])]
        self._changes.notify()
        return web.json_response(
            {
                "order": order,
                "posts": {p["id"]: self._stored(p) for p in posts},
                "next_post_id": "",
                "prev_post_id": "",
            },
            dumps=dumps,
        )

    async def _post(self, request: web.Request) -> web.Response:
        if (refused := self._refuse(request)) is not None:
            return refused
        post = self.posts.get(request.match_info["id"])
        if post is None:
            return self._error(404, "Unable to find the existing post.")
        return web.json_response(self._stored(post), dumps=dumps)

    async def _create_post(self, request: web.Request) -> web.Response:
        if (refused := self._refuse(request)) is not None:
            return refused
        body = await request.json()
        self.post_requests += 1
        self._changes.notify()
        channel = self.channels.get(str(body.get("channel_id")))
        if channel is None:
            return self._error(403, "You do not have the appropriate permissions.")
        waits = self._rate.get(channel.id)
        if waits:
            reset = waits.pop(0)
            return self._error(
                429,
                "Too many requests. Please try again later.",
                {
                    "X-Ratelimit-Limit": "10",
                    "X-Ratelimit-Remaining": "0",
                    "X-Ratelimit-Reset": str(int(reset) if reset == int(reset) else reset),
                },
            )
        if self._fail:
            return self._error(self._fail.pop(0), "We encountered an error.")
        pending = str(body.get("pending_post_id") or "")
        seen = self._pending.get(pending) if pending else None
        if seen is not None and time.monotonic() - seen[0] < DEDUPE_SECONDS:
            return web.json_response(
                {**self.posts[seen[1]], "pending_post_id": pending}, status=201
            )
        post = self._new_post(
            channel.id,
            BOT_ID,
            str(body.get("message") or ""),
            root_id=body.get("root_id") or "",
            props=body.get("props") or {},
            file_ids=body.get("file_ids") or (),
        )
        self._store(channel, post)
        if pending:
            self._pending[pending] = (time.monotonic(), post["id"])
        self.posted.append(post)
        self._posted(channel, post, mentions=None)
        return web.json_response({**post, "pending_post_id": pending}, status=201)

    async def _patch(self, request: web.Request) -> web.Response:
        if (refused := self._refuse(request)) is not None:
            return refused
        post = self.posts.get(request.match_info["id"])
        if post is None:
            return self._error(404, "Unable to find the existing post.")
        body = await request.json()
        if "message" in body:
            at = max(now_ms(), post["update_at"] + 1)
            post.update(message=str(body["message"]), edit_at=at, update_at=at)
            self.edits.append((post["id"], post["message"]))
        self._changes.notify()
        return web.json_response(self._stored(post))

    async def _upload(self, request: web.Request) -> web.Response:
        if (refused := self._refuse(request)) is not None:
            return refused
        reader = await request.multipart()
        channel = ""
        infos = []
        while (part := await reader.next()) is not None:
            if not isinstance(part, aiohttp.BodyPartReader):
                continue
            if part.name == "channel_id":
                channel = (await part.read()).decode()
            elif part.name == "files":
                data = bytes(await part.read())
                name = part.filename or "file"
                mime = part.headers.get("Content-Type", "application/octet-stream")
                file_id = self.add_file(data, name, mime, BOT_ID)
                self.uploads.append((channel, name, data))
                infos.append(self.files[file_id][0])
        if channel not in self.channels:
            return self._error(403, "You do not have the appropriate permissions.")
        self._changes.notify()
        return web.json_response({"file_infos": infos, "client_ids": []}, status=201)

    async def _download(self, request: web.Request) -> web.StreamResponse:
        if (refused := self._refuse(request)) is not None:
            return refused
        found = self.files.get(request.match_info["id"])
        if found is None:
            return self._error(404, "Unable to find the file.")
        self.downloads.append(request.match_info["id"])
        self._changes.notify()
        return web.Response(body=found[1], content_type=str(found[0]["mime_type"]))

    async def _react(self, request: web.Request) -> web.Response:
        if (refused := self._refuse(request)) is not None:
            return refused
        body = await request.json()
        self.reactions.append(body)
        self._changes.notify()
        return web.json_response({**body, "create_at": now_ms()}, status=201)

    async def _unreact(self, request: web.Request) -> web.Response:
        if (refused := self._refuse(request)) is not None:
            return refused
        self.removed_reactions.append((request.match_info["post"], request.match_info["emoji"]))
        self._changes.notify()
        return web.json_response({"status": "OK"})

    async def _typing(self, request: web.Request) -> web.Response:
        if (refused := self._refuse(request)) is not None:
            return refused
        body = await request.json()
        self.typing.append(str(body.get("channel_id")))
        self._changes.notify()
        return web.json_response({"status": "OK"})

    # -- the websocket ------------------------------------------------------------------------

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(autoping=True, heartbeat=None, max_msg_size=0)
        await ws.prepare(request)
        transport = request.transport
        sock = _Socket(ws, transport if isinstance(transport, asyncio.Transport) else None)
        self._sockets.append(sock)
        self.connections += 1
        writer = asyncio.create_task(self._write(sock))
        if self._authorized(request):
            self._hello(sock)
        try:
            async for frame in ws:
                if frame.type is WSMsgType.TEXT:
                    await self._action(sock, json.loads(frame.data))
        except ConnectionError:
            pass
        finally:
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            self._sockets.remove(sock)
            self._changes.notify()
        return ws

    def _hello(self, sock: _Socket) -> None:
        sock.ready = True
        sock.outgoing.put_nowait(
            {
                "event": "hello",
                "data": {"connection_id": new_id(), "server_version": SERVER_VERSION},
                "broadcast": {
                    "omit_users": None,
                    "user_id": BOT_ID,
                    "channel_id": "",
                    "team_id": "",
                },
                "seq": 0,
            }
        )
        self._changes.notify()

    async def _action(self, sock: _Socket, request: JSON) -> None:
        if request.get("action") != "authentication_challenge":
            sock.outgoing.put_nowait({"status": "OK", "seq_reply": request.get("seq")})
            return
        data = request.get("data")
        token = data.get("token") if isinstance(data, dict) else None
        if token != self.token:
            sock.outgoing.put_nowait(
                {
                    "status": "FAIL",
                    "seq_reply": request.get("seq"),
                    "error": {"id": "api.web_socket_router.not_authenticated.app_error"},
                }
            )
            return
        sock.outgoing.put_nowait({"status": "OK", "seq_reply": request.get("seq")})
        if not sock.ready:
            self._hello(sock)

    async def _write(self, sock: _Socket) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            while True:
                frame = await sock.outgoing.get()
                await sock.ws.send_str(json.dumps(frame))
