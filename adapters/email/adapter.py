"""The email connection: IMAP in (see `imap.py`), SMTP out, one mailbox.

Replies are threaded from a small per-conversation state kept in the checkpoints,
`thread:<chat>[:<thread>]` → the subject, the last mail received and its References: the outbox
only says whom to answer (and, for direct chats, not which mail), so each inbound mail updates
its conversation's state before it is stored, and a reply answers the latest mail of it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import mimetypes
from dataclasses import replace
from email.message import EmailMessage
from pathlib import Path
from typing import Self

import aiosmtplib

from adapters.email import PLATFORM
from adapters.email.config import REFUSED, EmailConfig, Security
from adapters.email.convert import (
    NO_MESSAGE_ID,
    MailFile,
    ReceivedMail,
    ThreadState,
    build_reply,
    is_address,
    new_message_id,
    to_received,
    unreadable,
)
from adapters.email.imap import ImapSession, IncomingMail, MailReceiver, tls_context
from adapters.files import NOT_ALLOWED, attachment_path, may_fetch, save_file
from gateway.contracts.adapter import AdapterState, Checkpoints, InboundSink
from gateway.contracts.errors import AuthError, NotReady, PermanentSendError
from gateway.contracts.ids import AccountId, ChatId, Platform, PlatformMessageId, ThreadId
from gateway.contracts.messages import (
    Attachment,
    DeliveryReceipt,
    InboundMessage,
    OutboundMessage,
    SendLimits,
    TextFormat,
    utcnow,
)

logger = logging.getLogger(__name__)

MAX_CHUNK = 200_000
"""One reply is one mail."""


def thread_key(chat_id: str, thread_id: str | None) -> str:
    """The checkpoint name of one conversation's reply state."""
    return f"thread:{chat_id}:{thread_id}" if thread_id else f"thread:{chat_id}"


class EmailAdapter:
    """One mailbox: reads a folder over IMAP (IDLE, or polling), answers over SMTP.

    Entering logs in to the IMAP server and opens the folder (AuthError when the login is
    refused, NotReady when the server cannot be reached). SMTP connects per reply.
    """

    platform: Platform = PLATFORM

    def __init__(self, config: EmailConfig, files_dir: Path, checkpoints: Checkpoints) -> None:
        self.config = config
        self.files_dir = files_dir
        self.checkpoints = checkpoints
        self.account = AccountId(config.account)
        self.limits = SendLimits(
            max_chunk=MAX_CHUNK,
            min_edit_interval=60.0,
            max_file_bytes=15 * 1024 * 1024,  # about 20 MB encoded: what most mail servers take
            voice=True,  # an attachment, the spoken text as the body
            voice_caption=MAX_CHUNK,
        )
        self.receiver = MailReceiver(config, checkpoints, self._receive)
        self._session: ImapSession | None = None
        self._entered = False

    async def __aenter__(self) -> Self:
        """Log in to IMAP and open the folder. Raises AuthError or NotReady."""
        session = ImapSession(self.config)
        await session.__aenter__()
        self._session = session
        self._entered = True
        logger.info(
            "email: reading %s on %s as %s (%s)",
            self.config.folder,
            self.config.imap_host,
            self.config.username,
            "IDLE" if session.has_idle else f"polling every {self.config.poll_interval:g}s",
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.__aexit__()

    def liveness(self) -> AdapterState:
        """RECEIVING while IDLE is renewed or polls complete in time."""
        if self._session is None:
            return AdapterState.STOPPED if self._entered else AdapterState.STARTING
        return self.receiver.liveness()

    async def run(self, sink: InboundSink) -> None:
        """Receive until cancelled. Raises NotReady, AuthError, or what `sink.accept` raised."""
        if self._session is None:
            raise NotReady("email: the adapter is not connected")
        await self.receiver.run(self._session, sink)

    async def check(self) -> str:
        """Log in to both servers without taking over receiving (for `herald doctor`).

        Raises AuthError or NotReady.
        """
        async with ImapSession(self.config) as session:
            folder = f"{self.config.folder} (UIDVALIDITY {session.uidvalidity})"
            idle = "IDLE" if session.has_idle else "no IDLE: polling"
        smtp = self._smtp()
        try:
            async with asyncio.timeout(self.config.timeout):
                await smtp.connect()
                await smtp.quit()
        except aiosmtplib.SMTPAuthenticationError as err:
            raise AuthError(f"email: SMTP login refused: {err.code} {err.message}") from err
        except (TimeoutError, OSError, aiosmtplib.SMTPException) as err:
            raise NotReady(f"email: SMTP {self._smtp_where}: {err}") from err
        finally:
            smtp.close()
        return (
            f"{self.config.address}: IMAP {self.config.imap_host} {folder}, {idle}; "
            f"SMTP {self._smtp_where} login ok"
        )

    # -- receiving --------------------------------------------------------------------------

    async def _receive(self, mail: IncomingMail, sink: InboundSink) -> None:
        """Decide from the header block whether the mail is worth reading (its sender may be
        served, it is not automatic, it is within the limits); only then fetch and read the
        whole of it. Keep its files and its conversation's reply state, store it.

        Every parse runs in a worker thread, bounded by `parse_timeout`; a stranger's mail
        costs one header fetch and nothing more.
        """
        cfg = self.config
        unread = None
        if len(mail.header) > cfg.header_max_bytes:
            unread = f"mail not read: a header block over {cfg.header_max_bytes} bytes"
        received = await self._read(mail, mail.header, unread)
        message = received.message
        if not self._worth_reading(message, mail) or not await may_fetch(sink, message):
            await self._store(received, sink)  # rejected: the body is never fetched
            return
        data = await mail.fetch()
        if data is not None:
            received = await self._read(mail, data, None)
        await self._store(received, sink)

    def _worth_reading(self, message: InboundMessage, mail: IncomingMail) -> bool:
        if message.raw.get(REFUSED):
            return False
        if mail.size > self.config.message_max_bytes:
            logger.warning(
                "email: mail uid %d is %d bytes; reading its headers only", mail.uid, mail.size
            )
            return False
        return True

    async def _read(self, mail: IncomingMail, data: bytes, unread: str | None) -> ReceivedMail:
        """`data` normalized in a worker thread within `parse_timeout`; a mail that cannot be
        read, or not in time, comes back refused."""
        cfg = self.config
        read = functools.partial(
            to_received,
            data,
            config=cfg,
            account=self.account,
            uidvalidity=mail.uidvalidity,
            uid=mail.uid,
            now=utcnow(),
            unread=unread,
        )
        try:
            async with asyncio.timeout(cfg.parse_timeout):
                return await asyncio.to_thread(read)
        except TimeoutError:
            # The thread cannot be stopped; it finishes in the background, its result unused.
            logger.warning("email: mail uid %d took over %gs to read", mail.uid, cfg.parse_timeout)
            reason = f"mail not read: reading it took over {cfg.parse_timeout:g}s"
        except Exception as err:
            # One unreadable mail must not hold up the folder: it is recorded as refused.
            logger.warning("email: mail uid %d is unreadable: %r", mail.uid, err)
            reason = f"unreadable mail: {type(err).__name__}"
        if data is not mail.header and unread is None:
            return await self._read(mail, mail.header, reason)
        return unreadable(self.account, mail.uidvalidity, mail.uid, reason)

    async def _store(self, mail: ReceivedMail, sink: InboundSink) -> None:
        message = mail.message
        key = message.platform_message_id
        refused = message.raw.get(REFUSED)
        if refused:
            logger.info("email: mail %s from %s refused: %s", key, message.chat_id, refused)
        else:
            subject = str(message.raw.get("subject", ""))
            own = "" if key.startswith(NO_MESSAGE_ID) else str(key)
            state = ThreadState(subject, own, mail.references[:-1] if own else mail.references)
            await self.checkpoints.set(
                thread_key(message.chat_id, message.thread_id), json.dumps(state.to_json())
            )
        if mail.files and not await may_fetch(sink, message):
            # The mail is rejected anyway: a stranger's attachments are not written to disk.
            notes = [f"[file {f.filename} {NOT_ALLOWED}]" for f in mail.files]
            message = replace(message, text="\n".join([message.text, *notes]))
        elif mail.files:
            where = f"{message.chat_id}:{key}"
            attachments = [await self._save(where, i, f) for i, f in enumerate(mail.files)]
            message = replace(message, attachments=tuple(attachments))
        await sink.accept(message)

    async def _save(self, where: str, index: int, file: MailFile) -> Attachment:
        path = attachment_path(self.files_dir, where, index, file.filename)
        await asyncio.to_thread(save_file, path, file.data)
        return Attachment(path, file.mime_type, len(file.data), file.filename)

    # -- sending ----------------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> DeliveryReceipt:
        """Send one reply (one mail) to `message.chat_id`, threaded into its conversation.

        Raises PermanentSendError (5xx, bad address), AuthError, or NotReady (4xx, network).
        """
        if not is_address(message.chat_id):
            raise PermanentSendError(f"email: {message.chat_id!r} is not an address")
        state = await self._thread_state(message.chat_id, message.thread_id)
        message_id = new_message_id(self.config.address)
        mail = build_reply(
            config=self.config,
            to=str(message.chat_id),
            text=message.text,
            markdown=message.format is TextFormat.MARKDOWN,
            state=state,
            in_reply_to=None
            if message.reply_to is None or message.reply_to.startswith(NO_MESSAGE_ID)
            else str(message.reply_to),
            message_id=message_id,
            now=utcnow(),
        )
        for attachment in message.attachments:
            await _attach(mail, attachment)
        await self._deliver(mail, str(message.chat_id))
        return DeliveryReceipt(PlatformMessageId(message_id.strip("<>")))

    async def _thread_state(self, chat: ChatId, thread: ThreadId | None) -> ThreadState | None:
        raw = await self.checkpoints.get(thread_key(chat, thread))
        if raw is None:
            return None
        try:
            return ThreadState.from_json(json.loads(raw))
        except ValueError:
            return None

    @property
    def _smtp_where(self) -> str:
        return f"{self.config.smtp_host}:{self.config.smtp_port}"

    def _smtp(self) -> aiosmtplib.SMTP:
        cfg = self.config
        return aiosmtplib.SMTP(
            hostname=cfg.smtp_host,
            port=cfg.smtp_port,
            username=cfg.username,
            password=cfg.password.get_secret_value(),
            local_hostname=cfg.address.rpartition("@")[2],
            timeout=cfg.timeout,
            use_tls=cfg.smtp_security is Security.TLS,
            start_tls=cfg.smtp_security is Security.STARTTLS,
            tls_context=tls_context(cfg) if cfg.smtp_security is not Security.NONE else None,
        )

    async def _deliver(self, mail: EmailMessage, to: str) -> None:
        smtp = self._smtp()
        try:
            async with asyncio.timeout(self.config.timeout * 3):
                await smtp.connect()
                await smtp.send_message(mail, sender=self.config.address, recipients=[to])
                await smtp.quit()
        except aiosmtplib.SMTPAuthenticationError as err:
            raise AuthError(f"email: SMTP login refused: {err.code} {err.message}") from err
        except aiosmtplib.SMTPRecipientsRefused as err:
            codes = [r.code for r in err.recipients]
            detail = "; ".join(f"{r.code} {r.message}" for r in err.recipients)
            if codes and all(500 <= c < 600 for c in codes):
                raise PermanentSendError(f"email: {to} refused: {detail}") from err
            raise NotReady(f"email: {to} refused for now: {detail}") from err
        except aiosmtplib.SMTPResponseException as err:
            if 500 <= err.code < 600:
                raise PermanentSendError(f"email: SMTP {err.code} {err.message}") from err
            raise NotReady(f"email: SMTP {err.code} {err.message}") from err
        except (TimeoutError, OSError, aiosmtplib.SMTPException) as err:
            raise NotReady(f"email: SMTP {self._smtp_where}: {err}") from err
        finally:
            smtp.close()


async def _attach(mail: EmailMessage, attachment: Attachment) -> None:
    data = await asyncio.to_thread(attachment.path.read_bytes)
    mime = attachment.mime_type or mimetypes.guess_type(attachment.path.name)[0]
    maintype, _, subtype = (mime or "application/octet-stream").partition("/")
    mail.add_attachment(
        data,
        maintype=maintype,
        subtype=subtype or "octet-stream",
        filename=attachment.filename or attachment.path.name,
    )
