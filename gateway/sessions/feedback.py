"""Live feedback while a turn runs: the typing indicator and the streamed preview.

Both are best effort: a failure stops them and changes nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from gateway.contracts.adapter import Adapter, MessageEditor, TypingIndicator, WorkingIndicator
from gateway.contracts.errors import RateLimited
from gateway.contracts.ids import Platform, PlatformMessageId, TurnId
from gateway.contracts.messages import OutboundMessage, TextFormat, utcnow
from gateway.sessions.context import SessionContext
from gateway.store.outbox import Target

logger = logging.getLogger(__name__)

TYPING_TIMEOUT = 15.0
"""The longest one typing request may take before it is given up (and the indicator with
it); it also bounds how long the indicator's task outlives its turn."""


class Feedback:
    """Typing indicators and previews for the turns of one manager."""

    def __init__(self, ctx: SessionContext) -> None:
        self.ctx = ctx
        self._held: dict[tuple[str, str, str], float] = {}
        """Chats a platform rate-limited during feedback: until when (monotonic)."""

    def hold(self, chat: tuple[str, str, str], retry_after: float) -> None:
        """A 429 from `chat`, whatever the request: its next reply waits `retry_after`."""
        now = time.monotonic()
        for stale in [c for c, until in self._held.items() if until <= now]:
            del self._held[stale]  # bounded by the chats rate-limited right now
        self._held[chat] = max(self._held.get(chat, now), now + retry_after)

    def held(self, chat: tuple[str, str, str]) -> bool:
        """Whether `chat` answered a 429 whose `retry_after` has not passed yet."""
        return self._held.get(chat, -math.inf) > time.monotonic()

    def not_before(self, chat: tuple[str, str, str], preview: Preview | None) -> datetime | None:
        """The earliest moment the chat's next reply may be sent: after its preview's edit
        interval and any 429 the chat answered a typing indicator or a preview with."""
        wait = self._held.get(chat, -math.inf) - time.monotonic()
        at = utcnow() + timedelta(seconds=wait) if wait > 0 else None
        edit = None if preview is None else preview.next_edit_at()
        if at is None or edit is None:
            return at or edit
        return max(at, edit)

    async def typing(
        self, target: Target, answering: PlatformMessageId | None, ended: asyncio.Event
    ) -> None:
        """Show that a turn is running until `ended` is set: "typing…" every few seconds, and
        a mark on the message being answered where the platform has one. Best effort.

        A request in flight when the turn ends is let finish rather than cancelled: httpx's
        pool can lose a connection to a request cancelled at the wrong moment (see
        `adapters/telegram/pools.py`), and this one is made for every turn."""
        adapter: object = self.ctx.channels.adapter(target.platform, target.account)
        marked = False
        if isinstance(adapter, WorkingIndicator) and answering is not None:
            try:
                async with asyncio.timeout(TYPING_TIMEOUT):
                    await adapter.working(target.chat_id, answering)
                marked = True
            except RateLimited as err:  # any 429 of the chat holds its replies
                self.hold(target.chat, err.retry_after)
                logger.debug("working indicator rate-limited: %s", err)
            except Exception as err:
                logger.debug("working indicator failed: %s", err)
        try:
            while isinstance(adapter, TypingIndicator) and not ended.is_set():
                try:
                    async with asyncio.timeout(TYPING_TIMEOUT):  # a platform that hangs
                        await adapter.typing(target.chat_id, target.thread_id)
                except RateLimited as err:  # the chat's limit holds its replies too
                    self.hold(target.chat, err.retry_after)
                    logger.debug("typing indicator rate-limited: %s", err)
                    break
                except Exception as err:  # a failed indicator changes nothing
                    logger.debug("typing indicator failed: %s", err)
                    break
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(4.0):
                        await ended.wait()
            await ended.wait()
        finally:
            if marked:
                assert isinstance(adapter, WorkingIndicator)
                assert answering is not None
                try:
                    async with asyncio.timeout(5.0):
                        await adapter.done(target.chat_id, answering)
                except RateLimited as err:
                    self.hold(target.chat, err.retry_after)
                    logger.debug("working indicator not removed, rate-limited: %s", err)
                except Exception as err:
                    logger.debug("working indicator not removed: %s", err)

    async def preview(self, target: Target, turn_id: TurnId) -> Preview | None:
        section = self.ctx.platforms.get((target.platform, target.account))
        live = self.ctx.channels.adapter(target.platform, target.account)
        editor: object = live
        if (
            live is None
            or not getattr(section, "stream_edits", False)
            or not isinstance(editor, MessageEditor)
        ):
            return None
        # A preview is sent directly; never let it overtake earlier chunks still queued.
        if await self.ctx.outbox.unsent(target.chat):
            return None
        assert self.ctx.tg is not None
        limits = self.ctx.channels.limits(target.platform, target.account)
        return Preview(
            live,
            editor,
            target,
            turn_id,
            max_chars=limits.max_chunk,
            interval=limits.min_edit_interval,
            tg=self.ctx.tg,
            on_rate_limited=lambda retry_after: self.hold(target.chat, retry_after),
            held=lambda: self.held(target.chat),
            redact=self.ctx.redact,
        )


class Preview:
    """Streams a turn's text into one message, edited at most every `interval` seconds.

    Best effort: any failure just stops the preview. The final text is never sent by the
    preview; the turn's first reply chunk replaces it (`edit_of`) through the outbox.
    """

    def __init__(
        self,
        sender: Adapter,
        editor: MessageEditor,
        target: Target,
        turn_id: TurnId,
        *,
        max_chars: int,
        interval: float,
        tg: asyncio.TaskGroup,
        on_rate_limited: Callable[[float], None] = lambda _: None,
        held: Callable[[], bool] = lambda: False,
        redact: Callable[[str], str] = lambda text: text,
    ) -> None:
        """`on_rate_limited(retry_after)`: the platform answered a send or edit with 429;
        the preview stops, and the chat's reply must wait that long. `held()`: the chat is
        waiting out a 429 (of any request): the preview stops instead of sending."""
        self.sender = sender
        self.on_rate_limited = on_rate_limited
        self.held = held
        self.redact = redact
        """Applied to the whole text before each send or edit."""
        self.editor = editor
        self.target = target
        self.turn_id = turn_id
        self.max_chars = max(16, max_chars)
        self.interval = interval
        self.message_id: PlatformMessageId | None = None
        self._last_edit = -math.inf
        self._parts: list[str] = []
        self._changed = asyncio.Event()
        self._closing = asyncio.Event()
        self._task = tg.create_task(self._run(), name=f"preview {turn_id}")

    async def token(self, text: str) -> None:
        """Add streamed text."""
        self._parts.append(text)
        self._changed.set()

    def next_edit_at(self) -> datetime:
        """The earliest moment the preview may be edited again (the platform's edit rate)."""
        wait = max(0.0, self._last_edit + self.interval - time.monotonic())
        return utcnow() + timedelta(seconds=wait)

    async def close(self) -> None:
        """Stop editing; an edit in flight completes first (so `message_id` is known)."""
        self._closing.set()
        self._changed.set()
        try:
            async with asyncio.timeout(10):
                await asyncio.shield(self._task)
        except TimeoutError:
            self._task.cancel()
        except Exception as err:
            logger.debug("preview ended with %s", err)

    async def _run(self) -> None:
        try:
            while True:
                await self._changed.wait()
                if self._closing.is_set():
                    return
                self._changed.clear()
                text = "".join(self._parts).strip()
                if not text:
                    continue
                if self.held():
                    return  # the chat is rate-limited: the reply alone goes, when it may
                text = self.redact(text)
                if len(text) > self.max_chars - 2:
                    text = text[: self.max_chars - 2]
                message = OutboundMessage(
                    platform=Platform(self.target.platform),
                    account=self.target.account,
                    chat_id=self.target.chat_id,
                    thread_id=self.target.thread_id,
                    text=text + " …",
                    idempotency_key=f"preview:{self.turn_id}",
                    format=TextFormat.PLAIN,
                )
                if self.message_id is None:
                    receipt = await self.sender.send(message)
                    self.message_id = receipt.platform_message_id
                    if self.message_id is None:
                        return
                else:
                    await self.editor.edit(self.message_id, message)
                self._last_edit = time.monotonic()
                try:
                    async with asyncio.timeout(self.interval):
                        await self._closing.wait()
                    return
                except TimeoutError:
                    pass
        except RateLimited as err:
            self.on_rate_limited(err.retry_after)
            logger.debug("preview stopped: %s", err)
        except Exception as err:  # best effort
            logger.debug("preview stopped: %s", err)
