"""The delivery worker: sends outbox chunks through the adapters, one task per busy chat.

Chunks of one chat go out in order, spaced by the adapter's `min_send_interval`. A chat that
is rate-limited or failing waits on its own rows only (its `next_attempt_at`); no lock or
sleep is shared between chats, so one slow chat never delays another. Order, spacing and
retry times live in SQL (`Outbox.take`), so they hold across instances sharing a database.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Protocol, TypeVar

from sqlalchemy.exc import DBAPIError

from gateway.backoff import Backoff, FailureLog
from gateway.channels import Channels
from gateway.chunking import markdown_to_plain
from gateway.config import DeliveryConfig
from gateway.contracts.adapter import MessageEditor
from gateway.contracts.errors import (
    FileGone,
    FileTooLarge,
    MarkupRejected,
    PermanentSendError,
    RateLimited,
)
from gateway.contracts.messages import Attachment, OutboundMessage, TextFormat, utcnow
from gateway.metrics import Metrics
from gateway.redact import Redactor
from gateway.store.outbox import Outbox, OutboxRow

logger = logging.getLogger(__name__)

Chat = tuple[str, str, str]
T = TypeVar("T")


class FileSource(Protocol):
    """Where the bytes of a chunk's file come from (`gateway.media.StoredFiles`)."""

    async def stored(self, attachment: Attachment) -> Attachment:
        """The attachment with its bytes in the blob store. Raises FileGone, FileTooLarge,
        FileStoreUnavailable."""
        ...

    async def local(self, attachment: Attachment) -> Path:
        """A real file with its bytes here. Raises FileGone, FileStoreUnavailable."""
        ...


STORE_ERRORS = (DBAPIError, OSError)
"""What a database that is away, full or read-only raises: worth retrying the same write."""


class DeliveryWorker:
    """Runs until cancelled; `wake()` after committing new chunks makes it look at once."""

    def __init__(
        self,
        outbox: Outbox,
        channels: Channels,
        config: DeliveryConfig,
        metrics: Metrics,
        *,
        clock: Callable[[], datetime] = utcnow,
        owner: str = "",
        lease_ttl: float | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        redactor: Redactor | None = None,
        files: FileSource | None = None,
    ) -> None:
        """`owner` is this instance's id; `lease_ttl` is set when several instances share the
        database (the chunks of one that is gone that long are recovered here). `sleep`
        waits out a backoff while the database fails. `redactor` takes the configured secrets
        out of every text sent and every send error kept."""
        self.redactor = redactor or Redactor()
        self.files = files
        """Materialises a chunk's file on this instance before its send (None: the
        attachment's path is used as it is)."""
        self.outbox = outbox
        self.channels = channels
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self.owner = owner
        self.lease_ttl = lease_ttl
        self.backoff = Backoff(initial=config.backoff_initial, maximum=config.backoff_max)
        """Between tries of one chunk to its platform."""
        self.store_backoff = Backoff(
            initial=min(config.backoff_initial, config.store_retry_max),
            maximum=config.store_retry_max,
        )
        """Between tries of the database: its own cap, since every chat's failure counts and
        a short outage must not leave replies waiting for minutes after it ends."""
        self.sleep = sleep
        self.failures = FailureLog(logger, "delivery (the outbox in the database)")
        """The current run of database failures; each one backs the worker off further."""
        self._chat_failed = False
        """A chat's task failed since the last look (the next look backs off first)."""
        self._served = 0
        """Chat tasks started so far."""
        self._wake = asyncio.Event()
        self._busy: set[Chat] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._orphans_at = 0.0
        """When gone instances' unfinished sends were last looked for (monotonic)."""

    def wake(self) -> None:
        """New chunks were committed (or a chat became free): scan now."""
        self._wake.set()

    @property
    def busy_chats(self) -> int:
        """Chats being served right now."""
        return len(self._busy)

    async def run(self) -> None:
        """Recover unknown-outcome chunks, then deliver until cancelled.

        While the database fails (away, disk full, read-only), each look waits a growing,
        jittered backoff first, and the failure is logged once per interval, not per try.
        """
        recovered = False
        async with asyncio.TaskGroup() as tg:
            while True:
                if self._chat_failed:
                    self._chat_failed = False
                    await self._back_off()
                self._wake.clear()
                try:
                    if not recovered:
                        await self._recover(started=True)
                        recovered = True
                    if self.lease_ttl is not None:
                        await self._look_for_orphans()
                    served = self._served
                    skipped, later = await self._dispatch(tg)
                    if served == self._served and not skipped and not self._chat_failed:
                        self.failures.recovered()  # looked, and nothing is left failing
                    await self._pause(skipped, later)
                except Exception as err:
                    self.failures.failed(err)
                    await self._back_off()

    async def _back_off(self) -> None:
        await self.sleep(self.store_backoff.delay(max(0, self.failures.failures - 1)))

    async def _recover(self, *, started: bool) -> None:
        resend, dead = await self.outbox.recover(
            max_age=self.config.max_age,
            max_attempts=self.config.max_attempts,
            owner=self.owner,
            lease_ttl=self.lease_ttl,
            started=started,
        )
        if resend or dead:
            logger.warning(
                "%d chunk(s) had an unknown outcome%s: %d will be resent marked recovered, "
                "%d became dead letters",
                resend + dead,
                "" if started else " (their instance is gone)",
                resend,
                dead,
            )

    async def _look_for_orphans(self) -> None:
        assert self.lease_ttl is not None
        if time.monotonic() - self._orphans_at < self.lease_ttl / 3:
            return
        self._orphans_at = time.monotonic()
        try:
            await self._recover(started=False)
        except Exception as err:  # the database may be away: look again later
            logger.warning("could not look for unfinished sends of gone instances: %s", err)

    async def _dispatch(self, tg: asyncio.TaskGroup) -> tuple[bool, datetime | None]:
        """Serve the due chats that are not served yet; whether any was left for a later
        look, and when the next chunk not due yet becomes due (one read for both)."""
        platforms = self.channels.platforms()
        if not platforms:
            return False, None
        free = self.config.concurrency - len(self._busy)
        limit = self.config.concurrency * 2
        chats, later = await self.outbox.look(
            self.clock(), platforms=platforms, limit=limit, away=self.channels.away()
        )
        skipped = len(chats) >= limit  # more may be due than one look returns
        for chat in chats:
            if chat in self._busy:
                skipped = True
                continue
            if self.channels.known(chat[0], chat[1]) and not self.channels.adapter(*chat[:2]):
                # Another account of a platform live here, its receiver elsewhere (or
                # reconnecting): left to the instance that holds it.
                skipped = True
                continue
            if free <= 0:
                skipped = True
                break
            free -= 1
            self._busy.add(chat)
            self._served += 1
            self._idle.clear()
            tg.create_task(self._serve(chat), name=f"deliver {chat[0]}:{chat[2]}")
        return skipped, later

    async def _pause(self, skipped: bool, later: datetime | None) -> None:
        """Until woken, or until the chunk due next (`later`) is due; a look that left chats
        for later waits at most a second for a served chat to free up."""
        timeout = 1.0
        if self.lease_ttl is not None:
            timeout = min(timeout, self.lease_ttl / 3)
        if not skipped:
            longest = 5.0 if self.lease_ttl is None else min(5.0, self.lease_ttl / 3)
            if later is not None:
                timeout = min(longest, max(0.02, (later - self.clock()).total_seconds()))
            else:
                timeout = longest
        try:
            async with asyncio.timeout(timeout):
                await self._wake.wait()
        except TimeoutError:
            pass

    async def flush(self, grace: float) -> bool:
        """Deliver for up to `grace` seconds; True once nothing is left to send or sending."""
        try:
            async with asyncio.timeout(grace):
                while True:
                    await self._idle.wait()
                    platforms = self.channels.platforms()
                    left = platforms and (
                        await self.outbox.next_due_at(
                            platforms=platforms, away=self.channels.away()
                        )
                        is not None
                    )
                    if not left and self._idle.is_set():
                        return True
                    self.wake()
                    await asyncio.sleep(0.05)
        except TimeoutError:
            return False

    async def _serve(self, chat: Chat) -> None:
        # The spacing counts from the end of the chat's last send (the platform's view).
        interval = self.channels.limits(chat[0], chat[1]).min_send_interval
        try:
            while True:
                taken = await self.outbox.take(
                    chat, owner=self.owner, now=self.clock(), interval=interval
                )
                if taken is None:
                    return
                self.failures.recovered()
                if isinstance(taken, float):
                    await asyncio.sleep(taken)
                    continue
                if not await self._deliver(taken):
                    return  # sent, and the chat had nothing else waiting: no empty take
        except Exception as err:
            self.failures.failed(err)
            self._chat_failed = True
        finally:
            self._busy.discard(chat)
            if not self._busy:
                self._idle.set()
            self._wake.set()

    async def _deliver(self, row: OutboxRow) -> bool:  # noqa: PLR0912 - one branch per send outcome the worker records
        """Send a chunk this worker has taken (`sending`, its attempt counted). False when
        it was sent and its chat had nothing else waiting then; True: look at the chat again."""
        now = self.clock()
        target = row.target
        if (now - row.created_at).total_seconds() > self.config.max_age:
            await self._dead(row, f"not delivered within {self.config.max_age:.0f}s; too old")
            return True
        if not self.channels.known(target.platform, target.account):
            await self._dead(row, f"no {target.platform} account {target.account!r} is configured")
            return True
        adapter = self.channels.adapter(target.platform, target.account)
        if adapter is None:
            # Not an attempt: the adapter is reconnecting. Freshness still bounds the wait.
            at = now + timedelta(seconds=self.backoff.delay(0))
            await self._record(
                lambda: self.outbox.retry_at(row.id, at, "adapter not connected", attempt=False)
            )
            return True
        attempts = row.attempts
        try:
            message = await self._with_files(self._outward(row.message()))
            if row.edit_of is not None and isinstance(adapter, MessageEditor):
                receipt = await adapter.edit(row.edit_of, message)
            else:
                receipt = await adapter.send(message)
        except RateLimited as err:
            now = self.clock()
            self.metrics.deliveries.labels(outcome="rate_limited").inc()
            logger.info(
                "%s:%s rate-limited for %.1fs", target.platform, target.chat_id, err.retry_after
            )
            at, error = now + timedelta(seconds=err.retry_after), self.redactor(str(err))
            await self._record(lambda: self.outbox.retry_at(row.id, at, error, attempt=False))
        except MarkupRejected as err:
            if row.format is TextFormat.PLAIN:
                await self._dead(row, f"refused even as plain text: {err}")
            else:
                logger.info("markup refused for chunk %d; resending as plain text", row.id)
                plain = markdown_to_plain(row.text)
                await self._record(lambda: self.outbox.as_plain(row.id, plain))
        except PermanentSendError as err:
            if row.edit_of is not None:
                # The preview to replace is gone; send the text as a new message instead.
                reason = self.redactor(str(err))
                await self._record(lambda: self.outbox.without_edit(row.id, reason))
            elif _voice_with_text(row):
                # A voice reply refused (voice notes turned off, the audio gone): its caption
                # is the answer, or the start of it; it goes as text.
                reason = self.redactor(str(err))
                logger.info("voice reply %d refused (%s); sending its text alone", row.id, reason)
                await self._record(lambda: self.outbox.without_voice(row.id, reason))
            else:
                await self._dead(row, str(err))
        except Exception as err:  # transient by default: NotReady, timeouts, surprises
            now = self.clock()
            error = self.redactor(f"{type(err).__name__}: {err}")
            if attempts >= self.config.max_attempts and _voice_with_text(row):
                # The audio would not go (an upload timing out each time): its text one try.
                logger.info("voice reply %d not sent (%s); sending its text alone", row.id, error)
                await self._record(lambda: self.outbox.without_voice(row.id, error))
            elif attempts >= self.config.max_attempts:
                await self._dead(row, f"gave up after {attempts} tries: {error}")
            else:
                self.metrics.deliveries.labels(outcome="retry").inc()
                at = now + timedelta(seconds=self.backoff.delay(attempts - 1))
                await self._record(lambda: self.outbox.retry_at(row.id, at, error))
        else:
            self.metrics.deliveries.labels(outcome="sent").inc()
            return await self._record(
                lambda: self.outbox.sent(row.id, receipt.platform_message_id, receipt.delivered_at)
            )
        return True

    async def _record(self, write: Callable[[], Awaitable[T]]) -> T:
        """Store what became of a chunk this worker holds (`sending`), retrying with backoff
        while the database fails: only this worker knows the outcome, and the chat waits
        for it (a crash meanwhile leaves the chunk to the restart's recovery)."""
        while True:
            try:
                result = await write()
            except STORE_ERRORS as err:
                self.failures.failed(err)
                await self._back_off()
            else:
                self.failures.recovered()
                return result

    async def _with_files(self, message: OutboundMessage) -> OutboundMessage:
        """`message` with each file a real file on this instance. Raises PermanentSendError
        (no longer kept, or too large) or FileStoreUnavailable (try again later)."""
        if not message.attachments or self.files is None:
            return message
        out: list[Attachment] = []
        for a in message.attachments:
            name = a.filename or a.path.name
            try:
                kept = await self.files.stored(a)
                out.append(replace(kept, path=await self.files.local(kept)))
            except (FileGone, FileTooLarge) as err:
                raise PermanentSendError(f"the file {name} cannot be sent: {err}") from err
        return replace(message, attachments=tuple(out))

    def _outward(self, message: OutboundMessage) -> OutboundMessage:
        """`message` with the configured secrets taken out of its text."""
        text = self.redactor.secrets(message.text)
        return message if text == message.text else replace(message, text=text)

    async def _dead(self, row: OutboxRow, reason: str) -> None:
        reason = self.redactor(reason)
        self.metrics.deliveries.labels(outcome="dead").inc()
        logger.warning(
            "chunk %d to %s:%s is a dead letter: %s",
            row.id,
            row.target.platform,
            row.target.chat_id,
            reason,
        )
        await self._record(lambda: self.outbox.dead(row.id, reason))


def _voice_with_text(row: OutboxRow) -> bool:
    """Whether `row` is a voice reply carrying text that can go alone."""
    return row.attachment is not None and row.attachment.voice and bool(row.text.strip())
