"""The Signal connection: a signal-cli daemon (`daemon --http`), JSON-RPC 2.0 requests to
`POST /api/v1/rpc` and the received messages from `GET /api/v1/events` (server-sent events).

signal-cli has no redelivery: it acknowledges each message to Signal's servers itself, writes
it to the event streams open at that moment, and forgets it. Herald reads one event at a time
and reads the next only after the previous one is in the inbox (committed), so what a crash
can lose is what the daemon had already written to the stream and Herald had not yet stored.
With `--receive-mode=on-connection` the daemon receives only while Herald's stream is open:
while Herald is down, messages wait on Signal's servers instead of being received and lost.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import itertools
import json
import logging
import time
from collections.abc import AsyncGenerator, Mapping
from pathlib import Path
from typing import Any, Self
from urllib.parse import urlsplit

import aiohttp
from aiohttp.http_exceptions import LineTooLong

from adapters.files import keep, with_files
from adapters.inbound import Incoming, Skipped, log_skipped
from adapters.inflight import InFlight, TrackedSends
from adapters.signal import PLATFORM
from adapters.signal.config import SignalConfig
from adapters.signal.convert import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    IO_ERROR,
    METHOD_NOT_FOUND,
    NOT_ADDRESSED,
    OWN,
    RATE_LIMIT_ERROR,
    AttachmentRef,
    challenge_of,
    data_uri,
    error_from,
    failed_results,
    is_group,
    message_id,
    recipient,
    split_message_id,
    to_event,
    to_signal,
)
from gateway.contracts.adapter import AdapterState, InboundSink, ReactionSink
from gateway.contracts.errors import AuthError, HeraldError, NotReady, PermanentSendError
from gateway.contracts.ids import AccountId, ChatId, Platform, PlatformMessageId, ThreadId
from gateway.contracts.messages import (
    Attachment,
    DeliveryReceipt,
    OutboundMessage,
    Reaction,
    SendLimits,
    TextFormat,
    utcnow,
)

logger = logging.getLogger(__name__)

MAX_CHUNK = 2000
"""Characters of one message (Signal's apps show longer ones folded, as a file)."""
SEND_FILE_MAX_BYTES = 100 * 1024 * 1024
"""The largest file sent (Signal's attachment limit)."""
KEEPALIVE_GRACE = 45.0
"""Seconds without a byte on the event stream (signal-cli writes a comment every 15) before
the stream counts as lost."""
MAX_EVENT_BYTES = 4 * 1024 * 1024
"""The largest event read from the stream (Signal's servers take envelopes of a few hundred
KiB); a larger one is skipped, the stream read on."""
MAX_ANSWER_BYTES = 16 * 1024 * 1024
"""The longest JSON-RPC answer read (but a file's, which `attachment_max_bytes` bounds)."""
RECONNECT_PAUSES = (0.2, 0.5, 1.0, 2.0)
"""Pauses before reopening an event stream that ended; past the last, NotReady."""


class TooLarge(NotReady):
    """An answer longer than the caller would read (it was not read further)."""


async def _read_at_most(response: aiohttp.ClientResponse, limit: int, doing: str) -> bytes:
    """The response's body, or TooLarge once more than `limit` bytes arrived (or would)."""
    if response.content_length is not None and response.content_length > limit:
        raise TooLarge(f"signal: {doing}: the answer is over {limit} bytes")
    body = bytearray()
    async for chunk in response.content.iter_chunked(65536):
        body += chunk
        if len(body) > limit:
            raise TooLarge(f"signal: {doing}: the answer is over {limit} bytes")
    return bytes(body)


class RpcError(Exception):
    """A JSON-RPC error answered by the daemon."""

    def __init__(self, code: int, message: str, data: Any) -> None:
        self.code = code
        self.message = message
        self.data = data
        super().__init__(f"{message} ({code})")


class SignalAdapter(TrackedSends):
    """One Signal account through a signal-cli daemon: receives messages, edits and reactions
    from its event stream, fetches files (`getAttachment`) from allowed senders only, sends
    text with styles, quotes and files (a voice reply is an audio attachment with the text as
    its body), shows typing, sends read receipts, and marks the message being answered with
    `working_reaction`.

    Entering asks the daemon for its version and whether it serves `number` (NotReady when it
    does not answer, AuthError when the account is not registered there).
    """

    platform: Platform = PLATFORM

    def __init__(self, config: SignalConfig, files_dir: Path) -> None:
        self.config = config
        self.files_dir = files_dir
        self.account = AccountId(config.account)
        self.limits = SendLimits(
            max_chunk=MAX_CHUNK,
            count_utf16=True,
            min_send_interval=config.min_send_interval,
            max_file_bytes=SEND_FILE_MAX_BYTES,
            voice=True,  # an audio attachment, its text as the message body: one request
            voice_caption=MAX_CHUNK,
        )
        self._inflight = InFlight()
        self._http: aiohttp.ClientSession | None = None
        self._ids = itertools.count(1)
        self._entered = False
        self._streaming = False
        self._last_byte: float | None = None
        self._uuid: str | None = None
        self._challenges: set[str] = set()
        self._multi = config.multi_account

    # -- lifecycle --------------------------------------------------------------------------

    def _session(self) -> aiohttp.ClientSession:
        token = self.config.auth_token
        headers = {"Authorization": f"Bearer {token.get_secret_value()}"} if token else {}
        return aiohttp.ClientSession(
            headers=headers,
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=10, sock_read=self.config.request_timeout
            ),
        )

    async def __aenter__(self) -> Self:
        """Check the daemon and the account; raises AuthError or NotReady."""
        http = self._session()
        self._http = http
        try:
            description = await self._check()
        except BaseException:
            self._http = None
            await http.close()
            raise
        self._entered = True
        logger.info("signal: connected: %s", description)
        return self

    async def __aexit__(self, *exc: object) -> None:
        http, self._http = self._http, None
        try:
            await self._drain_sends()
        finally:
            if http is not None:
                await http.close()

    async def check(self) -> str:
        """The account and daemon, checked without opening the event stream (for `herald
        doctor` and `herald setup`). Raises AuthError or NotReady."""
        if self._http is not None:
            return await self._check()
        async with self._session() as http:
            self._http = http
            try:
                return await self._check()
            finally:
                self._http = None

    async def _check(self) -> str:
        try:
            version = await self._call("version", {}, doing="version", account=False)
        except RpcError as err:
            raise NotReady(f"signal: version: {err}") from err
        found = version.get("version") if isinstance(version, Mapping) else None
        number = self.config.number
        try:
            accounts = await self._call("listAccounts", {}, doing="listAccounts", account=False)
        except RpcError as err:
            if err.code != METHOD_NOT_FOUND:
                raise NotReady(f"signal: listAccounts: {err}") from err
            accounts = None  # a single-account daemon: it answers as its account
        if accounts is not None:
            # A multi-account daemon, whatever the config says: name the account in every
            # request and stream (without it the stream carries every account's messages,
            # and requests fail once the daemon holds a second account).
            self._multi = True
            numbers = [a.get("number") for a in accounts or () if isinstance(a, Mapping)]
            if number not in numbers:
                raise AuthError(
                    f"signal: {number} is not registered in the signal-cli daemon at "
                    f"{_host(self.config.url)} (it has {', '.join(map(str, numbers)) or 'none'}); "
                    "register or link it with signal-cli, or fix platforms.signal.number"
                )
        try:
            status = await self._call(
                "getUserStatus", {"recipient": [number]}, doing="getUserStatus"
            )
        except RpcError as err:
            if err.code == INVALID_PARAMS:
                raise AuthError(f"signal: the daemon does not serve {number}: {err}") from err
            if err.code in (RATE_LIMIT_ERROR, IO_ERROR, INTERNAL_ERROR):
                # Signal's servers (contact discovery) busy or unreachable: try again later.
                raise NotReady(f"signal: getUserStatus: {err}") from err
            raise AuthError(
                f"signal: the daemon could not use {number}'s registration: {err} "
                "(register or link it with signal-cli)"
            ) from err
        mine = [s for s in status or () if isinstance(s, Mapping) and s.get("number") == number]
        if not mine or not mine[0].get("isRegistered"):
            raise AuthError(f"signal: {number} is not registered with Signal")
        uuid = mine[0].get("uuid")
        self._uuid = uuid if isinstance(uuid, str) and uuid else None
        return f"{number} on signal-cli {found or '?'} at {_host(self.config.url)}"

    def liveness(self) -> AdapterState:
        """RECEIVING while the event stream is open and its keep-alives arrive."""
        if self._http is None:
            return AdapterState.STOPPED if self._entered else AdapterState.STARTING
        if not self._streaming or self._last_byte is None:
            return AdapterState.RECONNECTING
        late = time.monotonic() - self._last_byte > KEEPALIVE_GRACE
        return AdapterState.RECONNECTING if late else AdapterState.RECEIVING

    def _connected(self) -> aiohttp.ClientSession:
        if self._http is None:
            raise NotReady("signal: the adapter is not connected")
        return self._http

    # -- JSON-RPC ---------------------------------------------------------------------------

    async def _call(
        self,
        method: str,
        params: Mapping[str, Any],
        *,
        doing: str,
        account: bool = True,
        max_bytes: int = MAX_ANSWER_BYTES,
    ) -> Any:
        """One JSON-RPC request; its `result`. Raises RpcError (the daemon's error),
        TooLarge (an answer over `max_bytes`, not read further) or NotReady (no answer, a
        5xx, something that is not JSON-RPC)."""
        body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "id": next(self._ids)}
        sent = dict(params)
        if account and self._multi:
            sent["account"] = self.config.number
        if sent:
            body["params"] = sent
        url = f"{self.config.url}/api/v1/rpc"
        try:
            async with asyncio.timeout(self.config.request_timeout + 5):
                async with self._connected().post(url, json=body) as response:
                    if response.status >= 500 or response.status == 429:
                        raise NotReady(f"signal: {doing}: HTTP {response.status}")
                    if response.status in (401, 403):
                        raise AuthError(
                            f"signal: {doing}: HTTP {response.status} (check auth_token)"
                        )
                    if response.status != 200:
                        raise NotReady(f"signal: {doing}: HTTP {response.status} from the daemon")
                    answer = json.loads(await _read_at_most(response, max_bytes, doing))
        except (aiohttp.ClientError, TimeoutError, ValueError) as err:
            raise NotReady(f"signal: {doing}: {type(err).__name__}: {err}") from err
        if not isinstance(answer, Mapping):
            raise NotReady(f"signal: {doing}: the daemon answered no JSON-RPC object")
        error = answer.get("error")
        if isinstance(error, Mapping):
            code = error.get("code")
            raise RpcError(
                code if isinstance(code, int) else 0,
                str(error.get("message", "")),
                error.get("data"),
            )
        return answer.get("result")

    async def _act(
        self,
        method: str,
        params: Mapping[str, Any],
        *,
        doing: str,
        max_bytes: int = MAX_ANSWER_BYTES,
    ) -> Any:
        """A call on a chat's behalf: its result, or the error that says what to do next
        (RateLimited, PermanentSendError, NotReady; TooLarge past `max_bytes`)."""
        try:
            return await self._call(method, params, doing=doing, max_bytes=max_bytes)
        except RpcError as err:
            found = error_from(err.code, err.message, err.data, doing)
            challenge = challenge_of(err.data) if err.code == RATE_LIMIT_ERROR else None
            if challenge is not None and challenge not in self._challenges:
                self._challenges.add(challenge)  # once per challenge, not once per retry
                logger.warning("%s", found)
            raise found from err

    # -- receiving --------------------------------------------------------------------------

    async def run(self, sink: InboundSink) -> None:
        """Read the event stream until cancelled, reopening it when it ends. Raises NotReady
        (the daemon is gone), AuthError, or what `sink.accept` raised."""
        tries = 0
        while True:
            got = False
            opened = time.monotonic()
            async with contextlib.aclosing(self._events()) as events:
                async for event in events:
                    got = True
                    tries = 0
                    await self._handle(event, sink)
            self._streaming = False
            if got or time.monotonic() - opened > KEEPALIVE_GRACE:
                tries = 0
                continue
            if tries >= len(RECONNECT_PAUSES):
                raise NotReady("signal: the daemon's event stream keeps ending")
            await asyncio.sleep(RECONNECT_PAUSES[tries])
            tries += 1

    async def _events(self) -> AsyncGenerator[Mapping[str, Any]]:
        """The `receive` events of one stream, each read only when the previous one was
        handled, until the stream ends. Raises NotReady when it cannot be opened or stalls."""
        url = f"{self.config.url}/api/v1/events"
        query = {"account": self.config.number} if self._multi else {}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=KEEPALIVE_GRACE)
        try:
            async with self._connected().get(url, params=query, timeout=timeout) as response:
                if response.status == 400 and self._multi:
                    raise AuthError(f"signal: the daemon does not serve {self.config.number}")
                if response.status in (401, 403):
                    raise AuthError(f"signal: event stream: HTTP {response.status}")
                if response.status != 200:
                    raise NotReady(f"signal: event stream: HTTP {response.status}")
                self._streaming = True
                self._last_byte = time.monotonic()
                kind = ""
                data: list[str] = []
                size = 0
                dropped = False  # the event being read is over MAX_EVENT_BYTES: skipped
                async for raw in _lines(response.content):
                    self._last_byte = time.monotonic()
                    if raw is None or size + len(raw) > MAX_EVENT_BYTES:
                        dropped, data, size = True, [], 0
                        continue
                    line = raw.decode("utf-8", "replace").rstrip("\r\n")
                    if line:
                        field, _, value = line.partition(":")
                        value = value.removeprefix(" ")
                        if field == "event":
                            kind = value
                        elif field == "data" and not dropped:
                            data.append(value)
                            size += len(raw)
                        continue
                    if dropped:
                        logger.warning(
                            "signal: an event over %d bytes was skipped", MAX_EVENT_BYTES
                        )
                    elif data and kind in ("", "receive"):
                        event = _parse(data)
                        if event is not None:
                            yield event
                    kind, data, size, dropped = "", [], 0, False
        except (aiohttp.ClientError, TimeoutError) as err:
            if self._streaming:
                logger.info("signal: event stream lost: %s: %s", type(err).__name__, err)
                return
            raise NotReady(f"signal: event stream: {type(err).__name__}: {err}") from err
        finally:
            self._streaming = False

    async def _handle(self, event: Mapping[str, Any], sink: InboundSink) -> None:
        """One event into the inbox (or to the reaction sink); then its read receipt."""
        if event.get("account") not in (None, self.config.number):
            raise AuthError(
                f"signal: the daemon streams {event.get('account')}'s messages, not "
                f"{self.config.number}'s (check platforms.signal.number and the daemon's -a)"
            )
        found = to_event(
            event, config=self.config, account=self.account, now=utcnow(), my_uuid=self._uuid
        )
        envelope = event.get("envelope")
        stamp = envelope.get("timestamp") if isinstance(envelope, Mapping) else "?"
        what = f"{PLATFORM}: envelope {stamp}"
        if isinstance(found, Skipped):
            log_skipped(logger, what, found, quiet=(NOT_ADDRESSED, OWN))
            return
        if isinstance(found, Reaction):
            if isinstance(sink, ReactionSink):
                await sink.react(found)
            return
        await self._accept(found, sink)

    async def _accept(self, incoming: Incoming[AttachmentRef], sink: InboundSink) -> None:
        message = await with_files(
            incoming.message,
            incoming.files,
            functools.partial(
                self._download, incoming.message.platform_message_id, str(incoming.message.chat_id)
            ),
            sink=sink,
        )
        await sink.accept(message)
        if self.config.read_receipts and message.edit_of is None:
            ref = split_message_id(message.platform_message_id)
            if ref is not None:
                await self._receipt(ref.author, ref.timestamp)

    async def _receipt(self, author: str, timestamp: int) -> None:
        """A read receipt to the author; best effort."""
        params = {"recipient": [author], "targetTimestamp": [timestamp], "type": "read"}
        try:
            await self._act("sendReceipt", params, doing="read receipt")
        except HeraldError as err:  # a receipt that fails is not the message's problem
            logger.debug("signal: read receipt failed: %s", err)

    async def _download(
        self, key: PlatformMessageId, chat: str, index: int, ref: AttachmentRef
    ) -> Attachment:
        """Fetch one file from the daemon (`getAttachment`) into `files_dir/<chat>/`."""
        params: dict[str, Any] = {"id": ref.id}
        params.update({"groupId": chat} if is_group(chat) else {"recipient": chat})
        limit = self.config.attachment_max_bytes
        try:
            result = await self._act(
                "getAttachment", params, doing=f"file {index}", max_bytes=limit * 4 // 3 + 4096
            )
        except TooLarge as err:
            raise PermanentSendError(f"larger than {limit} bytes") from err
        encoded = result.get("data") if isinstance(result, Mapping) else None
        if not isinstance(encoded, str):
            raise PermanentSendError("the daemon returned no data")
        if len(encoded) * 3 // 4 > self.config.attachment_max_bytes:
            raise PermanentSendError(f"larger than {self.config.attachment_max_bytes} bytes")
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError) as err:
            raise PermanentSendError("the daemon returned a file that is not base64") from err
        ref_key = split_message_id(key)
        stamp = ref_key.timestamp if ref_key is not None else 0
        return await keep(
            self.files_dir,
            f"{chat}:{stamp}",
            index,
            data,
            mime_type=ref.mime_type,
            filename=ref.filename,
        )

    # -- sending ----------------------------------------------------------------------------

    async def _send(self, message: OutboundMessage) -> DeliveryReceipt:
        """Deliver one chunk (text and files in one message). Raises RateLimited,
        PermanentSendError or NotReady."""
        chat = str(message.chat_id)
        params: dict[str, Any] = recipient(chat)
        if message.format is TextFormat.MARKDOWN:
            styled = to_signal(message.text)
            text, styles = styled.text, styled.styles
        else:
            text, styles = message.text, ()
        if text.strip():
            params["message"] = text
        if styles:
            params["textStyle"] = list(styles)
        quoted = split_message_id(message.reply_to) if message.reply_to else None
        if quoted is not None and quoted.chat == chat:
            params["quoteTimestamp"] = quoted.timestamp
            params["quoteAuthor"] = quoted.author
        if message.attachments:
            files = []
            for attachment in message.attachments:
                data = await asyncio.to_thread(attachment.path.read_bytes)
                files.append(data_uri(attachment, data))
            params["attachments"] = files
        if "message" not in params and "attachments" not in params:
            raise PermanentSendError("signal: nothing to send (no text and no files)")
        result = await self._act("send", params, doing="send")
        failed = failed_results(result)
        if failed and not is_partial(result):
            raise PermanentSendError(f"signal: send: {', '.join(failed)}")
        stamp = result.get("timestamp") if isinstance(result, Mapping) else None
        if not isinstance(stamp, int):
            raise NotReady("signal: send: the daemon answered without a timestamp")
        return DeliveryReceipt(message_id(chat, self.config.number, stamp))

    async def typing(self, chat_id: ChatId, thread_id: ThreadId | None) -> None:
        """Show "typing…" (Signal shows it for 15 seconds). Raises like `send`."""
        await self._act("sendTyping", recipient(str(chat_id)), doing="typing")

    async def working(self, chat_id: ChatId, message: PlatformMessageId) -> None:
        """Put the working reaction on the message being answered. Raises like `send`."""
        await self._react(message, remove=False)

    async def done(self, chat_id: ChatId, message: PlatformMessageId) -> None:
        """Take the working reaction off again. Raises like `send`."""
        await self._react(message, remove=True)

    async def _react(self, message: PlatformMessageId, *, remove: bool) -> None:
        ref = split_message_id(message)
        emoji = self.config.working_reaction
        if ref is None or not emoji:
            return
        params: dict[str, Any] = {
            **recipient(ref.chat),
            "emoji": emoji,
            "targetAuthor": ref.author,
            "targetTimestamp": ref.timestamp,
        }
        if remove:
            params["remove"] = True
        async with self._inflight.track():
            await self._act("sendReaction", params, doing="reaction")


def _host(url: str) -> str:
    """A URL's host and port, without the user and password it may carry."""
    return urlsplit(url).netloc.rpartition("@")[2]


def is_partial(result: Any) -> bool:
    """Whether a send reached some of its recipients (a group where one member failed)."""
    results = result.get("results") if isinstance(result, Mapping) else None
    return any(isinstance(r, Mapping) and r.get("type") == "SUCCESS" for r in results or ())


async def _lines(reader: aiohttp.StreamReader) -> AsyncGenerator[bytes | None]:
    """The stream's lines (with their `\n`; the last may lack it), None in place of each
    line longer than MAX_EVENT_BYTES (read past, never held whole), until the stream ends."""
    long = False
    while True:
        try:
            raw = await reader.readuntil(b"\n", max_size=MAX_EVENT_BYTES)
        except LineTooLong:
            long = True
            continue
        if not raw:
            return
        if long:
            if raw.endswith(b"\n"):
                long = False
                yield None
            continue
        yield raw


def _parse(data: list[str]) -> Mapping[str, Any] | None:
    """One event's JSON (its `data:` lines joined), or None when it is not an object."""
    try:
        event = json.loads("\n".join(data))
    except ValueError:
        logger.warning("signal: an event that is not JSON was skipped")
        return None
    if not isinstance(event, Mapping):
        return None
    # A JSON-RPC notification (`{"method": "receive", "params": …}`) carries the same object.
    params = event.get("params")
    if event.get("method") == "receive" and isinstance(params, Mapping):
        inner = params.get("result", params)
        return inner if isinstance(inner, Mapping) else None
    return event
