"""The Telegram connection: a python-telegram-bot `Bot`, a receiver (polling or webhook), send."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from telegram import (
    Bot,
    BotCommand,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    Message,
    ReplyParameters,
    Update,
)
from telegram.constants import ChatAction
from telegram.constants import ParseMode as TelegramParseMode
from telegram.error import BadRequest, ChatMigrated, InvalidToken, TelegramError
from telegram.request import HTTPXRequest

from adapters.files import attachment_path, save_file, with_files
from adapters.inbound import Skipped, log_skipped, message_key
from adapters.inflight import InFlight, TrackedSends
from adapters.markdown import utf16_len
from adapters.telegram import PLATFORM
from adapters.telegram.config import ParseMode, TelegramConfig, TelegramMode
from adapters.telegram.convert import (
    NOT_ADDRESSED,
    NOT_MODIFIED,
    BotIdentity,
    FileRef,
    error_from,
    menu_entries,
    reaction_from,
    split_message_key,
    to_inbound,
)
from adapters.telegram.markup import to_html, to_markdown_v2
from adapters.telegram.polling import READ_GRACE, Poller
from adapters.telegram.pools import SplitPools
from adapters.telegram.webhook import WebhookReceiver
from gateway.chunking import markdown_to_plain
from gateway.contracts.adapter import AdapterState, InboundSink, ReactionSink, WebhookResponse
from gateway.contracts.errors import NotReady, PermanentSendError
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

CONNECT_TIMEOUT = 10.0
REQUEST_TIMEOUT = 20.0
SEND_POOL = 64
"""Connections for sends, edits, actions and downloads; the long poll has its own."""
PHOTO_MAX_BYTES = 10 * 1024 * 1024
"""Larger images go out as documents (Telegram's limit for photos)."""
CAPTION_MAX = 1024
"""The longest caption of a photo or document, in UTF-16 code units."""
SEND_FILE_MAX_BYTES = 50 * 1024 * 1024
"""The largest file the Bot API takes in an upload."""
MAX_MIGRATIONS = 1_000
"""Chat migrations remembered (group → supergroup ids) before the oldest are forgotten."""


@dataclass
class FirstStart:
    """Shared by the adapters of one daemon run: the backlog rule applies at the first start
    only, not at every reconnect."""

    done: bool = False


class TelegramAdapter(TrackedSends):
    """One bot: receives by polling or webhook, sends, edits, shows typing, downloads files.

    Entering checks the token with `getMe` (AuthError when refused, NotReady when Telegram is
    unreachable) and then removes the webhook (polling) or sets it (webhook mode).
    """

    platform: Platform = PLATFORM

    def __init__(
        self,
        config: TelegramConfig,
        files_dir: Path,
        first_start: FirstStart | None = None,
        *,
        menu: Callable[[], Sequence[tuple[str, str]]] | None = None,
    ) -> None:
        self.config = config
        self.menu = menu
        self._inflight = InFlight()
        self.first_start = FirstStart() if first_start is None else first_start
        self.files_dir = files_dir
        self.account = AccountId(config.account)
        self.limits = SendLimits(
            max_chunk=4096,
            count_utf16=True,
            min_edit_interval=config.min_edit_interval,
            min_send_interval=config.min_send_interval,
            max_file_bytes=SEND_FILE_MAX_BYTES,
            voice=True,
            voice_caption=CAPTION_MAX,
        )
        self._bot: Bot | None = None
        self._identity: BotIdentity | None = None
        self._receiver: Poller | WebhookReceiver | None = None
        self._migrated: dict[str, str] = {}
        self._entered = False

    def _new_bot(self) -> Bot:
        cfg = self.config

        def calls() -> HTTPXRequest:
            return HTTPXRequest(
                connection_pool_size=SEND_POOL,
                connect_timeout=CONNECT_TIMEOUT,
                read_timeout=REQUEST_TIMEOUT,
                write_timeout=REQUEST_TIMEOUT,
                pool_timeout=REQUEST_TIMEOUT,
            )

        poll = HTTPXRequest(
            connection_pool_size=1,
            connect_timeout=CONNECT_TIMEOUT,
            read_timeout=READ_GRACE,
            pool_timeout=CONNECT_TIMEOUT,
        )
        return Bot(
            cfg.token.get_secret_value(),
            base_url=cfg.base_url,
            base_file_url=cfg.base_file_url,
            request=SplitPools(calls, poll),
            get_updates_request=poll,
        )

    async def __aenter__(self) -> Self:
        """Check the token, then take over receiving. Raises AuthError or NotReady."""
        bot = self._new_bot()
        try:
            await bot.initialize()
            me = bot.bot
            identity = BotIdentity(me.id, me.username or "")
            receiver: Poller | WebhookReceiver
            if self.config.mode is TelegramMode.WEBHOOK:
                receiver = WebhookReceiver(bot, self.config, self._receive)
            else:
                receiver = Poller(bot, self.config, self._receive)
            drop = not self.config.process_backlog_on_start and not self.first_start.done
            await receiver.start(drop_pending=drop)
            self.first_start.done = True
            await self._set_menu(bot)
        except TelegramError as err:
            await bot.shutdown()
            raise error_from(err, "connecting") from err
        except BaseException:
            await bot.shutdown()
            raise
        self._bot, self._identity, self._receiver = bot, identity, receiver
        self._entered = True
        logger.info("telegram: connected as @%s (%s mode)", identity.username, self.config.mode)
        return self

    async def _set_menu(self, bot: Bot) -> None:
        """Show the chat commands (and shared skills) in Telegram's command menu. A failure
        only leaves the old menu: it is logged, never fatal."""
        if self.menu is None:
            return
        commands = [
            BotCommand(name, description) for name, description in menu_entries(self.menu())
        ]
        try:
            await bot.set_my_commands(commands)
        except TelegramError as err:
            logger.warning("telegram: could not set the command menu: %s", err)

    async def __aexit__(self, *exc: object) -> None:
        bot, self._bot, self._receiver = self._bot, None, None
        try:
            # New sends now fail with NotReady (nothing sent); those under way may finish.
            await self._drain_sends()
        finally:
            if bot is not None:
                await bot.shutdown()

    async def check(self) -> str:
        """Check the token with `getMe` without taking over receiving (for `herald doctor`).

        Raises AuthError or NotReady.
        """
        try:
            return await self._check()
        except TelegramError as err:
            raise error_from(err, "getMe") from err

    async def _check(self) -> str:
        async with self._new_bot() as bot:
            me = bot.bot
            detail = f"@{me.username} (id {me.id}), {self.config.mode} mode"
            if self.config.mode is TelegramMode.WEBHOOK:
                info = await bot.get_webhook_info()
                if info.url != self.config.webhook_url:
                    detail += f"; the webhook is {info.url or 'not set'} until Herald starts"
                if info.last_error_message:
                    detail += f"; Telegram reports: {info.last_error_message}"
            return detail

    def liveness(self) -> AdapterState:
        """The receiver's liveness: polls completing in time, or the webhook set."""
        if self._receiver is None:
            return AdapterState.STOPPED if self._entered else AdapterState.STARTING
        return self._receiver.liveness()

    async def run(self, sink: InboundSink) -> None:
        """Receive until cancelled. Raises NotReady, AuthError, or what `sink.accept` raised."""
        await self._connected_receiver().run(sink)

    async def handle_webhook(
        self, path: str, headers: Mapping[str, str], body: bytes, sink: InboundSink
    ) -> WebhookResponse:
        """Verify and store one posted update (webhook mode); 404 in polling mode."""
        receiver = self._connected_receiver()
        if not isinstance(receiver, WebhookReceiver):
            return WebhookResponse(404, b"this bot receives by polling")
        return await receiver.handle(path, headers, body, sink)

    def _connected_receiver(self) -> Poller | WebhookReceiver:
        if self._receiver is None:
            raise NotReady("telegram: the adapter is not connected")
        return self._receiver

    def _connected(self) -> Bot:
        if self._bot is None:
            raise NotReady("telegram: the adapter is not connected")
        return self._bot

    # -- receiving --------------------------------------------------------------------------

    async def _receive(self, update: Update, sink: InboundSink) -> None:
        """Normalize one update, download its files, store it. Raises NotReady on download
        failures that may pass (the update is then delivered again)."""
        assert self._identity is not None
        if update.message_reaction is not None:
            await self._reacted(update, sink)
            return
        incoming = to_inbound(
            update,
            bot=self._identity,
            account=self.account,
            config=self.config,
            now=utcnow(),
        )
        if isinstance(incoming, Skipped):
            # Group chatter not addressed to the bot is routine; everything else is worth a line.
            what = f"{PLATFORM}: update {update.update_id}"
            log_skipped(logger, what, incoming, quiet=(NOT_ADDRESSED,))
            return
        if update.callback_query is not None:
            await self._answer_press(update.callback_query.id)
        key = incoming.message.platform_message_id
        message = await with_files(
            incoming.message,
            incoming.files,
            lambda i, ref: self._download(key, i, ref),
            sink=sink,
        )
        await sink.accept(message)

    async def _reacted(self, update: Update, sink: InboundSink) -> None:
        """A reaction, to the sink that takes them (it decides whether it means anything)."""
        assert self._identity is not None
        reaction = reaction_from(update, bot=self._identity, account=self.account)
        if isinstance(reaction, Skipped):
            log_skipped(logger, f"{PLATFORM}: update {update.update_id}", reaction)
        elif isinstance(sink, ReactionSink):
            await sink.react(reaction)

    async def working(self, chat_id: ChatId, message: PlatformMessageId) -> None:
        """Put the working reaction on the message being answered."""
        await self._react(chat_id, message, self.config.working_reaction)

    async def done(self, chat_id: ChatId, message: PlatformMessageId) -> None:
        """Take the working reaction off again."""
        await self._react(chat_id, message, None)

    async def _react(self, chat_id: ChatId, message: PlatformMessageId, emoji: str | None) -> None:
        parsed = split_message_key(message)
        if not self.config.working_reaction or parsed is None:
            return
        try:
            await self._connected().set_message_reaction(
                chat_id=chat_id, message_id=parsed[1], reaction=emoji
            )
        except TelegramError as err:
            raise error_from(err, "setMessageReaction") from err

    async def _answer_press(self, query_id: str) -> None:
        """Stop the pressed button's spinner (best effort: the press is handled anyway)."""
        try:
            await self._connected().answer_callback_query(query_id)
        except TelegramError as err:
            logger.debug("%s: answering a button press failed: %s", PLATFORM, err)

    async def _download(self, key: PlatformMessageId, index: int, ref: FileRef) -> Attachment:
        """Fetch one file into `files_dir/<chat>/`. Raises NotReady, RateLimited or
        PermanentSendError (never AuthError: a refused token shows in the poll, not here)."""
        bot = self._connected()
        limit = self.config.attachment_max_bytes
        try:
            remote = await bot.get_file(ref.file_id)
            if remote.file_size is not None and remote.file_size > limit:
                raise PermanentSendError(f"larger than {limit} bytes")
            data = await remote.download_as_bytearray()
        except InvalidToken as err:
            # python-telegram-bot reports a file's 404 (gone, expired) as a refused token.
            raise PermanentSendError("Telegram did not serve the file (HTTP 401/404)") from err
        except TelegramError as err:
            raise error_from(err, "downloading a file") from err
        if len(data) > limit:
            raise PermanentSendError(f"larger than {limit} bytes")
        path = attachment_path(self.files_dir, key, index, ref.filename)
        await asyncio.to_thread(save_file, path, bytes(data))
        return Attachment(path, ref.mime_type, len(data), ref.filename)

    # -- sending ----------------------------------------------------------------------------

    async def _send(self, message: OutboundMessage) -> DeliveryReceipt:
        """Deliver one chunk (text, then its files). Follows a group's move to a supergroup.

        Raises RateLimited, MarkupRejected, PermanentSendError or NotReady.
        """
        chat = self._chat(message.chat_id)
        try:
            sent = await self._send_to(chat, message)
        except ChatMigrated as err:
            new_chat = str(err.new_chat_id)
            self._remember_migration(chat, new_chat)
            try:
                sent = await self._send_to(new_chat, message)
            except TelegramError as again:
                raise error_from(again, "sendMessage") from again
        except TelegramError as err:
            raise error_from(err, "sendMessage") from err
        return DeliveryReceipt(message_key(sent.chat.id, sent.message_id))

    async def _send_to(self, chat: str, message: OutboundMessage) -> Message:
        bot = self._connected()
        thread = int(message.thread_id) if message.thread_id else None
        reply = _reply_parameters(message.reply_to)
        text, mode = self._render(message)
        if len(message.attachments) == 1 and message.attachments[0].voice:
            # A spoken reply is always one request: text sent ahead of a voice note whose
            # upload then failed would be sent again by the retry.
            return await self._send_file(
                bot,
                chat,
                message.attachments[0],
                thread,
                reply,
                caption=_voice_caption(text, mode, message),
            )
        if len(message.attachments) == 1 and 0 < utf16_len(text) <= CAPTION_MAX and text.strip():
            # One request for the file and its caption: a failed upload sent nothing, so a
            # retry cannot repeat the text.
            return await self._send_file(
                bot, chat, message.attachments[0], thread, reply, caption=(text, mode)
            )
        first: Message | None = None
        if text.strip():
            first = await bot.send_message(
                chat,
                text,
                parse_mode=mode,
                message_thread_id=thread,
                reply_parameters=reply,
                reply_markup=_keyboard(message.buttons),
            )
            reply = None
        for attachment in message.attachments:
            sent = await self._send_file(bot, chat, attachment, thread, reply)
            first = first or sent
            reply = None
        if first is None:
            raise PermanentSendError("telegram: nothing to send (no text and no files)")
        return first

    async def _send_file(
        self,
        bot: Bot,
        chat: str,
        attachment: Attachment,
        thread: int | None,
        reply: ReplyParameters | None,
        *,
        caption: tuple[str, str | None] | None = None,
    ) -> Message:
        data = await asyncio.to_thread(attachment.path.read_bytes)
        name = attachment.filename or attachment.path.name
        text, mode = caption or (None, None)
        if attachment.voice:  # a spoken reply: Ogg/Opus, played as a voice note
            return await bot.send_voice(
                chat,
                data,
                filename=name,
                caption=text,
                parse_mode=mode,
                message_thread_id=thread,
                reply_parameters=reply,
            )
        photo = attachment.mime_type.startswith("image/") and len(data) <= PHOTO_MAX_BYTES
        send = bot.send_photo if photo else bot.send_document
        return await send(
            chat,
            data,
            filename=name,
            caption=text,
            parse_mode=mode,
            message_thread_id=thread,
            reply_parameters=reply,
        )

    async def edit(self, target: PlatformMessageId, message: OutboundMessage) -> DeliveryReceipt:
        """Replace the text of `target`; editing to the same text succeeds. Raises like `send`."""
        parsed = split_message_key(target)
        if parsed is None:
            raise PermanentSendError(f"telegram: {target!r} is not a Telegram message id")
        chat, message_id = parsed
        chat = self._chat(ChatId(chat or message.chat_id))
        text, mode = self._render(message)
        try:
            await self._connected().edit_message_text(
                text, chat_id=chat, message_id=message_id, parse_mode=mode
            )
        except BadRequest as err:
            if NOT_MODIFIED not in err.message.lower():
                raise error_from(err, "editMessageText") from err
        except TelegramError as err:
            raise error_from(err, "editMessageText") from err
        return DeliveryReceipt(message_key(chat, message_id))

    async def typing(self, chat_id: ChatId, thread_id: ThreadId | None) -> None:
        """Show "typing…" for about five seconds. Raises like `send`."""
        try:
            await self._connected().send_chat_action(
                self._chat(chat_id),
                ChatAction.TYPING,
                message_thread_id=int(thread_id) if thread_id else None,
            )
        except TelegramError as err:
            raise error_from(err, "sendChatAction") from err

    def _render(self, message: OutboundMessage) -> tuple[str, str | None]:
        if message.format is TextFormat.PLAIN:
            return message.text, None
        if self.config.parse_mode is ParseMode.MARKDOWN_V2:
            return to_markdown_v2(message.text), TelegramParseMode.MARKDOWN_V2
        return to_html(message.text), TelegramParseMode.HTML

    def _chat(self, chat_id: ChatId | str) -> str:
        return self._migrated.get(str(chat_id), str(chat_id))

    def _remember_migration(self, old: str, new: str) -> None:
        logger.info("telegram: chat %s moved to %s; sending there from now on", old, new)
        if len(self._migrated) >= MAX_MIGRATIONS:
            self._migrated.pop(next(iter(self._migrated)))
        self._migrated[old] = new


def _voice_caption(
    text: str, mode: str | None, message: OutboundMessage
) -> tuple[str, str | None] | None:
    """A voice note's caption: the rendered text when it fits Telegram's 1,024, else the same
    words as plain text (markup and escapes take room; the gateway cut the Markdown to
    1,024), shortened with "…" only when even that does not fit."""
    if not text.strip():
        return None
    if utf16_len(text) <= CAPTION_MAX:
        return text, mode
    plain = markdown_to_plain(message.text) if message.format is TextFormat.MARKDOWN else text
    if utf16_len(plain) > CAPTION_MAX:
        logger.warning("%s: a voice note's caption was shortened to 1,024 characters", PLATFORM)
        plain = plain[: CAPTION_MAX - 1]
        while utf16_len(plain) > CAPTION_MAX - 1:  # astral characters count twice
            plain = plain[:-1]
        plain = plain.rstrip() + "…"
    return plain, None


def _reply_parameters(reply_to: PlatformMessageId | None) -> ReplyParameters | None:
    parsed = split_message_key(reply_to) if reply_to else None
    if parsed is None:
        return None
    return ReplyParameters(parsed[1], allow_sending_without_reply=True)


def _keyboard(buttons: tuple[Button, ...]) -> InlineKeyboardMarkup | None:
    """One row of inline buttons whose callback data is the command they send."""
    if not buttons:
        return None
    return InlineKeyboardMarkup(
        [[InlineKeyboardButton(b.label, callback_data=b.command[:64]) for b in buttons]]
    )
