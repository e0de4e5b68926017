"""`FakeSlackServer`: the fake Slack itself (see the package's docstring)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import functools
import itertools
import json
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from http import HTTPStatus
from typing import Any, Literal
from urllib.parse import quote

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tests.fakes.control import control_mounts
from tests.fakes.params import hang_up, jsonable
from tests.fakes.serving import LocalServer, Served, WebSocketListener
from tests.fakes.slack import control_routes, delivery, methods
from tests.fakes.slack.records import (
    _CHANNEL_ID,
    _USER_ID,
    DEFAULT_ACK_TIMEOUT,
    DEFAULT_APP_TOKEN,
    DEFAULT_BOT_TOKEN,
    DEFAULT_MAX_RETRIES,
    DEFAULT_SIGNING_SECRET,
    DEFAULT_USER,
    JSON,
    MAX_TEXT_LENGTH,
    STALE_AFTER,
    Ack,
    Call,
    ChannelKind,
    Deleted,
    Download,
    Envelope,
    HttpDelivery,
    Injected,
    Posted,
    ReactionChange,
    Rejected,
    SignedRequest,
    SocketInfo,
    Stage,
    StoredFile,
    Updated,
    Upload,
    _ApiError,
    _Channel,
    _Event,
    _Faults,
    _Handler,
    _Params,
    _random_id,
    _read_params,
    _rich_text,
    _Socket,
    _User,
    slack_signature,
)
from tests.fakes.waiting import Changes, Waitable

# -- the server -----------------------------------------------------------------------------------


class FakeSlackServer(Served, Waitable):
    """A fake Slack workspace with one app, for one test (or one standalone process).

    Single event loop only: the server runs as tasks of the loop that enters it, and the Python
    API (injection, faults, waits) must be called from that loop.
    """

    def __init__(
        self,
        bot_token: str = DEFAULT_BOT_TOKEN,
        app_token: str = DEFAULT_APP_TOKEN,
        *,
        signing_secret: str = DEFAULT_SIGNING_SECRET,
        verification_token: str = "fake-verification-token",
        team_id: str = "T0HERALD",
        team: str = "herald-test",
        app_id: str = "A1",
        bot_user_id: str = "UBOT",
        bot_id: str = "BBOT",
        bot_name: str = "herald",
        ack_timeout: float = DEFAULT_ACK_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        events_timeout: float = DEFAULT_ACK_TIMEOUT,
        events_retry_delay: float = 0.2,
        echo_bot_messages: bool = False,
        port: int = 0,
        ws_port: int = 0,
        log_level: str | None = None,
    ) -> None:
        if not ack_timeout > 0:
            raise ValueError("ack_timeout must be > 0")
        self.bot_token = bot_token
        self.app_token = app_token
        self.signing_secret = signing_secret
        self.verification_token = verification_token
        self.team_id = team_id
        self.team = team
        self.app_id = app_id
        self.bot_user_id = bot_user_id
        self.bot_id = bot_id
        self.bot_name = bot_name
        self.ack_timeout = ack_timeout
        self.max_retries = max_retries
        self.events_timeout = events_timeout
        self.events_retry_delay = events_retry_delay
        self.echo_bot_messages = echo_bot_messages
        """Queue a `message` event for each of the bot's own posts, as Slack does for apps
        subscribed to the channel's messages."""
        self.events_url: str | None = None
        """Where events are POSTed (Events API); None: Socket Mode."""
        self.interactivity_url: str | None = None
        """Where button presses are POSTed over HTTP (None: `events_url`)."""

        self.calls: list[Call] = []
        """Every Web API request, any token, in arrival order."""
        self.rejected: list[Rejected] = []
        """Every Web API request answered with an error, in order."""
        self.posted: list[Posted] = []
        self.updates: list[Updated] = []
        self.deleted: list[Deleted] = []
        self.reactions: list[ReactionChange] = []
        """Every accepted reactions.add / reactions.remove, in order."""
        self.uploads: list[Upload] = []
        self.downloads: list[Download] = []
        self.envelopes: list[Envelope] = []
        """Every Socket Mode envelope sent, in order."""
        self.acks: list[Ack] = []
        self.acked: list[str] = []
        """Event ids in the order they were acknowledged (socket ack or 2xx answer)."""
        self.expired: list[str] = []
        """Event ids given up after `max_retries` redeliveries."""
        self.sockets: list[SocketInfo] = []
        """Every websocket opened, in order."""
        self.max_open_sockets = 0
        """The most websockets ever open at once."""
        self.refused_connections = 0
        """apps.connections.open calls and handshakes refused by `refuse_connections`."""
        self.http_deliveries: list[HttpDelivery] = []

        self._port = port
        self._ws_port = ws_port
        self._log_level = log_level
        self._events: dict[str, _Event] = {}
        self._pending: list[_Event] = []
        self._seq = itertools.count(1)
        self._envelope_events: dict[str, _Event] = {}
        self._envelopes_by_id: dict[str, Envelope] = {}
        self._open: list[_Socket] = []
        self._socket_ids = itertools.count(1)
        self._round_robin = 0
        self._tickets: set[str] = set()
        self._messages: dict[tuple[str, str], JSON] = {}
        self._bot_messages: list[tuple[str, str]] = []
        self._current_reactions: dict[tuple[str, str], list[str]] = {}
        self._channels: dict[str, _Channel] = {}
        self._removed_channels: set[str] = set()
        self._users: dict[str, _User] = {}
        self._files: dict[str, StoredFile] = {}
        self._upload_slots: dict[str, JSON] = {}
        self._last_ts = 0
        self._faults = _Faults()
        self._methods: dict[str, tuple[str, _Handler]] = {
            "auth.test": ("bot", functools.partial(methods.auth_test, self)),
            "apps.connections.open": (
                "app",
                functools.partial(methods.apps_connections_open, self),
            ),
            "chat.postMessage": ("bot", functools.partial(methods.chat_post_message, self)),
            "chat.update": ("bot", functools.partial(methods.chat_update, self)),
            "chat.delete": ("bot", functools.partial(methods.chat_delete, self)),
            "reactions.add": ("bot", functools.partial(methods.reactions_add, self)),
            "reactions.remove": ("bot", functools.partial(methods.reactions_remove, self)),
            "conversations.info": ("bot", functools.partial(methods.conversations_info, self)),
            "users.info": ("bot", functools.partial(methods.users_info, self)),
            "files.getUploadURLExternal": (
                "bot",
                functools.partial(methods.files_get_upload_url, self),
            ),
            "files.completeUploadExternal": (
                "bot",
                functools.partial(methods.files_complete_upload, self),
            ),
        }
        self._changes = Changes()
        self._local: LocalServer | None = None
        self._listener: WebSocketListener | None = None
        self._http: httpx.AsyncClient | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._timers: set[asyncio.TimerHandle] = set()

    # -- where it listens -------------------------------------------------------------------------

    @property
    def ws_port(self) -> int:
        """The Socket Mode listener's TCP port."""
        if self._listener is None:
            raise RuntimeError("the server is not started")
        return self._listener.port

    @property
    def base_url(self) -> str:
        """`AsyncWebClient(base_url=...)`: `http://127.0.0.1:<port>/api/`."""
        return f"{self.url}/api/"

    # -- sockets ----------------------------------------------------------------------------------

    @property
    def open_sockets(self) -> int:
        """How many websockets are open right now (silenced ones included)."""
        return len(self._open)

    @property
    def sockets_opened(self) -> int:
        """How many websockets were ever opened."""
        return len(self.sockets)

    @property
    def connected(self) -> bool:
        """Whether an envelope sent now would go out: a socket said hello and is usable."""
        return any(s.deliverable for s in self._open)

    async def wait_connected(self, timeout: float = 10.0, *, opened: int = 1) -> None:
        """Wait until at least `opened` sockets were opened and one is usable (TimeoutError)."""
        await self.wait_for(lambda: self.sockets_opened >= opened and self.connected, timeout)

    # -- inbound ----------------------------------------------------------------------------------

    def add_channel(
        self,
        channel_id: str,
        *,
        name: str | None = None,
        kind: ChannelKind | None = None,
        is_member: bool = True,
        user: str | None = None,
    ) -> JSON:
        """Describe a channel (what conversations.info answers); ValueError for a bad id.

        `kind` defaults from the id: D a DM ("im"), C "channel", G "group" (private).
        `is_member=False`: the bot's posts there answer `not_in_channel`.
        """
        if not _CHANNEL_ID.match(channel_id):
            raise ValueError(f"not a channel id: {channel_id!r}")
        self._removed_channels.discard(channel_id)
        channel = self._channel(channel_id)
        channel.kind = kind or channel.kind
        channel.name = name if name is not None else channel.name
        channel.is_member = is_member
        channel.user = user if user is not None else channel.user
        return channel.to_json()

    def remove_channel(self, channel_id: str) -> None:
        """From now on, `channel_id` answers `channel_not_found`."""
        self._channels.pop(channel_id, None)
        self._removed_channels.add(channel_id)

    def add_user(
        self,
        user_id: str,
        name: str | None = None,
        *,
        real_name: str | None = None,
        display_name: str | None = None,
    ) -> JSON:
        """Describe a user (what users.info answers). Unknown U… ids exist with made-up names."""
        if not _USER_ID.match(user_id):
            raise ValueError(f"not a user id: {user_id!r}")
        handle = name or f"user.{user_id.lower()}"
        real = real_name or handle.replace(".", " ").title()
        self._users[user_id] = _User(user_id, handle, real, display_name or handle)
        return self._users[user_id].to_json(self.team_id)

    def add_file(
        self,
        content: bytes,
        name: str = "file.bin",
        mimetype: str = "application/octet-stream",
        *,
        title: str | None = None,
        user: str = DEFAULT_USER,
    ) -> JSON:
        """Register a file a user shared; return its file object (for `inject_message(files=)`).

        Its `url_private` / `url_private_download` serve `content` to the bot token only.
        """
        stored = self._store_file(
            content, name=name, mimetype=mimetype, title=title or name, user=user
        )
        return stored.to_json()

    def file(self, file_id: str) -> StoredFile:
        """A registered or uploaded file; KeyError if unknown."""
        return self._files[file_id]

    def message(self, channel: str, ts: str) -> JSON:
        """The current state of a message (a copy); KeyError if unknown or deleted."""
        return copy.deepcopy(self._messages[(channel, ts)])

    def inject_message(
        self,
        channel: str,
        text: str = "",
        *,
        user: str = DEFAULT_USER,
        thread_ts: str | None = None,
        files: Sequence[str | Mapping[str, Any]] = (),
        ts: str | None = None,
        channel_type: ChannelKind | None = None,
        event_id: str | None = None,
    ) -> Injected:
        """A user's message: queue its `message` event; return the event id and the ts.

        `channel_type` defaults from the channel (D… "im", C… "channel", G… "group").
        `files`: file objects or ids of `add_file()` (subtype `file_share`). KeyError for an
        unknown file id.
        """
        message = self._user_message(
            channel, text, user=user, thread_ts=thread_ts, files=files, ts=ts
        )
        made = self._queue(self._message_event(message, channel, channel_type), event_id)
        return Injected(made, message["ts"], channel, (made,))

    def inject_app_mention(
        self,
        channel: str,
        text: str = "",
        *,
        user: str = DEFAULT_USER,
        thread_ts: str | None = None,
        files: Sequence[str | Mapping[str, Any]] = (),
        ts: str | None = None,
        with_message: bool = True,
    ) -> Injected:
        """A user's message mentioning the bot: an `app_mention` event, then (as Slack sends
        both to an app subscribed to the channel's messages) the `message` event of the same
        message with another event id. `<@bot>` is put in front of `text` when missing."""
        mention = f"<@{self.bot_user_id}>"
        if mention not in text:
            text = f"{mention} {text}".rstrip()
        message = self._user_message(
            channel, text, user=user, thread_ts=thread_ts, files=files, ts=ts
        )
        event = {k: v for k, v in message.items() if k not in ("subtype", "upload")}
        event.update(type="app_mention", channel=channel, event_ts=message["ts"])
        ids = [self._queue(event)]
        if with_message:
            ids.append(self._queue(self._message_event(message, channel, None)))
        return Injected(ids[0], message["ts"], channel, tuple(ids))

    def inject_edit(
        self, channel: str, ts: str, text: str, *, event_id: str | None = None
    ) -> Injected:
        """The author edited message `ts`: a `message_changed` event. KeyError if unknown."""
        previous = self._messages[(channel, ts)]
        edit_ts = self._next_ts()
        edited = copy.deepcopy(previous)
        edited.update(text=text, edited={"user": previous.get("user", ""), "ts": edit_ts})
        if "blocks" in edited:
            edited["blocks"] = _rich_text(text)
        edited["source_team"] = edited["user_team"] = self.team_id
        self._messages[(channel, ts)] = copy.deepcopy(edited)
        event: JSON = {
            "type": "message",
            "subtype": "message_changed",
            "message": edited,
            "previous_message": copy.deepcopy(previous),
            "channel": channel,
            "hidden": True,
            "ts": edit_ts,
            "event_ts": edit_ts,
            "channel_type": self._injected_channel(channel).kind,
        }
        made = self._queue(event, event_id)
        return Injected(made, ts, channel, (made,))

    def inject_delete(self, channel: str, ts: str, *, event_id: str | None = None) -> Injected:
        """Message `ts` was deleted: a `message_deleted` event. KeyError if unknown."""
        previous = self._messages.pop((channel, ts))
        self._current_reactions.pop((channel, ts), None)
        now_ts = self._next_ts()
        event: JSON = {
            "type": "message",
            "subtype": "message_deleted",
            "hidden": True,
            "deleted_ts": ts,
            "channel": channel,
            "previous_message": previous,
            "ts": now_ts,
            "event_ts": now_ts,
            "channel_type": self._injected_channel(channel).kind,
        }
        made = self._queue(event, event_id)
        return Injected(made, ts, channel, (made,))

    def inject_bot_message(
        self,
        channel: str,
        text: str,
        *,
        bot_id: str = "B0OTHERBOT",
        username: str = "otherbot",
        thread_ts: str | None = None,
    ) -> Injected:
        """Another integration's message: subtype `bot_message`, `bot_id`, no `user`."""
        ts = self._next_ts()
        message: JSON = {
            "type": "message",
            "subtype": "bot_message",
            "text": text,
            "ts": ts,
            "bot_id": bot_id,
            "username": username,
        }
        if thread_ts is not None:
            message["thread_ts"] = thread_ts
        self._messages[(channel, ts)] = copy.deepcopy(message)
        made = self._queue(self._message_event(message, channel, None))
        return Injected(made, ts, channel, (made,))

    def inject_own_message(
        self, channel: str, text: str, *, thread_ts: str | None = None
    ) -> Injected:
        """The `message` event of a message the bot itself posted (`user` is the bot user)."""
        ts = self._next_ts()
        message = self._bot_message(text, ts, thread_ts)
        self._messages[(channel, ts)] = copy.deepcopy(message)
        made = self._queue(self._message_event(message, channel, None))
        return Injected(made, ts, channel, (made,))

    def inject_event(self, event: Mapping[str, Any], *, event_id: str | None = None) -> Injected:
        """Queue `event` as is, in an event_callback (`event_ts` added when missing)."""
        raw = copy.deepcopy(dict(event))
        ts = str(raw.get("ts") or raw.get("event_ts") or self._next_ts())
        raw.setdefault("event_ts", ts)
        made = self._queue(raw, event_id)
        return Injected(made, ts, str(raw.get("channel", "")), (made,))

    def event_callback(self, event: Mapping[str, Any], *, event_id: str | None = None) -> JSON:
        """The event_callback body Slack wraps `event` in (nothing is queued)."""
        event = dict(event)
        event_ts = event.get("event_ts") or event.get("ts") or time.time()
        try:
            event_time = int(float(event_ts))
        except (TypeError, ValueError):
            event_time = int(time.time())
        context = base64.b64encode(
            json.dumps({"tid": self.team_id, "cid": event.get("channel", "")}).encode()
        )
        return {
            "token": self.verification_token,
            "team_id": self.team_id,
            "context_team_id": self.team_id,
            "context_enterprise_id": None,
            "api_app_id": self.app_id,
            "event": event,
            "type": "event_callback",
            "event_id": event_id or _random_id("Ev"),
            "event_time": event_time,
            "authorizations": [
                {
                    "enterprise_id": None,
                    "team_id": self.team_id,
                    "user_id": self.bot_user_id,
                    "is_bot": True,
                    "is_enterprise_install": False,
                }
            ],
            "is_ext_shared_channel": False,
            "event_context": "4-" + context.decode(),
        }

    @property
    def pending(self) -> list[str]:
        """Event ids not acknowledged and not given up yet, in injection order."""
        return [e.event_id for e in self._events.values() if not e.acked and not e.expired]

    def event(self, event_id: str) -> JSON:
        """The event_callback body of an injected event (a copy); KeyError if unknown."""
        return copy.deepcopy(self._events[event_id].body)

    async def wait_until_acked(self, *event_ids: str, timeout: float = 10.0) -> None:
        """Wait until these events (default: every one injected) are acknowledged.

        Raises TimeoutError after `timeout` seconds, RuntimeError as soon as one of them was
        given up (`max_retries` redeliveries unacknowledged), KeyError for an unknown event id.
        """
        events = [self._events[e] for e in event_ids] if event_ids else None

        def awaited() -> Iterable[_Event]:
            return events if events is not None else self._events.values()

        await self.wait_for(lambda: all(e.acked or e.expired for e in awaited()), timeout)
        expired = [e.event_id for e in awaited() if e.expired]
        if expired:
            raise RuntimeError(f"given up unacknowledged: {expired}")

    # -- Events API -------------------------------------------------------------------------------

    def use_events_api(self, url: str | None, *, interactivity_url: str | None = None) -> None:
        """POST events to `url` from now on (the Events API); None: back to Socket Mode.
        Button presses go to `interactivity_url` (default: `url`), form-encoded.

        Envelopes already sent on a socket stay there until acknowledged or timed out.
        """
        self.events_url = url
        self.interactivity_url = interactivity_url
        self._dispatch()

    def press_button(
        self, channel: str, ts: str, value: str, *, user: str = DEFAULT_USER
    ) -> Injected:
        """`user` pressed the button whose `value` is `value` on the bot's message `ts`: a
        `block_actions` payload, sent as Slack sends interactivity (an `interactive` envelope in
        Socket Mode; a signed form POST with a `payload` field over HTTP). Returns the made-up
        id under which its acknowledgement is tracked. KeyError when the message or the button
        is unknown."""
        message = self._messages[(channel, ts)]
        found = [
            (block, element)
            for block in message.get("blocks") or []
            if block.get("type") == "actions"
            for element in block.get("elements") or []
            if element.get("type") == "button" and element.get("value") == value
        ]
        if not found:
            raise KeyError(f"no button with value {value!r} on {channel}:{ts}")
        block, element = found[0]
        person = self._user(user)
        name = person.name if person is not None else user
        container: JSON = {
            "type": "message",
            "message_ts": ts,
            "channel_id": channel,
            "is_ephemeral": False,
        }
        if message.get("thread_ts"):
            container["thread_ts"] = message["thread_ts"]
        trigger = f"{secrets.randbelow(10**10)}.{secrets.randbelow(10**10)}.{secrets.token_hex(16)}"
        payload: JSON = {
            "type": "block_actions",
            "user": {"id": user, "username": name, "name": name, "team_id": self.team_id},
            "api_app_id": self.app_id,
            "token": self.verification_token,
            "container": container,
            "trigger_id": trigger,
            "team": {"id": self.team_id, "domain": self.team},
            "enterprise": None,
            "is_enterprise_install": False,
            "channel": {"id": channel, "name": self._injected_channel(channel).display_name},
            "message": copy.deepcopy(message),
            "state": {"values": {}},
            "response_url": f"{self.url}/actions/{self.team_id}/{secrets.token_hex(8)}",
            "actions": [
                {
                    **copy.deepcopy(element),
                    "block_id": block.get("block_id", ""),
                    "action_ts": self._next_ts(),
                }
            ],
        }
        made = self.inject_interactive(payload)
        return Injected(made, ts, channel, (made,))

    def inject_interactive(self, payload: Mapping[str, Any]) -> str:
        """Queue an interactivity payload as is (a shortcut, a form, a press); return the
        made-up id under which its acknowledgement is tracked."""
        return self._queue_payload(copy.deepcopy(dict(payload)), _random_id("Ia"), "interactive")

    def signed_request(
        self,
        body: Mapping[str, Any] | bytes,
        *,
        timestamp: int | None = None,
        stale: bool = False,
        wrong_signature: bool = False,
        retry_num: int | None = None,
        retry_reason: str | None = None,
    ) -> SignedRequest:
        """An Events API request as Slack sends it, for a test to POST itself.

        `stale`: timestamped 10 minutes ago (signed correctly); `wrong_signature`: signed with
        another secret; `retry_num` / `retry_reason`: the retry headers.
        """
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        when = int(time.time()) if timestamp is None else timestamp
        if stale:
            when -= 2 * STALE_AFTER
        secret = "not-" + self.signing_secret if wrong_signature else self.signing_secret
        headers = {
            "Content-Type": "application/json",
            "X-Slack-Request-Timestamp": str(when),
            "X-Slack-Signature": slack_signature(secret, str(when), raw),
        }
        if retry_num is not None:
            headers["X-Slack-Retry-Num"] = str(retry_num)
            headers["X-Slack-Retry-Reason"] = retry_reason or "http_timeout"
        return SignedRequest(raw, headers)

    def url_verification_request(self, challenge: str | None = None) -> SignedRequest:
        """The signed `url_verification` request Slack sends when the Request URL is set."""
        body = {
            "token": self.verification_token,
            "challenge": challenge or secrets.token_urlsafe(24),
            "type": "url_verification",
        }
        return self.signed_request(body)

    async def verify_events_url(self, url: str) -> bool:
        """Send a url_verification to `url`: True when it answers 2xx echoing the challenge
        (as JSON `{"challenge": ...}` or plain text), as Slack requires."""
        challenge = secrets.token_urlsafe(24)
        request = self.url_verification_request(challenge)
        response = await self._client().post(url, content=request.body, headers=request.headers)
        if not 200 <= response.status_code < 300:
            return False
        with contextlib.suppress(ValueError):
            answer = response.json()
            if isinstance(answer, dict):
                return answer.get("challenge") == challenge
        return response.text.strip() == challenge

    # -- outbound ---------------------------------------------------------------------------------

    def texts_in(self, channel: str, *, thread_ts: str | None = None) -> list[str]:
        """What users see of the bot's messages in `channel` (after updates, without deleted
        ones) in post order; with `thread_ts`, only those in that thread."""
        texts = []
        for key in self._bot_messages:
            message = self._messages.get(key)
            if key[0] != channel or message is None:
                continue
            if thread_ts is not None and message.get("thread_ts") != thread_ts:
                continue
            texts.append(str(message.get("text", "")))
        return texts

    def reactions_on(self, channel: str, ts: str) -> list[str]:
        """The bot's reactions on a message now, in the order they were added."""
        return list(self._current_reactions.get((channel, ts), []))

    async def wait_for_posted(
        self, expected: int | Callable[[Posted], bool], timeout: float = 10.0
    ) -> list[Posted]:
        """Wait for posts: a count (return all posts) or a predicate (return the matches).

        Raises TimeoutError after `timeout` seconds.
        """
        return await self._changes.wait_for_items(self.posted, expected, timeout)

    # -- faults -----------------------------------------------------------------------------------

    def rate_limit(self, target: str, count: int = 1, retry_after: int = 1) -> None:
        """The next `count` calls of method `target` (a name with a dot, e.g.
        "chat.postMessage"; "*": any method) or about channel `target` (its `channel` /
        `channel_id` parameter) answer 429 with `Retry-After: retry_after` (whole seconds)."""
        if retry_after < 0:
            raise ValueError("retry_after must be >= 0")
        self._faults.rate_limits[target] = (count, int(retry_after))

    def fail(self, method: str, count: int = 1, status: int = 500) -> None:
        """The next `count` calls of `method` ("*": any) answer plain-text `status`, unprocessed."""
        self._faults.failures[method] = (count, status)

    def drop(self, method: str, count: int = 1) -> None:
        """The next `count` calls of `method` ("*": any) get their connection closed unanswered,
        unprocessed. (slack-sdk's default retry handler retries such a call once.)"""
        self._faults.drops[method] = count

    def drop_socket(self, socket_id: int | None = None) -> int:
        """Abort the open websocket(s) (`socket_id` or all): no close frame, as when the network
        fails. Envelopes in flight on them are redelivered after `ack_timeout`. Returns how many
        were dropped."""
        dropped = 0
        for sock in self._targets(socket_id):
            if sock.transport is not None:
                sock.transport.abort()
            self._mark_closed(sock, "dropped")
            dropped += 1
        return dropped

    def send_disconnect(
        self,
        reason: str = "refresh_requested",
        socket_id: int | None = None,
        *,
        close_after: float | None = None,
    ) -> int:
        """Send `{"type": "disconnect", "reason": reason}` on the open socket(s) (`socket_id` or
        all); no more envelopes go to them. With `close_after`, the server closes them (close
        frame) that many seconds later, as Slack does. Returns how many were told."""
        told = 0
        for sock in self._targets(socket_id):
            if sock.info.silenced:
                continue
            message = {
                "type": "disconnect",
                "reason": reason,
                "debug_info": {"host": f"applink-fake-{sock.info.id}"},
            }
            sock.outbox.put_nowait(json.dumps(message))
            sock.retiring = True
            sock.info.disconnect_reason = reason
            told += 1
            if close_after is not None:
                handle = asyncio.get_running_loop().call_later(
                    close_after,
                    functools.partial(delivery.close_later, self, sock),
                )
                self._timers.add(handle)
        self._changes.notify()
        self._dispatch()
        return told

    def silence_socket(self, socket_id: int | None = None) -> int:
        """The open socket(s) (`socket_id` or all) stay open but go silent: no envelopes, no
        pongs, acks ignored; the server still notices when the client hangs up. Sockets opened
        later are not affected. Returns how many were silenced."""
        silenced = 0
        for sock in self._targets(socket_id):
            sock.info.silenced = True
            silenced += 1
        self._changes.notify()
        self._dispatch()
        return silenced

    def ignore_acks(self, count: int = 1) -> None:
        """The next `count` acks are lost: their envelopes are redelivered after `ack_timeout`."""
        self._faults.ignore_acks = count

    def refuse_connections(self, count: int = 1, *, stage: Stage = "handshake") -> None:
        """Refuse the next `count` connections: at "open", apps.connections.open answers
        `{"ok": false, "error": "internal_error"}`; at "handshake", the websocket upgrade is
        answered 503 (the ticket stays usable)."""
        if stage == "open":
            self._faults.refuse_open = count
        else:
            self._faults.refuse_handshake = count

    def clear_faults(self) -> None:
        """Switch every counted fault off (silenced sockets stay silent)."""
        self._faults = _Faults()

    # -- state as JSON ----------------------------------------------------------------------------

    def state(self) -> JSON:
        """Everything a test inspects, as JSON (what `GET /control/state` answers)."""
        channels = dict.fromkeys(channel for channel, _ in self._bot_messages)
        reactions = {
            f"{channel}:{ts}": list(names)
            for (channel, ts), names in self._current_reactions.items()
            if names
        }
        uploads = [{**jsonable(u), "content": None, "size": len(u.content)} for u in self.uploads]
        return {
            "ok": True,
            "posted": jsonable(self.posted),
            "updates": jsonable(self.updates),
            "deleted": jsonable(self.deleted),
            "reactions": jsonable(self.reactions),
            "current_reactions": reactions,
            "uploads": uploads,
            "downloads": jsonable(self.downloads),
            "texts": {channel: self.texts_in(channel) for channel in channels},
            "calls": [call.method for call in self.calls],
            "rejected": jsonable(self.rejected),
            "envelopes": jsonable(self.envelopes),
            "acks": jsonable(self.acks),
            "acked": list(self.acked),
            "pending": self.pending,
            "expired": list(self.expired),
            "sockets": jsonable(self.sockets),
            "open_sockets": self.open_sockets,
            "max_open_sockets": self.max_open_sockets,
            "sockets_opened": self.sockets_opened,
            "connected": self.connected,
            "refused_connections": self.refused_connections,
            "events_url": self.events_url,
            "http_deliveries": jsonable(self.http_deliveries),
        }

    # -- lifecycle --------------------------------------------------------------------------------

    async def _start(self) -> None:
        self._local = LocalServer(self._app(), port=self._port, log_level=self._log_level)
        self._listener = WebSocketListener(
            functools.partial(delivery.socket_endpoint, self), self._ws_port, "/link/"
        )
        await self._local.start()
        await self._listener.start()

    async def _stop(self) -> None:
        self._changes.stop()  # ends control waits and Events API retries
        for handle in self._timers:
            handle.cancel()
        for event in self._events.values():
            if event.timer is not None:
                event.timer.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for sock in list(self._open):
            if sock.transport is not None:
                sock.transport.abort()
            self._mark_closed(sock, "server_stop")
        try:
            if self._listener is not None:
                await self._listener.stop()
            if self._local is not None:
                await self._local.stop()
        finally:
            if self._http is not None:
                await self._http.aclose()

    # -- internals: state -------------------------------------------------------------------------

    def _spawn(self, coroutine: Awaitable[Any]) -> None:
        async def run() -> None:
            await coroutine

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self.events_timeout, trust_env=False)
        return self._http

    def _next_ts(self) -> str:
        """A fresh message ts: the current time in microseconds, strictly increasing."""
        micros = max(time.time_ns() // 1000, self._last_ts + 1)
        self._last_ts = micros
        return f"{micros // 1_000_000}.{micros % 1_000_000:06d}"

    def _channel(self, channel_id: str) -> _Channel:
        """The channel `channel_id` (made up from its id when new); _ApiError if there is none."""
        channel = self._channels.get(channel_id)
        if channel is None:
            if channel_id in self._removed_channels or not _CHANNEL_ID.match(channel_id):
                raise _ApiError("channel_not_found")
            kind: ChannelKind = "group"
            if channel_id.startswith("D"):
                kind = "im"
            elif channel_id.startswith("C"):
                kind = "channel"
            channel = self._channels[channel_id] = _Channel(channel_id, kind)
        return channel

    def _user(self, user_id: str) -> _User | None:
        user = self._users.get(user_id)
        if user is None and _USER_ID.match(user_id):
            self.add_user(user_id)
            user = self._users[user_id]
        return user

    def _store_file(
        self,
        content: bytes,
        *,
        name: str,
        mimetype: str,
        title: str,
        user: str,
        file_id: str | None = None,
    ) -> StoredFile:
        file_id = file_id or _random_id("F")
        base = f"{self.url}/files-pri/{self.team_id}-{file_id}"
        stored = StoredFile(
            id=file_id,
            name=name,
            title=title,
            mimetype=mimetype,
            content=content,
            user=user,
            url_private=f"{base}/{quote(name)}",
            url_private_download=f"{base}/download/{quote(name)}",
            created=int(time.time()),
        )
        self._files[file_id] = stored
        return stored

    def _user_message(
        self,
        channel: str,
        text: str,
        *,
        user: str,
        thread_ts: str | None,
        files: Sequence[str | Mapping[str, Any]],
        ts: str | None,
    ) -> JSON:
        """A message a user typed (stored), without the event's own fields."""
        self._injected_channel(channel)
        file_objects = [self._files[f].to_json() if isinstance(f, str) else dict(f) for f in files]
        ts = ts or self._next_ts()
        message: JSON = {
            "user": user,
            "type": "message",
            "ts": ts,
            "client_msg_id": str(uuid.uuid4()),
            "text": text,
            "team": self.team_id,
            "blocks": _rich_text(text),
        }
        if file_objects:
            message.update(
                subtype="file_share", files=file_objects, upload=False, display_as_bot=False
            )
        if thread_ts is not None:
            message["thread_ts"] = thread_ts
            parent = self._messages.get((channel, thread_ts))
            if parent is not None:
                message["parent_user_id"] = parent.get("user", "")
        self._messages[(channel, ts)] = copy.deepcopy(message)
        return message

    def _bot_message(self, text: str, ts: str, thread_ts: str | None) -> JSON:
        """A message the bot posted, as Slack stores it."""
        message: JSON = {
            "user": self.bot_user_id,
            "type": "message",
            "ts": ts,
            "bot_id": self.bot_id,
            "app_id": self.app_id,
            "text": text,
            "team": self.team_id,
            "bot_profile": {
                "id": self.bot_id,
                "app_id": self.app_id,
                "name": self.bot_name,
                "deleted": False,
                "team_id": self.team_id,
            },
        }
        if thread_ts is not None:
            message["thread_ts"] = thread_ts
        return message

    def _message_event(self, message: JSON, channel: str, kind: ChannelKind | None) -> JSON:
        return {
            **copy.deepcopy(message),
            "channel": channel,
            "event_ts": message["ts"],
            "channel_type": kind or self._injected_channel(channel).kind,
        }

    def _injected_channel(self, channel_id: str) -> _Channel:
        """The channel of an injection; ValueError when there is none."""
        try:
            return self._channel(channel_id)
        except _ApiError as err:
            raise ValueError(f"no channel {channel_id!r} (removed, or not a channel id)") from err

    def _queue(self, event: JSON, event_id: str | None = None) -> str:
        """Wrap `event` in an event_callback and queue it for delivery; return its event id."""
        body = self.event_callback(event, event_id=event_id)
        return self._queue_payload(body, body["event_id"], "events_api")

    def _queue_payload(self, body: JSON, event_id: str, kind: str) -> str:
        """Queue a payload (an event_callback, or an interactivity payload) for delivery."""
        if event_id in self._events:
            raise ValueError(f"event {event_id} exists already")
        queued = _Event(next(self._seq), event_id, body, kind)
        self._events[queued.event_id] = queued
        self._pending.append(queued)
        self._changes.notify()
        self._dispatch()
        return queued.event_id

    def _dispatch(self) -> None:
        """Send pending events: to the Events API URL, or each to one usable socket."""
        if self.events_url is not None:
            while self._pending:
                self._spawn(delivery.deliver_over_http(self, self._pending.pop(0)))
            return
        while self._pending:
            targets = [s for s in self._open if s.deliverable]
            if not targets:
                return
            sock = targets[self._round_robin % len(targets)]
            self._round_robin += 1
            self._send_envelope(self._pending.pop(0), sock)

    def _send_envelope(self, event: _Event, sock: _Socket) -> None:
        attempt = event.attempts
        event.attempts += 1
        envelope = Envelope(
            envelope_id=str(uuid.uuid4()),
            event_id=event.event_id,
            event_type=(
                str(event.body["event"].get("type", ""))
                if event.kind == "events_api"
                else str(event.body.get("type", ""))
            ),
            retry_attempt=attempt,
            retry_reason="timeout" if attempt else "",
            socket_id=sock.info.id,
            sent_at=time.monotonic(),
        )
        self.envelopes.append(envelope)
        self._envelope_events[envelope.envelope_id] = event
        self._envelopes_by_id[envelope.envelope_id] = envelope
        event.envelope_ids.append(envelope.envelope_id)
        sock.info.envelopes += 1
        wire = {
            "envelope_id": envelope.envelope_id,
            "payload": event.body,
            "type": event.kind,
            "accepts_response_payload": False,
            "retry_attempt": attempt,
            "retry_reason": envelope.retry_reason,
        }
        sock.outbox.put_nowait(json.dumps(wire))
        if event.timer is not None:
            event.timer.cancel()
        event.timer = asyncio.get_running_loop().call_later(
            self.ack_timeout, self._ack_timed_out, event
        )
        self._changes.notify()

    def _ack_timed_out(self, event: _Event) -> None:
        event.timer = None
        if event.acked or self._changes.stopping.is_set():
            return
        if event.attempts > self.max_retries:
            event.expired = True
            self.expired.append(event.event_id)
        else:
            self._pending.append(event)
            self._pending.sort(key=lambda e: e.seq)
        self._changes.notify()
        self._dispatch()

    def _acknowledge(self, event: _Event) -> None:
        event.acked = True
        if event.timer is not None:
            event.timer.cancel()
            event.timer = None
        if event in self._pending:
            self._pending.remove(event)
        self.acked.append(event.event_id)

    def _on_text(self, sock: _Socket, data: str) -> None:
        """A text frame from a client: an ack (anything else is ignored, as Slack does)."""
        try:
            message = json.loads(data)
        except ValueError:
            return
        if not isinstance(message, dict) or not isinstance(message.get("envelope_id"), str):
            return
        envelope_id: str = message["envelope_id"]
        now = time.monotonic()
        event = self._envelope_events.get(envelope_id)
        outcome: Literal["accepted", "duplicate", "lost", "unknown"]
        if event is None:
            outcome = "unknown"
        elif sock.info.silenced:
            outcome = "lost"
        elif self._faults.ignore_acks > 0:
            self._faults.ignore_acks -= 1
            outcome = "lost"
        else:
            self._envelopes_by_id[envelope_id].acked_at = now
            outcome = "duplicate" if event.acked else "accepted"
            if not event.acked:
                self._acknowledge(event)
        self.acks.append(Ack(envelope_id, sock.info.id, now, outcome))
        self._changes.notify()

    def _targets(self, socket_id: int | None) -> list[_Socket]:
        return [s for s in self._open if socket_id is None or s.info.id == socket_id]

    def _mark_closed(self, sock: _Socket, reason: str) -> None:
        if sock.closed:
            return
        sock.info.closed_at = time.monotonic()
        sock.info.close_reason = reason
        if sock in self._open:
            self._open.remove(sock)
        self._changes.notify()

    # -- internals: Web API -----------------------------------------------------------------------

    def _app(self) -> Starlette:
        routes = [
            Route("/api/{method}", self._api_endpoint, methods=["GET", "POST"]),
            Route(
                "/upload/v1/{slot}",
                functools.partial(methods.upload_endpoint, self),
                methods=["POST"],
            ),
            Route(
                "/files-pri/{key}/{rest:path}",
                functools.partial(methods.download, self),
                methods=["GET"],
            ),
        ]
        routes += control_mounts(self, control_routes.ROUTES)
        return Starlette(routes=routes)

    def _token_kind(self, token: str | None) -> str | None:
        if token is None:
            return None
        for kind, known in (("bot", self.bot_token), ("app", self.app_token)):
            if secrets.compare_digest(token.encode(), known.encode()):
                return kind
        return "invalid"

    def _countdown(self, counters: dict[str, int], method: str) -> bool:
        for key in (method, "*"):
            if counters.get(key, 0) > 0:
                counters[key] -= 1
                return True
        return False

    def _take(self, faults: dict[str, tuple[int, int]], keys: Iterable[str]) -> int | None:
        """The value of the first counted fault among `keys`, counted down; None if none."""
        for key in keys:
            count, value = faults.get(key, (0, 0))
            if count > 0:
                faults[key] = (count - 1, value)
                return value
        return None

    async def _api_endpoint(self, request: Request) -> Response:
        method = str(request.path_params["method"])
        try:
            params = await _read_params(request)
        except _ApiError as err:
            return self._refuse(method, _Params({}, {}), err)
        header = request.headers.get("authorization", "")
        token = header[7:].strip() if header.lower().startswith("bearer ") else None
        form_token = params.values.pop("token", None)
        if not token and isinstance(form_token, str) and form_token:
            token = form_token
        self.calls.append(Call(method, params.logged(), token, time.monotonic()))
        self._changes.notify()
        entry = self._methods.get(method)
        if entry is None:
            return self._refuse(method, params, _ApiError("unknown_method", 404))
        needs, handler = entry
        kind = self._token_kind(token)
        if kind is None:
            return self._refuse(method, params, _ApiError("not_authed"))
        if kind == "invalid":
            return self._refuse(method, params, _ApiError("invalid_auth"))
        if kind != needs:
            return self._refuse(method, params, _ApiError("not_allowed_token_type"))
        if self._countdown(self._faults.drops, method):
            return await hang_up(request)
        status = self._take(self._faults.failures, (method, "*"))
        if status is not None:
            phrase = HTTPStatus(status).phrase
            self.rejected.append(
                Rejected(method, status, phrase, params.logged(), time.monotonic())
            )
            self._changes.notify()
            return PlainTextResponse(phrase, status_code=status)
        channel = params.string("channel") or params.string("channel_id") or ""
        retry_after = self._take(self._faults.rate_limits, (method, channel, "*"))
        if retry_after is not None:
            headers = {"Retry-After": str(retry_after)}
            return self._refuse(method, params, _ApiError("ratelimited", 429, headers))
        try:
            result = await handler(params)
        except _ApiError as err:
            return self._refuse(method, params, err)
        self._changes.notify()
        return JSONResponse({"ok": True, **result})

    def _refuse(self, method: str, params: _Params, err: _ApiError) -> Response:
        self.rejected.append(
            Rejected(method, err.status, err.error, params.logged(), time.monotonic())
        )
        self._changes.notify()
        body: JSON = {"ok": False, "error": err.error}
        if err.error == "unknown_method":
            body["req_method"] = method
        return JSONResponse(body, status_code=err.status, headers=err.headers)

    def _target(self, params: _Params, key: str = "channel") -> _Channel:
        """The channel a call is about; a user id means the DM with that user."""
        value = params.string(key) or ""
        if _USER_ID.match(value) and self._user(value) is not None:
            dm_id = "D" + value[1:]
            if dm_id not in self._channels:
                self.add_channel(dm_id, kind="im", user=value)
            return self._channels[dm_id]
        if value.startswith("#"):
            named = next((c for c in self._channels.values() if c.name == value[1:]), None)
            if named is None:
                raise _ApiError("channel_not_found")
            return named
        return self._channel(value)

    def _text(self, params: _Params) -> str:
        text = params.string("text") or params.string("markdown_text") or ""
        has_blocks = bool(params.decoded("blocks")) or bool(params.decoded("attachments"))
        if not text.strip() and not has_blocks:
            raise _ApiError("no_text")
        if len(text) > MAX_TEXT_LENGTH:
            raise _ApiError("msg_too_long")
        return text

    def _own_message(self, params: _Params, ts_key: str = "ts") -> tuple[_Channel, str, JSON]:
        channel = self._target(params)
        ts = params.string(ts_key) or ""
        message = self._messages.get((channel.id, ts))
        if message is None:
            raise _ApiError("message_not_found")
        return channel, ts, message
