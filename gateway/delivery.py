"""The delivery worker: sends outbox chunks through the adapters, one task per busy chat.

Chunks of one chat go out in order, spaced by the adapter's `min_send_interval`. A chat that
is rate-limited or failing waits on its own rows only (its `next_attempt_at`); no lock or
sleep is shared between chats, so one slow chat never delays another.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from gateway.backoff import Backoff
from gateway.channels import Channels
from gateway.chunking import markdown_to_plain
from gateway.config import DeliveryConfig
from gateway.contracts.adapter import MessageEditor
from gateway.contracts.errors import MarkupRejected, PermanentSendError, RateLimited
from gateway.contracts.messages import TextFormat, utcnow
from gateway.metrics import Metrics
from gateway.outbox import Outbox, OutboxRow

logger = logging.getLogger(__name__)

Chat = tuple[str, str, str]


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
    ) -> None:
        self.outbox = outbox
        self.channels = channels
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self.backoff = Backoff(initial=config.backoff_initial, maximum=config.backoff_max)
        self._wake = asyncio.Event()
        self._busy: set[Chat] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._last_send: dict[Chat, float] = {}
        """When each chat was last sent to (monotonic), for `min_send_interval`."""

    def wake(self) -> None:
        """New chunks were committed (or a chat became free): scan now."""
        self._wake.set()

    @property
    def busy_chats(self) -> int:
        """Chats being served right now."""
        return len(self._busy)

    async def run(self) -> None:
        """Recover unknown-outcome chunks, then deliver until cancelled."""
        resend, dead = await self.outbox.recover(
            max_age=self.config.max_age, max_attempts=self.config.max_attempts
        )
        if resend or dead:
            logger.warning(
                "%d chunk(s) had an unknown outcome: %d will be resent marked recovered, "
                "%d became dead letters",
                resend + dead,
                resend,
                dead,
            )
        async with asyncio.TaskGroup() as tg:
            while True:
                self._wake.clear()
                skipped = await self._dispatch(tg)
                await self._pause(skipped)

    async def _dispatch(self, tg: asyncio.TaskGroup) -> bool:
        platforms = self.channels.platforms()
        if not platforms:
            return False
        skipped = False
        free = self.config.concurrency - len(self._busy)
        chats = await self.outbox.due_chats(
            self.clock(), platforms=platforms, limit=self.config.concurrency * 2
        )
        for chat in chats:
            if chat in self._busy:
                skipped = True
                continue
            if free <= 0:
                skipped = True
                break
            free -= 1
            self._busy.add(chat)
            self._idle.clear()
            tg.create_task(self._serve(chat), name=f"deliver {chat[0]}:{chat[2]}")
        return skipped

    async def _pause(self, skipped: bool) -> None:
        timeout = 1.0
        if not skipped:
            due = await self.outbox.next_due_at(platforms=self.channels.platforms())
            if due is not None:
                timeout = min(5.0, max(0.02, (due - self.clock()).total_seconds()))
            else:
                timeout = 5.0
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
                        await self.outbox.next_due_at(platforms=platforms) is not None
                    )
                    if not left and self._idle.is_set():
                        return True
                    self.wake()
                    await asyncio.sleep(0.05)
        except TimeoutError:
            return False

    async def _serve(self, chat: Chat) -> None:
        interval = self.channels.limits(chat[0], chat[1]).min_send_interval
        try:
            while True:
                row = await self.outbox.head(chat)
                if row is None or row.next_attempt_at > self.clock():
                    return
                wait = self._last_send.get(chat, -math.inf) + interval - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                await self._deliver(row)
                if interval > 0:  # measured from the end of the send: the platform's view
                    self._last_send[chat] = time.monotonic()
        except Exception:
            logger.exception("delivery to %s failed unexpectedly", chat)
        finally:
            self._forget_old_sends()
            self._busy.discard(chat)
            if not self._busy:
                self._idle.set()
            self._wake.set()

    def _forget_old_sends(self) -> None:
        if len(self._last_send) > 1024:  # keep memory bounded however many chats there are
            horizon = time.monotonic() - 600
            self._last_send = {c: t for c, t in self._last_send.items() if t > horizon}

    async def _deliver(self, row: OutboxRow) -> None:
        now = self.clock()
        target = row.target
        if (now - row.created_at).total_seconds() > self.config.max_age:
            await self._dead(row, f"not delivered within {self.config.max_age:.0f}s; too old")
            return
        if not self.channels.known(target.platform, target.account):
            await self._dead(row, f"no {target.platform} account {target.account!r} is configured")
            return
        adapter = self.channels.adapter(target.platform, target.account)
        if adapter is None:
            # Not an attempt: the adapter is reconnecting. Freshness still bounds the wait.
            await self.outbox.retry_at(
                row.id, now + timedelta(seconds=self.backoff.delay(0)), "adapter not connected"
            )
            return
        if not await self.outbox.claim(row.id):
            return
        attempts = row.attempts + 1
        try:
            message = row.message()
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
            await self.outbox.retry_at(
                row.id, now + timedelta(seconds=err.retry_after), str(err), attempt=False
            )
        except MarkupRejected as err:
            if row.format is TextFormat.PLAIN:
                await self._dead(row, f"refused even as plain text: {err}")
            else:
                logger.info("markup refused for chunk %d; resending as plain text", row.id)
                await self.outbox.as_plain(row.id, markdown_to_plain(row.text))
        except PermanentSendError as err:
            if row.edit_of is not None:
                # The preview to replace is gone; send the text as a new message instead.
                await self.outbox.without_edit(row.id, str(err))
            else:
                await self._dead(row, str(err))
        except Exception as err:  # transient by default: NotReady, timeouts, surprises
            now = self.clock()
            error = f"{type(err).__name__}: {err}"
            if attempts >= self.config.max_attempts:
                await self._dead(row, f"gave up after {attempts} tries: {error}")
            else:
                self.metrics.deliveries.labels(outcome="retry").inc()
                delay = self.backoff.delay(attempts - 1)
                await self.outbox.retry_at(row.id, now + timedelta(seconds=delay), error)
        else:
            self.metrics.deliveries.labels(outcome="sent").inc()
            await self.outbox.sent(row.id, receipt.platform_message_id, receipt.delivered_at)

    async def _dead(self, row: OutboxRow, reason: str) -> None:
        self.metrics.deliveries.labels(outcome="dead").inc()
        logger.warning(
            "chunk %d to %s:%s is a dead letter: %s",
            row.id,
            row.target.platform,
            row.target.chat_id,
            reason,
        )
        await self.outbox.dead(row.id, reason)
