"""The Discord connection: discord.py's gateway websocket in, its REST client out.

Discord has no acknowledgement: what it does not deliver on the gateway is still in channel
history. So "persist before acknowledging" is: a message's id becomes the channel's last seen
id (`last:<channel id>` in the adapter's checkpoints) only after the inbox stored it, and after
every READY or RESUMED the channels Herald talks in are read from their last seen id on
(bounded), before any later event. The inbox's unique message id drops what arrives twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Self, TypeVar

import aiohttp
import discord
import yarl
from discord.gateway import DiscordWebSocket, ReconnectWebSocket
from discord.http import Route, handle_message_parameters
from discord.utils import escape_markdown

from adapters.discord import PLATFORM
from adapters.discord.client import (
    Connected,
    Disconnected,
    GatewayEvent,
    HeraldClient,
    Interacted,
    MessageUpdated,
    Reacted,
)
from adapters.discord.config import DiscordConfig
from adapters.discord.convert import (
    MESSAGE_COMPONENT,
    NOT_ADDRESSED,
    OWN_MESSAGE,
    Channel,
    ChannelKind,
    button_style,
    channel_from,
    custom_id,
    error_from,
    interaction_channel,
    is_guild_message,
    newer,
    pressed,
    reaction_from,
    split_message_key,
    to_inbound,
)
from adapters.files import download, keep, with_files
from adapters.inbound import FileRef, Skipped, log_skipped, message_key
from adapters.inflight import InFlight, TrackedSends
from gateway.contracts.adapter import AdapterState, Checkpoints, InboundSink, ReactionSink
from gateway.contracts.errors import AuthError, HeraldError, NotReady, PermanentSendError
from gateway.contracts.ids import AccountId, ChatId, Platform, PlatformMessageId, ThreadId
from gateway.contracts.messages import (
    Attachment,
    Button,
    DeliveryReceipt,
    OutboundMessage,
    SendLimits,
    TextFormat,
    utcnow,
)

logger = logging.getLogger(__name__)
_ANGLE_SYNTAX = re.compile(r"<(?=[@#:/]|a:|t:|id:)")
"""Where Discord turns `<…>` into a mention, channel, time, emoji or command."""

T = TypeVar("T")
MAX_CHUNK = 2000
PAGE = 100
CONNECT_TIMEOUT = 30.0
MAX_QUICK_CLOSES = 5
"""Connections in a row closed before HELLO's answer, after which `run` gives up (NotReady)."""
CHANNELS = "channels"
"""Checkpoint: the ids of the channels backfilled after a reconnect (JSON list, newest first)."""
AUTH_CLOSE_CODES = {4004: "the token was refused", 4014: "the Message Content intent is off"}
DEFERRED_UPDATE = 6
"""The interaction response that acknowledges a press without changing the message."""


def _last(channel_id: str) -> str:
    return f"last:{channel_id}"


class DiscordAdapter(TrackedSends):
    """One Discord bot. Entering logs in over REST (`/users/@me`, the application) and finds
    the gateway; `run` holds the gateway connection. AuthError for a refused token, NotReady
    when Discord cannot be reached."""

    platform: Platform = PLATFORM

    def __init__(self, config: DiscordConfig, files_dir: Path, checkpoints: Checkpoints) -> None:
        self.config = config
        self._inflight = InFlight()
        self.files_dir = files_dir
        self.checkpoints = checkpoints
        self.account = AccountId(config.account)
        self.limits = SendLimits(
            max_chunk=MAX_CHUNK,
            count_utf16=False,
            min_edit_interval=config.min_edit_interval,
            min_send_interval=config.min_send_interval,
            max_file_bytes=10 * 1024 * 1024,  # a bot's upload limit outside boosted servers
            voice=True,  # an audio file, with the spoken text as its message
            voice_caption=MAX_CHUNK,
        )
        self._client: HeraldClient | None = None
        self._downloads: aiohttp.ClientSession | None = None
        self._gateway: yarl.URL | None = None
        self._bot_id = ""
        self._events: asyncio.Queue[GatewayEvent] = asyncio.Queue()
        self._channels: dict[str, Channel | None] = {}
        self._seen: dict[str, str | None] = {}
        """Last seen id per channel, as stored (None: none stored)."""
        self._sent: dict[str, str] = {}
        """Newest id per channel of a message Herald sent there."""
        self._tracked: list[str] | None = None
        self._ready = False
        """A session is READY or RESUMED on the current socket."""
        self._stale = False
        """The watchdog found the current socket silent and asked for a new one."""
        self._catching_up = True
        """Between a lost socket (or the start) and the end of the backfill after the next
        READY / RESUMED: live messages are stored but do not move last seen ids, which could
        otherwise pass over a message of the gap."""
        self._entered = False
        self._closed = False

    # -- lifecycle --------------------------------------------------------------------------

    def _new_client(self) -> HeraldClient:
        return HeraldClient(
            api_base=self.config.api_base,
            heartbeat_timeout=self.config.heartbeat_timeout,
            on_event=self._events.put_nowait,
        )

    async def __aenter__(self) -> Self:
        """Log in and find the gateway. Raises AuthError or NotReady."""
        client = self._new_client()
        await client.__aenter__()
        try:
            await self._call("login", client.login(self.config.token.get_secret_value()))
            assert client.user is not None
            self._bot_id = str(client.user.id)
            self._gateway = await self._find_gateway(client)
            self._downloads = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=CONNECT_TIMEOUT * 4)
            )
        except BaseException:
            await client.close()
            raise
        self._client = client
        self._entered = True
        logger.info("discord: logged in as %s (%s)", client.user, self._bot_id)
        return self

    async def __aexit__(self, *exc: object) -> None:
        client, downloads = self._client, self._downloads
        self._client, self._downloads, self._closed = None, None, True
        try:
            # New sends now fail with NotReady (nothing sent); those under way may finish.
            await self._drain_sends()
        finally:
            with contextlib.suppress(Exception):
                if downloads is not None:
                    await downloads.close()
            if client is not None:
                await client.close()

    async def _find_gateway(self, client: HeraldClient) -> yarl.URL:
        if self.config.gateway_url is not None:
            return yarl.URL(self.config.gateway_url)
        _, url, _ = await self._call("GET /gateway/bot", client.http.get_bot_gateway())
        return yarl.URL(url)

    async def check(self) -> str:
        """Check the token (`/users/@me`, `/gateway/bot`) without connecting the gateway.
        Raises AuthError or NotReady."""
        client = self._new_client()
        async with client:
            await self._call("login", client.login(self.config.token.get_secret_value()))
            _, _, limit = await self._call("GET /gateway/bot", client.http.get_bot_gateway())
            user = client.user
            app = client.application
            return (
                f"{user} ({user.id if user else '?'})"
                + (f" of application {app.name}" if app is not None else "")
                + f", {limit.get('remaining', '?')} gateway sessions left today"
            )

    def liveness(self) -> AdapterState:
        """RECEIVING while a gateway session is up and not found silent."""
        if self._client is None:
            return AdapterState.STOPPED if self._closed else AdapterState.STARTING
        if self._ready and not self._stale:
            return AdapterState.RECEIVING
        return AdapterState.RECONNECTING

    # -- receiving --------------------------------------------------------------------------

    async def run(self, sink: InboundSink) -> None:
        """Receive until cancelled. Raises NotReady (connection lost for good, a message not
        stored) or AuthError (token refused, Message Content intent off)."""
        client = self._connected()
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._hold_gateway(client), name="discord gateway")
                tg.create_task(self._watch(client), name="discord watchdog")
                tg.create_task(self._consume(sink), name="discord inbox")
        except ExceptionGroup as group:
            for kind in (AuthError, HeraldError):
                found = group.subgroup(kind)
                if found is not None:
                    raise found.exceptions[0] from group
            raise

    async def _hold_gateway(self, client: HeraldClient) -> None:
        """Connect, then resume or identify again whenever discord.py asks to; NotReady once
        a connection cannot be made or is closed in a way that allows no resuming."""
        assert self._gateway is not None
        params: dict[str, Any] = {"initial": True}
        gateway = self._gateway
        failed = 0
        while True:
            self._ready = False
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT):
                    ws = await client.open_socket(gateway, **params)
            except ReconnectWebSocket as again:  # closed before the session was up
                failed += 1
                if failed > MAX_QUICK_CLOSES:
                    raise NotReady("discord: the gateway keeps closing the connection") from None
                if not again.resume:
                    params, gateway = {"initial": False}, self._gateway
                continue
            except discord.ConnectionClosed as err:
                raise self._closed_error(err) from err
            except (OSError, aiohttp.ClientError, TimeoutError, discord.HTTPException) as err:
                raise NotReady(f"discord: connecting the gateway: {type(err).__name__}") from err
            failed = 0
            try:
                while True:
                    await ws.poll_event()
            except ReconnectWebSocket as again:
                logger.info("discord: reconnecting the gateway (resume: %s)", again.resume)
                params = {
                    "initial": False,
                    "sequence": ws.sequence,
                    "session": ws.session_id,
                    "resume": again.resume and ws.session_id is not None,
                }
                gateway = ws.gateway if params["resume"] else self._gateway
            except discord.ConnectionClosed as err:
                raise self._closed_error(err) from err
            except (OSError, aiohttp.ClientError) as err:
                raise NotReady(f"discord: the gateway failed: {type(err).__name__}") from err
            finally:
                self._ready = False
                self._events.put_nowait(Disconnected())

    @staticmethod
    def _closed_error(err: discord.ConnectionClosed) -> HeraldError:
        reason = AUTH_CLOSE_CODES.get(err.code)
        if reason is not None:
            return AuthError(f"discord: the gateway closed with {err.code}: {reason}")
        return NotReady(f"discord: the gateway closed with {err.code}")

    async def _watch(self, client: HeraldClient) -> None:
        """Replace a socket that is open but silent: heartbeat acks stopped, or nothing came
        for `activity_check_interval` while a channel Herald reads has a newer message."""
        checked = time.monotonic()
        while True:
            pulse = client.pulse
            interval = pulse.heartbeat_interval or 1.0
            await asyncio.sleep(min(interval / 2, self.config.activity_check_interval / 2, 1.0))
            ws = client.ws
            if ws is None or not self._ready or self._stale:
                continue
            now = time.monotonic()
            reason = None
            if pulse.heartbeat_interval is not None and now - pulse.acked > 2 * interval + 0.5:
                reason = "heartbeat acks stopped"
            quiet = now - max(pulse.dispatched, checked)
            if reason is None and quiet > self.config.activity_check_interval:
                checked = now
                missed = await self._missed_activity()
                if missed is not None:
                    reason = f"nothing received, but channel {missed} has new messages"
            if reason is not None:
                logger.warning("discord: replacing a silent gateway connection: %s", reason)
                await self._restart(ws)

    async def _restart(self, ws: DiscordWebSocket) -> None:
        """Close the socket with 4000: discord.py's read loop then resumes the session."""
        self._stale = True
        try:
            await ws.close(4000)
        except (OSError, aiohttp.ClientError) as err:
            logger.debug("discord: closing a silent socket: %s", err)

    async def _missed_activity(self) -> str | None:
        """A tracked channel whose newest message is newer than what Herald saw or sent."""
        client = self._connected()
        for channel_id in await self._tracked_channels():
            seen = newer(await self._last_seen(channel_id), self._sent.get(channel_id))
            if seen is None:
                continue
            try:
                info = await client.http.get_channel(channel_id)
            except (discord.HTTPException, aiohttp.ClientError, OSError, TimeoutError) as err:
                logger.debug("discord: activity of %s unknown: %s", channel_id, err)
                continue
            latest = info.get("last_message_id") if isinstance(info, dict) else None
            if isinstance(latest, str) and newer(latest, seen) == latest and latest != seen:
                return channel_id
        return None

    async def _consume(self, sink: InboundSink) -> None:
        """Store gateway events one at a time, in the order they came."""
        while True:
            event = await self._events.get()
            if isinstance(event, Connected):
                await self._backfill(sink)
                self._ready, self._stale, self._catching_up = True, False, False
                logger.info("discord: gateway %s", "resumed" if event.resumed else "ready")
            elif isinstance(event, Disconnected):
                self._ready, self._catching_up = False, True
            elif isinstance(event, Interacted):
                await self._on_press(event.data, sink)
            elif isinstance(event, MessageUpdated):
                await self._on_edit(event.data, sink)
            elif isinstance(event, Reacted):
                await self._on_reaction(event.data, sink)
            else:
                await self._receive(event.data, sink, advance=not self._catching_up)

    async def _receive(
        self, data: dict[str, Any], sink: InboundSink, *, advance: bool, from_history: bool = False
    ) -> None:
        """Store one message (unless it is for no one), then mark it seen (with `advance`,
        or when its channel has no last seen id yet)."""
        channel_id, message_id = data.get("channel_id"), data.get("id")
        if not isinstance(channel_id, str) or not isinstance(message_id, str):
            logger.info("discord: a message without ids was passed over")
            return
        # History entries carry no guild_id: their channel says whether they are DMs.
        known = is_guild_message(data) or from_history
        channel = await self._channel(channel_id) if known else None
        incoming = to_inbound(
            data,
            bot_id=self._bot_id,
            account=self.account,
            config=self.config,
            channel=channel,
            now=utcnow(),
        )
        if isinstance(incoming, Skipped):
            what = f"{PLATFORM}: message {message_id}"
            log_skipped(logger, what, incoming, quiet=(NOT_ADDRESSED, OWN_MESSAGE))
            if advance and await self._last_seen(channel_id) is not None:
                await self._mark_seen(channel_id, message_id)
            return
        key = incoming.message.platform_message_id
        message = await with_files(
            incoming.message,
            incoming.files,
            lambda i, ref: self._download(key, i, ref),
            sink=sink,
        )
        await sink.accept(message)
        await self._track(channel_id)
        if advance or await self._last_seen(channel_id) is None:
            await self._mark_seen(channel_id, message_id)

    async def _on_edit(self, data: dict[str, Any], sink: InboundSink) -> None:
        """An edited message, stored as an edit of the original (the sink decides what it
        changes); it moves no watermark."""
        channel_id = data.get("channel_id")
        if not isinstance(channel_id, str):
            return
        channel = await self._channel(channel_id) if is_guild_message(data) else None
        incoming = to_inbound(
            data,
            bot_id=self._bot_id,
            account=self.account,
            config=self.config,
            channel=channel,
            now=utcnow(),
            edit=True,
        )
        if isinstance(incoming, Skipped):
            what = f"{PLATFORM}: edit of message {data.get('id')}"
            log_skipped(logger, what, incoming, quiet=(NOT_ADDRESSED, OWN_MESSAGE))
            return
        key = incoming.message.platform_message_id
        message = await with_files(
            incoming.message,
            incoming.files,
            lambda i, ref: self._download(key, i, ref),
            sink=sink,
        )
        await sink.accept(message)

    async def _on_reaction(self, data: dict[str, Any], sink: InboundSink) -> None:
        """A reaction, to the sink that takes them (it decides whether it means anything)."""
        channel_id = data.get("channel_id")
        guild = isinstance(data.get("guild_id"), str)
        channel = await self._channel(channel_id) if guild and isinstance(channel_id, str) else None
        reaction = reaction_from(
            data, bot_id=self._bot_id, account=self.account, channel=channel, now=utcnow()
        )
        if isinstance(reaction, Skipped):
            log_skipped(logger, f"{PLATFORM}: a reaction", reaction)
        elif isinstance(sink, ReactionSink):
            await sink.react(reaction)

    async def working(self, chat_id: ChatId, message: PlatformMessageId) -> None:
        """Put the working reaction on the message being answered."""
        parsed = split_message_key(message)
        if self.config.working_reaction and parsed is not None:
            http = self._connected().http
            await self._call("react", http.add_reaction(*parsed, self.config.working_reaction))

    async def done(self, chat_id: ChatId, message: PlatformMessageId) -> None:
        """Take the working reaction off again."""
        parsed = split_message_key(message)
        if self.config.working_reaction and parsed is not None:
            http = self._connected().http
            await self._call(
                "react", http.remove_own_reaction(*parsed, self.config.working_reaction)
            )

    async def _on_press(self, data: dict[str, Any], sink: InboundSink) -> None:
        """A button press: stored as the presser's own command, then answered with a deferred
        update (Discord wants an answer within 3 s, or tells the presser it failed)."""
        if data.get("type") != MESSAGE_COMPONENT:
            logger.debug("discord: interaction of type %s ignored", data.get("type"))
            return
        channel = interaction_channel(data)
        channel_id = data.get("channel_id")
        if channel is None and is_guild_message(data) and isinstance(channel_id, str):
            channel = await self._channel(channel_id)
        incoming = pressed(data, bot_id=self._bot_id, account=self.account, channel=channel)
        if isinstance(incoming, Skipped):
            log_skipped(logger, f"{PLATFORM}: interaction {data.get('id')}", incoming)
        else:
            await sink.accept(incoming.message)
        await self._answer_press(data)

    async def _answer_press(self, data: dict[str, Any]) -> None:
        """Acknowledge a press (best effort: the press is stored either way)."""
        interaction_id, token = data.get("id"), data.get("token")
        if not isinstance(interaction_id, str) or not isinstance(token, str):
            return
        route = Route(
            "POST",
            "/interactions/{interaction_id}/{interaction_token}/callback",
            interaction_id=interaction_id,
            interaction_token=token,
        )
        try:
            await self._call(
                "interaction callback",
                self._connected().http.request(route, json={"type": DEFERRED_UPDATE}),
            )
        except HeraldError as err:
            logger.info("discord: answering button press %s failed: %s", interaction_id, err)

    async def _backfill(self, sink: InboundSink) -> None:
        """Store what tracked channels got after their last seen id (at most
        `backfill_limit` messages each, oldest first)."""
        client = self._connected()
        for channel_id in await self._tracked_channels():
            after = await self._last_seen(channel_id)
            if after is None:
                continue
            fetched = 0
            while fetched < self.config.backfill_limit:
                page = min(PAGE, self.config.backfill_limit - fetched)
                batch = await self._call(
                    "channel history", client.http.logs_from(channel_id, page, after=after)
                )
                items = sorted(
                    (m for m in batch if isinstance(m, dict) and str(m.get("id", "")).isdigit()),
                    key=lambda m: int(m["id"]),
                )
                for item in items:
                    data: dict[str, Any] = {"channel_id": channel_id, **item}
                    await self._receive(data, sink, advance=True, from_history=True)
                fetched += len(items)
                if items:
                    logger.info("discord: %d missed message(s) of %s read", len(items), channel_id)
                if len(batch) < page or not items:
                    break
                after = str(items[-1]["id"])

    async def _channel(self, channel_id: str) -> Channel | None:
        """What a server channel is (thread or not), from REST, remembered."""
        if channel_id in self._channels:
            return self._channels[channel_id]
        client = self._connected()
        try:
            payload = await self._call("GET channel", client.http.get_channel(channel_id))
        except PermanentSendError as err:
            logger.info("discord: channel %s cannot be read: %s", channel_id, err)
            payload = None
        channel = channel_from(payload) or Channel(channel_id, ChannelKind.GUILD)
        self._channels[channel_id] = channel
        return channel

    async def _last_seen(self, channel_id: str) -> str | None:
        if channel_id not in self._seen:
            self._seen[channel_id] = await self.checkpoints.get(_last(channel_id))
        return self._seen[channel_id]

    async def _mark_seen(self, channel_id: str, message_id: str) -> None:
        current = await self._last_seen(channel_id)
        if newer(message_id, current) != current or current is None:
            await self.checkpoints.set(_last(channel_id), message_id)
            self._seen[channel_id] = message_id

    async def _tracked_channels(self) -> list[str]:
        if self._tracked is None:
            stored = await self.checkpoints.get(CHANNELS)
            try:
                loaded = json.loads(stored) if stored else []
            except ValueError:
                loaded = []
            self._tracked = (
                [c for c in loaded if isinstance(c, str)] if isinstance(loaded, list) else []
            )
        configured = [c for c in self.config.channels if c not in self._tracked]
        return [*self._tracked, *configured]

    async def _track(self, channel_id: str) -> None:
        tracked = await self._tracked_channels()
        if channel_id in tracked[: self.config.backfill_channels]:
            return
        assert self._tracked is not None
        self._tracked = [channel_id, *[c for c in self._tracked if c != channel_id]][
            : self.config.backfill_channels
        ]
        await self.checkpoints.set(CHANNELS, json.dumps(self._tracked))

    async def _download(self, key: PlatformMessageId, index: int, ref: FileRef) -> Attachment:
        """Fetch one attachment (size-limited). Raises NotReady or PermanentSendError."""
        assert self._downloads is not None
        data = await download(
            self._downloads,
            ref.url,
            what=f"discord: downloading {ref.filename}",
            limit=self.config.attachment_max_bytes,
        )
        return await keep(
            self.files_dir, key, index, data, mime_type=ref.mime_type, filename=ref.filename
        )

    # -- sending ----------------------------------------------------------------------------

    async def _send(self, message: OutboundMessage) -> DeliveryReceipt:
        """Post one chunk (a reply to `reply_to` when given) with its files. Raises
        RateLimited, PermanentSendError, AuthError or NotReady."""
        client = self._connected()
        channel_id = message.thread_id or message.chat_id
        text = self._render(message)
        if not text.strip() and not message.attachments:
            raise PermanentSendError("discord: nothing to send (no text and no files)")
        files = [
            discord.File(a.path, filename=a.filename or a.path.name) for a in message.attachments
        ]
        reference = None
        parsed = split_message_key(message.reply_to) if message.reply_to else None
        if parsed is not None:
            reference = {
                "channel_id": parsed[0],
                "message_id": parsed[1],
                "fail_if_not_exists": False,
            }
        try:
            with handle_message_parameters(
                content=text if text.strip() else None,
                files=files or discord.utils.MISSING,
                allowed_mentions=discord.AllowedMentions(
                    everyone=False, roles=False, users=True, replied_user=False
                ),
                message_reference=reference or discord.utils.MISSING,  # type: ignore[arg-type]
                view=_view(message.buttons) if message.buttons else discord.utils.MISSING,
            ) as params:
                answer = await self._call(
                    "send", client.http.send_message(channel_id, params=params)
                )
        finally:
            for f in files:
                f.close()
        sent_id = str(answer["id"])
        self._sent[channel_id] = newer(sent_id, self._sent.get(channel_id)) or sent_id
        return DeliveryReceipt(message_key(str(answer.get("channel_id") or channel_id), sent_id))

    async def edit(self, target: PlatformMessageId, message: OutboundMessage) -> DeliveryReceipt:
        """Replace the text of a message Herald sent. Raises like `send`."""
        parsed = split_message_key(target)
        if parsed is None:
            raise PermanentSendError(f"discord: {target!r} is not a Discord message id")
        channel_id, message_id = parsed
        text = self._render(message)
        if text.strip():  # Discord refuses an empty message; a blank edit changes nothing
            with handle_message_parameters(content=text) as params:
                await self._call(
                    "edit",
                    self._connected().http.edit_message(channel_id, message_id, params=params),
                )
        return DeliveryReceipt(message_key(channel_id, message_id))

    async def typing(self, chat_id: ChatId, thread_id: ThreadId | None) -> None:
        """Show "typing…" in the channel (or thread) for about ten seconds."""
        await self._call("typing", self._connected().http.send_typing(thread_id or chat_id))

    @staticmethod
    def _render(message: OutboundMessage) -> str:
        # Discord reads Markdown itself; plain text has its markup escaped, and its
        # `<@id>`, `<#id>`, `<t:…>` and `<:emoji:id>` too: shown as typed, not as a mention,
        # a time or an emoji (an approval must show the text a tool gets).
        if message.format is TextFormat.PLAIN:
            return _ANGLE_SYNTAX.sub(r"\\<", escape_markdown(message.text))
        return message.text

    def _connected(self) -> HeraldClient:
        if self._client is None:
            raise NotReady("discord: the adapter is not connected")
        return self._client

    @staticmethod
    async def _call(doing: str, request: Awaitable[T]) -> T:
        """Await one REST call; discord.py's failures as Herald errors."""
        try:
            return await request
        except discord.RateLimited as err:
            raise error_from(429, None, err.retry_after, doing) from err
        except discord.LoginFailure as err:
            raise AuthError(f"discord: {doing}: the token was refused") from err
        except discord.HTTPException as err:
            retry_after = None
            if err.status == 429:
                with contextlib.suppress(AttributeError, TypeError, ValueError):
                    retry_after = float(json.loads(err.text).get("retry_after"))
            raise error_from(err.status, err.code, retry_after, doing) from err
        except discord.GatewayNotFound as err:
            raise NotReady(f"discord: {doing}: the gateway address is unknown") from err
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            raise NotReady(f"discord: {doing}: {type(err).__name__}: {err}") from err


def _view(buttons: tuple[Button, ...]) -> discord.ui.View:
    """One row of buttons whose `custom_id` is the command they send (read again on each
    press, so they work after a restart)."""
    view = discord.ui.View(timeout=None)
    for button in buttons:
        view.add_item(
            discord.ui.Button(
                label=button.label[:80],
                custom_id=custom_id(button),
                style=discord.ButtonStyle(button_style(button)),
            )
        )
    return view
