"""Receiving over IMAP: IDLE (polling when the server has none), a durable UID watermark.

Per folder, one checkpoint `watermark:<folder>` = `<uidvalidity>:<uid>`: the highest UID whose
mail is in Herald's inbox and flagged or moved on the server (one value, so the UID can never
be read under another UIDVALIDITY). For each new mail, in order:
fetch its size and header block (BODY.PEEK, so reading does not flag it) → `receive` decides
from them whether the body is fetched at all, and stores it in the inbox → flag it `\\Seen` (or
move it) → advance the watermark. A crash anywhere in between fetches the mail
again on the next start, and the inbox's unique Message-ID makes that a no-op. When the
folder's UIDVALIDITY changed (or on the very first start) the watermark is meaningless: the
folder's unseen mail is read instead, and the mail already seen before is left alone.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Self

import aioimaplib

from adapters.email.config import AfterReceipt, EmailConfig, Security
from gateway.contracts.adapter import AdapterState, Checkpoints, InboundSink
from gateway.contracts.errors import AuthError, NotReady

logger = logging.getLogger(__name__)

LIVENESS_GRACE = 30.0
"""Seconds past the IDLE renewal (or the poll interval) before `/ready` calls the folder quiet."""
_LOST = b"herald: connection lost"
_UIDVALIDITY = re.compile(rb"\[UIDVALIDITY (\d+)\]")
_UIDNEXT = re.compile(rb"\[UIDNEXT (\d+)\]")
_FETCH_UID = re.compile(rb"\bUID (\d+)")
_FETCH_SIZE = re.compile(rb"RFC822\.SIZE (\d+)")


@dataclass(frozen=True, slots=True)
class IncomingMail:
    """A new mail of the folder: its size and header block, and how to fetch the rest."""

    uidvalidity: int
    uid: int
    size: int
    """The whole mail's size (RFC822.SIZE)."""
    header: bytes
    """The header block, at most `header_max_bytes + 1` bytes of it (more: it is too large)."""
    fetch: Callable[[], Awaitable[bytes | None]]
    """The whole mail (None when it is gone); only called for a mail worth reading."""


Receive = Callable[[IncomingMail, InboundSink], Awaitable[None]]
"""Store one mail in the inbox; return only after the commit."""


def tls_context(config: EmailConfig) -> ssl.SSLContext:
    """The TLS settings for both servers."""
    context = ssl.create_default_context()
    if not config.tls_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class ImapSession:
    """One logged-in IMAP connection with the folder selected. An async context manager.

    Entering raises AuthError when the login is refused and NotReady when the server cannot
    be reached or the folder not opened.
    """

    def __init__(self, config: EmailConfig) -> None:
        self.config = config
        self.client: aioimaplib.IMAP4 | None = None
        self.uidvalidity = 0
        self.uidnext = 0
        """UIDNEXT when the folder was opened: mail below it existed before."""
        self.lost = False

    async def __aenter__(self) -> Self:
        try:
            async with asyncio.timeout(self.config.timeout):
                await self._open()
        except (TimeoutError, OSError, aioimaplib.AioImapException) as err:
            await self.__aexit__()
            raise NotReady(f"email: IMAP {self._where}: {err or type(err).__name__}") from err
        except BaseException:
            await self.__aexit__()
            raise
        return self

    @property
    def _where(self) -> str:
        return f"{self.config.imap_host}:{self.config.imap_port}"

    async def _open(self) -> None:
        cfg = self.config
        if cfg.imap_security is Security.TLS:
            client: aioimaplib.IMAP4 = aioimaplib.IMAP4_SSL(
                cfg.imap_host, cfg.imap_port, timeout=cfg.timeout, ssl_context=tls_context(cfg)
            )
        else:
            client = aioimaplib.IMAP4(cfg.imap_host, cfg.imap_port, timeout=cfg.timeout)
        client.protocol.conn_lost_cb = self._connection_lost
        self.client = client
        await client.wait_hello_from_server()
        if cfg.imap_security is Security.STARTTLS:
            await self._starttls(client)
        login = await client.login(cfg.username, cfg.password.get_secret_value())
        if login.result != "OK":
            raise AuthError(f"email: IMAP login refused: {_text(login.lines)}")
        await client.protocol.capability()  # servers may list IDLE only after login
        selected = await client.select(_quote(cfg.folder))
        if selected.result != "OK":
            raise NotReady(f"email: cannot open folder {cfg.folder!r}: {_text(selected.lines)}")
        for line in selected.lines:
            match = _UIDVALIDITY.search(line)
            if match:
                self.uidvalidity = int(match.group(1))
            match = _UIDNEXT.search(line)
            if match:
                self.uidnext = int(match.group(1))
        if not self.uidvalidity:
            raise NotReady(f"email: folder {cfg.folder!r} has no UIDVALIDITY")

    async def _starttls(self, client: aioimaplib.IMAP4) -> None:
        protocol = client.protocol
        if "STARTTLS" not in protocol.capabilities:
            raise NotReady(f"email: IMAP {self._where} does not offer STARTTLS")
        command = aioimaplib.Command("STARTTLS", protocol.new_tag(), loop=protocol.loop)
        response = await protocol.execute(command)
        if response.result != "OK":
            raise NotReady(f"email: STARTTLS refused: {_text(response.lines)}")
        loop = asyncio.get_running_loop()
        transport = await loop.start_tls(
            protocol.transport,
            protocol,
            tls_context(self.config),
            server_hostname=self.config.imap_host,
        )
        protocol.transport = transport
        await protocol.capability()

    async def __aexit__(self, *exc: object) -> None:
        client, self.client = self.client, None
        if client is None:
            return
        if not self.lost:
            try:
                async with asyncio.timeout(2.0):
                    await client.logout()
            except (TimeoutError, OSError, aioimaplib.AioImapException):
                pass
        transport = client.protocol.transport
        if transport is not None:
            transport.close()

    def _connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.client is not None:
            # Wakes an IDLE wait; commands in flight end by their own timeout.
            self.client.protocol.idle_queue.put_nowait([_LOST])

    def _client(self) -> aioimaplib.IMAP4:
        if self.client is None or self.lost:
            raise NotReady("email: the IMAP connection was lost")
        return self.client

    async def command(
        self, what: str, call: Callable[[aioimaplib.IMAP4], Awaitable[aioimaplib.Response]]
    ) -> aioimaplib.Response:
        """Run one command; NotReady when the connection fails or the server says NO/BAD."""
        client = self._client()
        try:
            async with asyncio.timeout(self.config.timeout):
                response = await call(client)
        except (TimeoutError, OSError, aioimaplib.AioImapException) as err:
            raise NotReady(f"email: IMAP {what} failed: {err or type(err).__name__}") from err
        if self.lost:
            raise NotReady(f"email: the IMAP connection was lost during {what}")
        if response.result != "OK":
            raise NotReady(
                f"email: IMAP {what} answered {response.result}: {_text(response.lines)}"
            )
        return response

    async def new_uids(self, after: int | None) -> list[int]:
        """UIDs above `after`, ascending; the unseen mail when `after` is None."""
        if after is None:
            response = await self.command("SEARCH", lambda c: c.uid_search("UNSEEN"))
        else:
            response = await self.command("SEARCH", lambda c: c.uid_search("UID", f"{after + 1}:*"))
        found: set[int] = set()
        for line in response.lines[:-1]:
            for word in bytes(line).split():
                if word.isdigit():
                    found.add(int(word))
        return sorted(uid for uid in found if after is None or uid > after)

    async def fetch_head(self, uid: int) -> tuple[int, bytes] | None:
        """(size, header block) of a mail, the block cut after `header_max_bytes + 1` bytes
        (a partial fetch: a larger one is never read whole); None when the mail is gone."""
        items = f"(UID RFC822.SIZE BODY.PEEK[HEADER]<0.{self.config.header_max_bytes + 1}>)"
        response = await self.command("FETCH", lambda c: c.uid("fetch", str(uid), items))
        size, header = None, b""
        for line in response.lines:
            if isinstance(line, bytearray):
                header = bytes(line)
            elif _FETCH_UID.search(line):
                match = _FETCH_SIZE.search(line)
                size = int(match.group(1)) if match else 0
        return None if size is None else (size, header)

    async def fetch(self, uid: int) -> bytes | None:
        """The whole mail; None when it is gone."""
        response = await self.command("FETCH", lambda c: c.uid("fetch", str(uid), "(BODY.PEEK[])"))
        for line in response.lines:
            if isinstance(line, bytearray):
                return bytes(line)
        return None

    async def settle(self, uid: int) -> None:
        """Flag the mail `\\Seen`, or move it, per config (after it is in the inbox)."""
        if self.config.after_receipt is AfterReceipt.MOVE:
            target = _quote(self.config.move_to)
            if self._client().has_capability("MOVE"):
                await self.command("MOVE", lambda c: c.uid("move", str(uid), target))
                return
            # RFC 6851's fallback: copy, flag deleted, expunge (this UID only with UIDPLUS).
            await self.command("COPY", lambda c: c.uid("copy", str(uid), target))
            deleted = "+FLAGS.SILENT (\\Deleted \\Seen)"
            await self.command("STORE", lambda c: c.uid("store", str(uid), deleted))
            if self._client().has_capability("UIDPLUS"):
                await self.command("EXPUNGE", lambda c: c.uid("expunge", str(uid)))
            else:
                await self.command("EXPUNGE", lambda c: c.expunge())
        else:
            await self.command(
                "STORE", lambda c: c.uid("store", str(uid), "+FLAGS.SILENT (\\Seen)")
            )

    @property
    def has_idle(self) -> bool:
        """Whether the server offers IDLE."""
        return self.client is not None and self.client.has_capability("IDLE")

    async def idle(self, renew: float, alive: Callable[[], None]) -> None:
        """Wait in IDLE until the folder changes or `renew` seconds pass; NotReady when the
        connection is lost. `alive` is called whenever the server shows it is there."""
        client = self._client()
        try:
            async with asyncio.timeout(self.config.timeout):
                idle = await client.idle_start(timeout=renew)
        except (TimeoutError, OSError, aioimaplib.AioImapException) as err:
            raise NotReady(f"email: IDLE failed: {err or type(err).__name__}") from err
        alive()
        changed = False
        try:
            while not changed:
                try:
                    push = await client.wait_server_push(timeout=renew + self.config.timeout)
                except TimeoutError as err:
                    raise NotReady("email: IDLE went quiet past its renewal") from err
                if _LOST in push or self.lost:
                    raise NotReady("email: the IMAP connection was lost")
                if any(bytes(line).startswith(b"BYE") for line in push):
                    raise NotReady("email: the IMAP server ended the session")
                alive()
                if push == aioimaplib.STOP_WAIT_SERVER_PUSH:
                    break
                changed = any(re.search(rb"\d+ (EXISTS|RECENT)", bytes(line)) for line in push)
        finally:
            if not self.lost and client.has_pending_idle():
                client.idle_done()
                try:
                    async with asyncio.timeout(self.config.timeout):
                        await idle
                except (TimeoutError, OSError, aioimaplib.AioImapException):
                    self.lost = True
            else:
                idle.cancel()
        if self.lost:
            raise NotReady("email: the IMAP connection was lost")

    async def noop(self) -> None:
        """A NOOP (polling without IDLE: new mail is then found by the next search)."""
        await self.command("NOOP", lambda c: c.noop())


class MailReceiver:
    """Reads one folder until cancelled: catches up from the watermark, then IDLEs (or polls)."""

    def __init__(
        self,
        config: EmailConfig,
        checkpoints: Checkpoints,
        receive: Receive,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.checkpoints = checkpoints
        self.receive = receive
        self.clock = clock
        self.idles = 0
        self._interval = max(config.idle_renew, config.poll_interval)
        """How often the server shows it is there: the IDLE renewal, or the poll interval."""
        """IDLE commands issued so far (each renewal is one)."""
        self._last_alive: float | None = None

    @property
    def _window(self) -> float:
        return self._interval + self.config.timeout + LIVENESS_GRACE

    def _alive(self) -> None:
        self._last_alive = self.clock()

    def liveness(self) -> AdapterState:
        """RECEIVING while IDLE is renewed (or polls complete) in time; RECONNECTING after."""
        if self._last_alive is None:
            return AdapterState.STARTING
        late = self.clock() - self._last_alive > self._window
        return AdapterState.RECONNECTING if late else AdapterState.RECEIVING

    async def run(self, session: ImapSession, sink: InboundSink) -> None:
        """Receive on `session` until cancelled. Raises NotReady (reconnect) or what `receive`
        raised."""
        cfg = self.config
        self._interval = cfg.idle_renew if session.has_idle else cfg.poll_interval
        self._alive()
        while True:
            # Again until nothing is new: the server announces mail that arrives during a
            # catch-up (EXISTS) inside another command's answer, never again in the IDLE.
            while await self.catch_up(session, sink):
                pass
            self._alive()
            if session.has_idle:
                self.idles += 1
                await session.idle(self.config.idle_renew, self._alive)
            else:
                await asyncio.sleep(self.config.poll_interval)
                await session.noop()

    async def catch_up(self, session: ImapSession, sink: InboundSink) -> int:
        """Store every mail above the watermark, in UID order; the number handled."""
        key = f"watermark:{self.config.folder}"
        stored = await self.checkpoints.get(key)
        watermark = _watermark(stored, session.uidvalidity)
        if watermark is None and stored is not None:
            logger.warning(
                "email: %s UIDVALIDITY changed (%s → %d); reading its unseen mail again",
                self.config.folder,
                stored.partition(":")[0],
                session.uidvalidity,
            )
        handled = 0
        for uid in await session.new_uids(watermark):
            head = await session.fetch_head(uid)
            if head is not None:
                size, header = head
                fetch = functools.partial(session.fetch, uid)
                mail = IncomingMail(session.uidvalidity, uid, size, header, fetch)
                await self.receive(mail, sink)
                await session.settle(uid)
            watermark = max(watermark or 0, uid)
            await self.checkpoints.set(key, f"{session.uidvalidity}:{watermark}")
            handled += 1
        if watermark is None or watermark < session.uidnext - 1:
            # First start, or a new UIDVALIDITY: older mail that is already seen is not news.
            top = max(watermark or 0, session.uidnext - 1)
            await self.checkpoints.set(key, f"{session.uidvalidity}:{top}")
        return handled


def _watermark(stored: str | None, uidvalidity: int) -> int | None:
    """The UID watermark when `stored` (`<uidvalidity>:<uid>`) is for this UIDVALIDITY."""
    if stored is None:
        return None
    validity, _, uid = stored.partition(":")
    if validity != str(uidvalidity) or not uid.isdigit():
        return None
    return int(uid)


def _quote(folder: str) -> str:
    escaped = folder.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _text(lines: list[bytes | bytearray]) -> str:
    return " ".join(bytes(line).decode("utf-8", "replace") for line in lines)[:300]
