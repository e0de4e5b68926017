"""discord.py pointed at configurable addresses, with Herald's own event path.

discord.py has no option for its REST base or its gateway address: both are class-level
globals (`discord.http.Route.BASE`, `discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY`).
Neither is changed here. `HeraldClient` replaces its own `http` (and its state's) by a
`RoutedHTTP`, which rebases each request's URL from `Route.BASE` onto the configured base; the
gateway address is what `GET /gateway/bot` names (or `gateway_url`), passed to
`DiscordWebSocket.from_client` (discord.py's own connect step, which `Client.connect` uses) by
`HeraldClient.open_socket`; discord.py then resumes at READY's `resume_gateway_url`, as Discord
asks. Herald runs the connect loop itself (`DiscordAdapter`) so that failures reach the
supervisor as NotReady / AuthError instead of being retried forever inside the library.

Gateway events do not become discord.py model objects or event tasks: READY, RESUMED,
MESSAGE_CREATE, MESSAGE_UPDATE (edits), MESSAGE_REACTION_ADD and INTERACTION_CREATE (button
presses) go, as raw payloads and in the order
received, to the `on_event` callback (synchronously, from the websocket's read loop), and every
other event is dropped unparsed.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import discord
import yarl
from discord.gateway import DiscordWebSocket
from discord.http import HTTPClient, Ratelimit, Route

logger = logging.getLogger(__name__)

NO_RATELIMIT_WAIT = 1e-9
"""As `max_ratelimit_timeout`: any wait for a rate limit raises `discord.RateLimited` instead
of sleeping inside a request (the outbox retries that chat later; other chats go on)."""


@dataclass(frozen=True, slots=True)
class Connected:
    """The gateway said READY (a new session) or RESUMED (events of the gap replayed)."""

    resumed: bool


@dataclass(frozen=True, slots=True)
class MessageCreated:
    """A MESSAGE_CREATE payload."""

    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class MessageUpdated:
    """A MESSAGE_UPDATE payload (an edit, or an embed added)."""

    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Reacted:
    """A MESSAGE_REACTION_ADD payload."""

    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Interacted:
    """An INTERACTION_CREATE payload (a press of a message's button)."""

    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Disconnected:
    """The socket is gone; events may be missed until the next Connected."""


GatewayEvent = Connected | MessageCreated | MessageUpdated | Reacted | Interacted | Disconnected


class RoutedHTTP(HTTPClient):
    """discord.py's REST client with its requests sent to `api_base` instead of Discord's."""

    def __init__(self, api_base: str, **options: Any) -> None:
        super().__init__(**options)
        self.api_base = api_base.rstrip("/")
        # The constructor clamps this to 30 s or more; Herald wants no sleeping at all.
        self.max_ratelimit_timeout = NO_RATELIMIT_WAIT

    def get_ratelimit(self, key: str) -> Ratelimit:
        """A bucket that waits for its own reset when it is empty instead of raising as soon
        as any reset time is known: Discord sends a bucket's reset with every answer, so with
        the tiny `max_ratelimit_timeout` every second send within a bucket's window was refused
        as rate-limited. Buckets are per channel, so the wait holds only that chat; a 429
        still raises (`discord.RateLimited`) and is left to the outbox."""
        kept = self.max_ratelimit_timeout
        self.max_ratelimit_timeout = None  # read by the bucket's constructor only
        try:
            return super().get_ratelimit(key)
        finally:
            self.max_ratelimit_timeout = kept

    async def request(self, route: Route, **kwargs: Any) -> Any:
        """`HTTPClient.request` at this client's base (rate limit buckets are unchanged)."""
        if route.url.startswith(Route.BASE) and self.api_base != Route.BASE:
            route.url = self.api_base + route.url[len(Route.BASE) :]
        return await super().request(route, **kwargs)


class Pulse:
    """When the gateway last sent anything, an event, a heartbeat ack (monotonic seconds)."""

    def __init__(self) -> None:
        now = time.monotonic()
        self.received = now
        self.dispatched = now
        self.acked = now
        self.heartbeat_interval: float | None = None

    def saw(self, raw: str | bytes) -> None:
        """Record one gateway payload (decompressed JSON text)."""
        now = time.monotonic()
        self.received = now
        try:
            payload = json.loads(raw)
        except ValueError:
            return
        if not isinstance(payload, dict):
            return
        op = payload.get("op")
        if op == 0:
            self.dispatched = now
        elif op == 11:
            self.acked = now
        elif op == 10:
            self.acked = now
            data = payload.get("d")
            interval = data.get("heartbeat_interval") if isinstance(data, dict) else None
            if isinstance(interval, int | float) and interval > 0:
                self.heartbeat_interval = interval / 1000


class HeraldClient(discord.Client):
    """A `discord.Client` whose REST goes to `api_base` and whose gateway events go to
    `on_event`. Entered with `async with`; `login` before `open_socket`."""

    def __init__(
        self,
        *,
        api_base: str,
        heartbeat_timeout: float,
        on_event: Callable[[GatewayEvent], None],
    ) -> None:
        intents = discord.Intents.none()
        intents.guilds = True
        intents.guild_messages = True
        intents.dm_messages = True
        intents.message_content = True
        intents.guild_reactions = True
        intents.dm_reactions = True
        super().__init__(
            intents=intents,
            heartbeat_timeout=heartbeat_timeout,
            enable_debug_events=True,  # raw payloads reach `dispatch`: the pulse
            max_messages=None,
            chunk_guilds_at_startup=False,
            member_cache_flags=discord.MemberCacheFlags.none(),
        )
        self.http = RoutedHTTP(api_base, loop=self.loop)
        self._connection.http = self.http
        self.on_event = on_event
        self.pulse = Pulse()
        parsers = self._connection.parsers
        parsers.clear()  # the same dict: each websocket reads it when it is created
        parsers["READY"] = lambda data: self.on_event(Connected(resumed=False))
        parsers["RESUMED"] = lambda data: self.on_event(Connected(resumed=True))
        parsers["MESSAGE_CREATE"] = lambda data: self.on_event(MessageCreated(data))
        parsers["MESSAGE_UPDATE"] = lambda data: self.on_event(MessageUpdated(data))
        parsers["MESSAGE_REACTION_ADD"] = lambda data: self.on_event(Reacted(data))
        parsers["INTERACTION_CREATE"] = lambda data: self.on_event(Interacted(data))

    def dispatch(self, event: str, /, *args: Any, **kwargs: Any) -> None:
        """Only the raw payloads are looked at (no event tasks are started)."""
        if event == "socket_raw_receive" and args:
            self.pulse.saw(args[0])

    async def open_socket(
        self,
        gateway: yarl.URL,
        *,
        initial: bool,
        session: str | None = None,
        sequence: int | None = None,
        resume: bool = False,
    ) -> DiscordWebSocket:
        """Connect (HELLO, then IDENTIFY or RESUME). Raises like `DiscordWebSocket.from_client`."""
        self.pulse = Pulse()
        ws = await DiscordWebSocket.from_client(
            self,
            initial=initial,
            gateway=gateway,
            session=session,
            sequence=sequence,
            resume=resume,
        )
        self.ws = ws
        return ws
