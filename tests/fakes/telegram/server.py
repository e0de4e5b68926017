"""`FakeTelegramServer`: the fake Bot API itself (see the package's docstring)."""

from __future__ import annotations

import asyncio
import copy
import functools
import itertools
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from http import HTTPStatus
from typing import Any, Literal

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.fakes.control import control_mounts
from tests.fakes.params import EscapedJSONResponse, hang_up, jsonable
from tests.fakes.serving import LocalServer, Served
from tests.fakes.telegram import control_routes, methods
from tests.fakes.telegram.entities import (
    PARSERS,
    EntityParseError,
    FormattedText,
    auto_entities,
    utf16_len,
)
from tests.fakes.telegram.records import (
    BLOCKED_BY_USER,
    CANT_PARSE,
    CAPTION_TOO_LONG,
    CHAT_MIGRATED,
    DEFAULT_UPDATE_KINDS,
    JSON,
    MAX_CAPTION_LENGTH,
    MAX_TEXT_LENGTH,
    REJECTED_MARKUP,
    REPLY_NOT_FOUND,
    TEXT_EMPTY,
    TEXT_TOO_LONG,
    THREAD_NOT_FOUND,
    WEBHOOK_TIMEOUT,
    Action,
    Call,
    Edit,
    Injected,
    ReactionSet,
    Rejected,
    Sent,
    StoredFile,
    Update,
    Upload,
    Webhook,
    WebhookDelivery,
    _api_error,
    _ApiError,
    _Chat,
    _document_json,
    _Faults,
    _Handler,
    _number,
    _Params,
    _Queued,
    _read_params,
)
from tests.fakes.waiting import Changes, Waitable

# -- the server -----------------------------------------------------------------------------------


class FakeTelegramServer(Served, Waitable):
    """A fake Bot API for one test (or one standalone process).

    Single event loop only: the server runs as tasks of the loop that enters it, and the
    Python API (injection, faults, waits) must be called from that loop.
    """

    def __init__(
        self,
        token: str = "123:abc",
        *,
        bot_username: str = "herald_bot",
        bot_name: str = "Herald",
        port: int = 0,
        webhook_retry_delay: float = 0.2,
        first_update_id: int = 1,
        log_level: str | None = None,
    ) -> None:
        self.token = token
        prefix = token.split(":", 1)[0]
        self.bot_user: JSON = {
            "id": int(prefix) if prefix.isdigit() else 1,
            "is_bot": True,
            "first_name": bot_name,
            "username": bot_username,
        }
        """The bot as `from` of its messages (getMe adds its capabilities)."""
        self.sent: list[Sent] = []
        """Every message the bot sent, in arrival order."""
        self.edits: list[Edit] = []
        """Every accepted editMessageText, in arrival order."""
        self.actions: list[Action] = []
        """Every accepted sendChatAction, in arrival order."""
        self.reactions: list[ReactionSet] = []
        """Every accepted setMessageReaction, in arrival order."""
        self.answered_queries: list[str] = []
        """The callback query ids the bot answered (answerCallbackQuery)."""
        self.deleted: list[tuple[int, int]] = []
        """(chat_id, message_id) of every accepted deleteMessage."""
        self.calls: list[Call] = []
        """Every Bot API request with the right token (faulted ones included), in order."""
        self.downloads: list[str] = []
        """The `file_path` of every file download (`GET /file/bot<token>/...`), in order."""
        self.rejected: list[Rejected] = []
        """Every Bot API request answered with an error, in order."""
        self.confirmed: list[int] = []
        """Update ids confirmed (by a later offset or a webhook's 2xx), in confirmation order."""
        self.discarded: list[int] = []
        """Update ids dropped unconfirmed (allowed_updates, negative offset, drop_pending)."""
        self.webhook_deliveries: list[WebhookDelivery] = []
        """Every attempt to push an update to a webhook, in order."""
        self.commands: list[JSON] = []
        """The commands of the last setMyCommands."""
        self.polls = 0
        """How many getUpdates requests arrived (faulted ones included)."""
        self.polls_waiting = 0
        """How many getUpdates requests are being held (long polls and stalled polls)."""
        self.calls_held = 0
        """How many calls are waiting unanswered because of `hold`."""
        self.calls_rate_limited = 0
        """Calls answered 429 by `rate_limit`."""
        self.calls_abandoned: list[str] = []
        """Methods of held calls whose client gave up (closed the connection) while held."""
        self._port = port
        self._log_level = log_level
        self._retry_delay = webhook_retry_delay
        self._queue: list[_Queued] = []
        self._updates: dict[int, Update] = {}
        self._update_ids = itertools.count(first_update_id)
        self._chats: dict[int, _Chat] = {}
        self._files: dict[str, StoredFile] = {}
        self._file_numbers = itertools.count(1)
        self._channel_ids = itertools.count(1)
        self._allowed: frozenset[str] = DEFAULT_UPDATE_KINDS
        self._webhook: Webhook | None = None
        self._poll_generation = 0
        self._faults = _Faults()
        self._methods: dict[str, tuple[str, _Handler]] = {
            name.lower(): (name, handler)
            for name, handler in [
                ("getMe", functools.partial(methods.get_me, self)),
                ("getUpdates", functools.partial(methods.get_updates, self)),
                ("sendMessage", functools.partial(methods.send_message, self)),
                ("editMessageText", functools.partial(methods.edit_message_text, self)),
                ("deleteMessage", functools.partial(methods.delete_message, self)),
                ("sendChatAction", functools.partial(methods.send_chat_action, self)),
                ("answerCallbackQuery", functools.partial(methods.answer_callback_query, self)),
                ("setMessageReaction", functools.partial(methods.set_message_reaction, self)),
                ("sendPhoto", functools.partial(methods.send_photo, self)),
                ("sendDocument", functools.partial(methods.send_document, self)),
                ("sendVoice", functools.partial(methods.send_voice, self)),
                ("getFile", functools.partial(methods.get_file, self)),
                ("setWebhook", functools.partial(methods.set_webhook, self)),
                ("deleteWebhook", functools.partial(methods.delete_webhook, self)),
                ("getWebhookInfo", functools.partial(methods.get_webhook_info, self)),
                ("setMyCommands", functools.partial(methods.set_my_commands, self)),
                ("getMyCommands", functools.partial(methods.get_my_commands, self)),
                ("deleteMyCommands", functools.partial(methods.delete_my_commands, self)),
            ]
        }
        self._changes = Changes()
        self._local: LocalServer | None = None
        self._pusher: asyncio.Task[None] | None = None
        self._http: httpx.AsyncClient | None = None

    # -- where it listens -------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """`Bot(base_url=...)`: python-telegram-bot appends the token."""
        return f"{self.url}/bot"

    @property
    def base_file_url(self) -> str:
        """`Bot(base_file_url=...)`: python-telegram-bot appends the token."""
        return f"{self.url}/file/bot"

    # -- inbound ----------------------------------------------------------------------------------

    @property
    def pending(self) -> list[Update]:
        """The updates the server still holds, in delivery order."""
        return [queued.update for queued in self._queue]

    @property
    def webhook(self) -> Webhook | None:
        """The webhook set, None while polling."""
        return self._webhook

    def inject_message(
        self,
        chat_id: int,
        text: str = "",
        *,
        sender_id: int,
        sender_name: str = "",
        sender_username: str | None = None,
        sender_is_bot: bool = False,
        chat_type: Literal["private", "group", "supergroup", "channel"] = "private",
        chat_title: str | None = None,
        is_forum: bool = False,
        thread_id: int | None = None,
        reply_to: int | None = None,
        entities: Sequence[Mapping[str, Any]] | None = None,
        photo: str | None = None,
        document: str | None = None,
        date: float | None = None,
        message_id: int | None = None,
        edit_of: int | None = None,
        voice: str | None = None,
    ) -> Injected:
        """Queue a user's message as a new update; return its update, chat and message ids.

        `entities` default to Telegram's automatic ones (mentions, a leading bot command).
        `photo` / `document`: the file id of an `add_file()`; `text` becomes the caption.
        `voice`: the file id of an `add_file()` sent as a voice note (no text).
        `thread_id` in a forum makes a topic message. `reply_to`: a message id in this chat
        (the bot's included), embedded as `reply_to_message`. `edit_of`: make an
        `edited_message` update of that earlier message instead (new text, `edit_date`).
        Raises KeyError for an unknown `reply_to`, `edit_of` or file id.
        """
        known = self._chats[chat_id].messages if chat_id in self._chats else {}
        for name, value, where in (
            ("reply_to", reply_to, known),
            ("edit_of", edit_of, known),
            ("photo", photo, self._files),
            ("document", document, self._files),
            ("voice", voice, self._files),
        ):
            if value is not None and value not in where:
                raise KeyError(f"unknown {name}: {value!r}")
        now = int(time.time() if date is None else date)
        chat = self._chat(chat_id, chat_type)
        chat.type = chat_type
        chat.is_forum = is_forum
        if chat_title is not None:
            chat.title = chat_title
        if chat_type == "private":
            chat.first_name = sender_name or chat.first_name
            chat.username = sender_username or chat.username
        entity_list = None if entities is None else [dict(e) for e in entities]
        if edit_of is not None:
            message = copy.deepcopy(chat.messages[edit_of])
            self._set_content(message, text, entity_list, photo, document)
            message["edit_date"] = now
            chat.messages[edit_of] = message
            kind = "edited_channel_post" if chat.type == "channel" else "edited_message"
            update_id = self._enqueue({kind: copy.deepcopy(message)})
            return Injected(update_id, chat.id, edit_of)
        if thread_id is not None:
            chat.topics.add(thread_id)
            chat.last_message_id = max(chat.last_message_id, thread_id)
        if message_id is None:
            message_id = chat.next_message_id()
        elif message_id in chat.messages:
            raise ValueError(f"message {message_id} already exists in chat {chat.id}")
        chat.last_message_id = max(chat.last_message_id, message_id)
        sender: JSON = {
            "id": sender_id,
            "is_bot": sender_is_bot,
            "first_name": sender_name or f"User {sender_id}",
        }
        if sender_username:
            sender["username"] = sender_username
        message = {"message_id": message_id, "date": now, "chat": chat.to_json()}
        if chat.type != "channel":
            message["from"] = sender
        self._set_content(message, text, entity_list, photo, document)
        if voice is not None:
            stored = self._files[voice]
            for key in ("text", "entities"):
                message.pop(key, None)
            message["voice"] = {
                "file_id": stored.file_id,
                "file_unique_id": stored.file_unique_id,
                "duration": 1,
                "mime_type": stored.mime_type or "audio/ogg",
                "file_size": len(stored.content),
            }
        if thread_id is not None:
            message["message_thread_id"] = thread_id
            if chat.is_forum:
                message["is_topic_message"] = True
        if reply_to is not None:
            message["reply_to_message"] = _without_reply(chat.messages[reply_to])
        elif thread_id is not None and chat.is_forum:
            message["reply_to_message"] = self._topic_creation(chat, thread_id, now, sender)
        chat.messages[message_id] = message
        kind = "channel_post" if chat.type == "channel" else "message"
        update_id = self._enqueue({kind: copy.deepcopy(message)})
        return Injected(update_id, chat.id, message_id)

    def inject_reaction(
        self,
        chat_id: int,
        message_id: int,
        emoji: str,
        *,
        sender_id: int,
        sender_name: str = "",
        old: Sequence[str] = (),
    ) -> int:
        """Queue a `message_reaction` update: the user's reactions on a message (the bot's
        included) go from `old` to `old` + `emoji`; return its update id. Discarded unless
        the bot asked for `message_reaction` in `allowed_updates`, as on Telegram. Raises
        KeyError for an unknown message."""
        chat = self._chats[chat_id]
        if message_id not in chat.messages:
            raise KeyError(f"unknown message: {message_id!r}")
        emoji_of = [{"type": "emoji", "emoji": e} for e in old]
        return self._enqueue(
            {
                "message_reaction": {
                    "chat": chat.to_json(),
                    "message_id": message_id,
                    "user": {
                        "id": sender_id,
                        "is_bot": False,
                        "first_name": sender_name or f"User {sender_id}",
                    },
                    "date": int(time.time()),
                    "old_reaction": emoji_of,
                    "new_reaction": [*emoji_of, {"type": "emoji", "emoji": emoji}],
                }
            }
        )

    def inject_update(self, raw: Mapping[str, Any]) -> int:
        """Queue `raw` as an update, as is; its `update_id` is kept when given, else assigned.

        Kinds outside `allowed_updates` (by default: chat_member, message_reaction,
        message_reaction_count) are discarded, as Telegram never creates them.
        """
        payload = copy.deepcopy(dict(raw))
        given = payload.get("update_id")
        if isinstance(given, int) and not isinstance(given, bool):
            self._update_ids = itertools.count(max(given + 1, next(self._update_ids)))
            return self._enqueue(payload, update_id=given)
        return self._enqueue(payload)

    def duplicate(self, update_id: int) -> None:
        """Deliver an update again, same id and content, even if already confirmed.

        The copy is delivered once even below the current offset, then confirmed like any
        update. KeyError for an update never created.
        """
        self._queue.append(_Queued(self._updates[update_id], redelivery=True))
        self._changes.notify()

    def add_file(
        self,
        content: bytes,
        *,
        file_path: str | None = None,
        file_name: str | None = None,
        mime_type: str | None = None,
    ) -> str:
        """Register a file getFile serves; return its file id (for `inject_message(photo=...)`)."""
        number = next(self._file_numbers)
        stored = StoredFile(
            file_id=f"BQACAgIAAxkBAAI{number:04d}{secrets.token_urlsafe(12)}",
            file_unique_id=f"AgAD{number:04d}{secrets.token_hex(4)}",
            file_path=file_path or f"files/file_{number}",
            content=content,
            file_name=file_name,
            mime_type=mime_type,
        )
        self._files[stored.file_id] = stored
        return stored.file_id

    def file(self, file_id: str) -> StoredFile:
        """A registered or uploaded file; KeyError if unknown."""
        return self._files[file_id]

    async def wait_until_confirmed(self, *update_ids: int, timeout: float = 10.0) -> None:
        """Wait until these updates (default: every pending one) are confirmed.

        Raises TimeoutError after `timeout` seconds.
        """

        def done() -> bool:
            if not update_ids:
                return not self._queue
            pending = {queued.update.update_id for queued in self._queue}
            return all(u in self.confirmed and u not in pending for u in update_ids)

        await self.wait_for(done, timeout)

    # -- outbound ---------------------------------------------------------------------------------

    def message(self, chat_id: int, message_id: int) -> JSON:
        """The current state of a message (a copy); KeyError if unknown."""
        return copy.deepcopy(self._chats[chat_id].messages[message_id])

    def texts_in(self, chat_id: int) -> list[str]:
        """What the user sees of the bot's messages in `chat_id` (after edits), in send order."""
        chat = self._chats.get(chat_id)
        if chat is None:
            return []
        texts = []
        for sent in self.sent:
            message = chat.messages.get(sent.message_id) if sent.chat_id == chat_id else None
            if message is not None:
                texts.append(str(message.get("text", message.get("caption", ""))))
        return texts

    async def wait_for_sent(
        self,
        expected: int | Callable[[Sent], bool],
        timeout: float = 10.0,
    ) -> list[Sent]:
        """Wait for sends: a count (return all sends) or a predicate (return the matches).

        Raises TimeoutError after `timeout` seconds.
        """
        return await self._changes.wait_for_items(self.sent, expected, timeout)

    # -- faults -----------------------------------------------------------------------------------

    def rate_limit(self, chat_id: int, count: int = 1, retry_after: float = 1) -> None:
        """The next `count` sends, edits and actions in `chat_id` answer 429 `retry_after`.

        `retry_after` must be > 0 (python-telegram-bot ignores a zero).
        """
        if not retry_after > 0:
            raise ValueError("retry_after must be > 0")
        self._faults.rate_limits[chat_id] = (count, retry_after)

    def fail(self, method: str, count: int = 1, status: int = 500) -> None:
        """The next `count` calls of `method` ("*": any) answer `status` (a 5xx) unprocessed."""
        self._faults.failures[method.lower()] = (count, status)

    def fail_downloads(self, count: int = 1, status: int = 404) -> None:
        """The next `count` file downloads (`GET /file/bot<token>/...`, after getFile
        succeeded) answer `status`: 404 is a file Telegram no longer serves."""
        self._faults.failed_downloads = (count, status)

    def _download_failure(self) -> int | None:
        count, status = self._faults.failed_downloads
        if count <= 0:
            return None
        self._faults.failed_downloads = (count - 1, status)
        return status

    def drop(self, method: str, count: int = 1) -> None:
        """The next `count` calls of `method` ("*": any) get their connection closed unanswered.

        Nothing is processed (a dropped getUpdates confirms nothing).
        """
        self._faults.drops[method.lower()] = count

    def reject_markup(self, count: int = 1) -> None:
        """The next `count` sends / edits with a parse_mode answer "can't parse entities"."""
        self._faults.reject_markup = count

    def migrate_chat(self, old_chat_id: int, new_chat_id: int) -> None:
        """`old_chat_id` became supergroup `new_chat_id`: calls to the old id answer 400 with
        `migrate_to_chat_id` from now on."""
        old = self._chat(old_chat_id)
        new = self._chat(new_chat_id, "supergroup")
        new.type, new.title = "supergroup", new.title or old.title
        self._faults.migrations[old_chat_id] = new_chat_id

    def block_chat(self, chat_id: int, blocked: bool = True) -> None:
        """Calls in `chat_id` answer 403 (blocked by the user; kicked from a group)."""
        if blocked:
            self._faults.blocked.add(chat_id)
        else:
            self._faults.blocked.discard(chat_id)

    def delete_topic(self, chat_id: int, thread_id: int) -> None:
        """Sends to this forum topic answer "message thread not found"."""
        self._faults.deleted_topics.add((chat_id, thread_id))

    def stall_polls(self, count: int = 1) -> None:
        """The next `count` getUpdates never answer (held until the client leaves); they confirm
        nothing."""
        self._faults.stall_polls = count

    def hold(self, method: str, held: bool = True) -> None:
        """Calls of `method` wait unanswered, unprocessed, until `hold(method, False)` or the
        client leaves (as a slow Telegram under load keeps connections busy)."""
        if held:
            self._faults.held.add(method.lower())
        else:
            self._faults.held.discard(method.lower())
        self._changes.notify()

    def clear_faults(self) -> None:
        """Switch every fault off (migrations, blocks and deleted topics included)."""
        self._faults = _Faults()

    # -- state as JSON ----------------------------------------------------------------------------

    def webhook_info(self) -> JSON:
        """What getWebhookInfo answers."""
        info: JSON = {
            "url": "",
            "has_custom_certificate": False,
            "pending_update_count": len(self._queue),
        }
        webhook = self._webhook
        if webhook is not None:
            info.update(url=webhook.url, max_connections=webhook.max_connections)
            if webhook.allowed_updates is not None:
                info["allowed_updates"] = list(webhook.allowed_updates)
            if webhook.last_error_date is not None:
                info["last_error_date"] = webhook.last_error_date
                info["last_error_message"] = webhook.last_error_message
        return info

    def state(self) -> JSON:
        """Everything a test inspects, as JSON (what `GET /control/state` answers)."""
        texts = {str(chat_id): self.texts_in(chat_id) for chat_id in {s.chat_id for s in self.sent}}
        return {
            "ok": True,
            "sent": jsonable(self.sent),
            "edits": jsonable(self.edits),
            "actions": jsonable(self.actions),
            "deleted": jsonable(self.deleted),
            "rejected": jsonable(self.rejected),
            "texts": texts,
            "pending": [queued.update.update_id for queued in self._queue],
            "pending_updates": [queued.update.payload for queued in self._queue],
            "confirmed": list(self.confirmed),
            "discarded": list(self.discarded),
            "polls": self.polls,
            "polls_waiting": self.polls_waiting,
            "webhook": self.webhook_info(),
            "webhook_deliveries": jsonable(self.webhook_deliveries),
            "calls": [call.method for call in self.calls],
        }

    # -- lifecycle --------------------------------------------------------------------------------

    async def _start(self) -> None:
        self._local = LocalServer(self._app(), port=self._port, log_level=self._log_level)
        self._http = httpx.AsyncClient(timeout=WEBHOOK_TIMEOUT, trust_env=False)
        await self._local.start()
        self._pusher = asyncio.create_task(methods.push_to_webhook(self))

    async def _stop(self) -> None:
        self._changes.stop()  # ends long polls, stalled polls and control waits
        try:
            if self._pusher is not None:
                self._pusher.cancel()
                await asyncio.gather(self._pusher, return_exceptions=True)
            if self._local is not None:
                await self._local.stop()
        finally:
            if self._http is not None:
                await self._http.aclose()

    # -- internals --------------------------------------------------------------------------------

    def _enqueue(self, payload: JSON, *, update_id: int | None = None) -> int:
        if update_id is None:
            update_id = next(self._update_ids)
        payload = {"update_id": update_id, **{k: v for k, v in payload.items() if k != "update_id"}}
        update = Update(update_id, payload)
        self._updates[update_id] = update
        if update.kind in self._allowed:
            self._queue.append(_Queued(update))
        else:
            self.discarded.append(update_id)
        self._changes.notify()
        return update_id

    def _confirm(self, offset: int) -> None:
        """Forget what a getUpdates `offset` confirms."""
        if offset == 0:
            return
        if offset < 0:
            dropped, self._queue = self._queue[:offset], self._queue[offset:]
            self.discarded.extend(queued.update.update_id for queued in dropped)
        else:
            kept = []
            for queued in self._queue:
                done = queued.update.update_id < offset and (
                    not queued.redelivery or queued.delivered
                )
                if done:
                    self.confirmed.append(queued.update.update_id)
                else:
                    kept.append(queued)
            if len(kept) == len(self._queue):
                return
            self._queue = kept
        self._changes.notify()

    def _deliverable(self, limit: int) -> list[_Queued]:
        """The updates the next getUpdates answer carries: one per update id, in order."""
        batch: list[_Queued] = []
        seen: set[int] = set()
        for queued in self._queue:
            if queued.update.update_id in seen:
                continue
            seen.add(queued.update.update_id)
            batch.append(queued)
            if len(batch) >= limit:
                break
        return batch

    def _chat(self, chat_id: int, chat_type: str | None = None) -> _Chat:
        chat = self._chats.get(chat_id)
        if chat is None:
            if chat_type is None:
                if chat_id > 0:
                    chat_type = "private"
                else:
                    chat_type = "supergroup" if str(chat_id).startswith("-100") else "group"
            chat = self._chats[chat_id] = _Chat(chat_id, chat_type)
        return chat

    def _set_content(
        self,
        message: JSON,
        text: str,
        entities: list[JSON] | None,
        photo: str | None,
        document: str | None,
    ) -> None:
        """Give `message` a text, or a photo / document with `text` as its caption."""
        if entities is None:
            entities = auto_entities(text)
        for key in ("text", "entities", "caption", "caption_entities"):
            message.pop(key, None)
        if photo is not None or document is not None:
            if photo is not None:
                message["photo"] = self._photo_sizes(self._files[photo])
            if document is not None:
                message["document"] = _document_json(self._files[document])
            if text:
                message["caption"] = text
                if entities:
                    message["caption_entities"] = entities
            return
        message["text"] = text
        if entities:
            message["entities"] = entities

    def _photo_sizes(self, stored: StoredFile) -> list[JSON]:
        """PhotoSizes of `stored`: a thumbnail (its own file id, same bytes), then `stored`."""
        thumbnail_id = self.add_file(stored.content, file_path=f"{stored.file_path}.thumb.jpg")
        thumbnail = self._files[thumbnail_id]
        return [
            {
                "file_id": thumbnail.file_id,
                "file_unique_id": thumbnail.file_unique_id,
                "width": 90,
                "height": 90,
                "file_size": len(thumbnail.content),
            },
            {
                "file_id": stored.file_id,
                "file_unique_id": stored.file_unique_id,
                "width": 1280,
                "height": 960,
                "file_size": len(stored.content),
            },
        ]

    def _topic_creation(self, chat: _Chat, thread_id: int, date: int, sender: JSON) -> JSON:
        """The service message that created forum topic `thread_id` (made up when unknown)."""
        created = chat.messages.get(thread_id)
        if created is None:
            created = chat.messages[thread_id] = {
                "message_id": thread_id,
                "date": date,
                "chat": chat.to_json(),
                "from": sender,
                "message_thread_id": thread_id,
                "forum_topic_created": {"name": f"Topic {thread_id}", "icon_color": 7322096},
                "is_topic_message": True,
            }
        return _without_reply(created)

    def _authorized(self, request: Request) -> bool:
        given = str(request.path_params.get("token", ""))
        return secrets.compare_digest(given.encode(), self.token.encode())

    def _app(self) -> Starlette:
        routes = [
            Route("/bot{token}/{method}", self._bot_endpoint, methods=["GET", "POST"]),
            Route(
                "/file/bot{token}/{file_path:path}",
                functools.partial(methods.download, self),
                methods=["GET"],
            ),
        ]
        routes += control_mounts(self, control_routes.ROUTES)
        return Starlette(routes=routes, exception_handlers={HTTPException: self._http_error})

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        return _api_error(status, HTTPStatus(status).phrase)

    def _countdown(self, counters: dict[str, int], method: str) -> bool:
        for key in (method.lower(), "*"):
            if counters.get(key, 0) > 0:
                counters[key] -= 1
                return True
        return False

    def _failure(self, method: str) -> int | None:
        failures = self._faults.failures
        for key in (method.lower(), "*"):
            count, status = failures.get(key, (0, 500))
            if count > 0:
                failures[key] = (count - 1, status)
                return status
        return None

    async def _bot_endpoint(self, request: Request) -> Response:
        if not self._authorized(request):
            return _api_error(401, "Unauthorized")
        entry = self._methods.get(str(request.path_params["method"]).lower())
        method = entry[0] if entry is not None else str(request.path_params["method"])
        try:
            params = await _read_params(request)
        except _ApiError as err:
            params = _Params({}, {})
            return self._refuse(method, params, err)
        self.calls.append(Call(method, params.logged(), time.monotonic()))
        if method == "getUpdates":
            self.polls += 1
        self._changes.notify()
        if entry is None:
            return self._refuse(method, params, _ApiError(404, "Not Found"))
        if method.lower() in self._faults.held:
            self.calls_held += 1
            self._changes.notify()
            try:
                present = await self._changes.hold(
                    request, None, lambda: method.lower() not in self._faults.held
                )
            finally:
                self.calls_held -= 1
                self._changes.notify()
            if not present:
                self.calls_abandoned.append(method)
                return await hang_up(request)
        if self._countdown(self._faults.drops, method):
            return await hang_up(request)
        status = self._failure(method)
        if status is not None:
            return self._refuse(method, params, _ApiError(status, HTTPStatus(status).phrase))
        try:
            result = await entry[1](request, params)
        except _ApiError as err:
            return self._refuse(method, params, err)
        if isinstance(result, Response):
            return result
        return EscapedJSONResponse({"ok": True, "result": result})

    def _refuse(self, method: str, params: _Params, err: _ApiError) -> Response:
        self.rejected.append(
            Rejected(method, err.status, err.description, params.logged(), time.monotonic())
        )
        self._changes.notify()
        return _api_error(err.status, err.description, err.parameters)

    async def _hold(
        self, request: Request, seconds: float | None, done: Callable[[], bool]
    ) -> bool:
        """Wait until `done()`, `seconds` pass (None: no limit), the client leaves or the
        server stops; False when the client left."""
        if done() or (seconds is not None and seconds <= 0):
            return True

        self.polls_waiting += 1
        self._changes.notify()
        try:
            return await self._changes.hold(request, seconds, done)
        finally:
            self.polls_waiting -= 1
            self._changes.notify()

    # -- chat checks shared by sends, edits and actions ------------------------------------------

    def _target_chat(self, params: _Params) -> _Chat:
        """The chat of `chat_id`, after the chat's faults (migration, block, rate limit)."""
        raw = params.raw("chat_id")
        if raw is None or raw == "":
            raise _ApiError(400, "Bad Request: chat_id is empty")
        if isinstance(raw, str) and raw.startswith("@"):
            chat = next((c for c in self._chats.values() if c.username == raw[1:]), None)
            if chat is None:
                chat = self._chat(-1_000_000_000_000 - next(self._channel_ids), "channel")
                chat.username, chat.title = raw[1:], raw[1:]
        else:
            chat_id = params.integer("chat_id")
            if not chat_id:
                raise _ApiError(400, "Bad Request: chat not found")
            chat = self._chat(chat_id)
        faults = self._faults
        if chat.id in faults.migrations:
            raise _ApiError(400, CHAT_MIGRATED, migrate_to_chat_id=faults.migrations[chat.id])
        if chat.id in faults.blocked:
            raise _ApiError(403, _blocked_description(chat.type))
        left, retry_after = faults.rate_limits.get(chat.id, (0, 0.0))
        if left > 0:
            faults.rate_limits[chat.id] = (left - 1, retry_after)
            self.calls_rate_limited += 1
            self._changes.notify()
            raise _ApiError(
                429,
                f"Too Many Requests: retry after {_number(retry_after)}",
                retry_after=_number(retry_after),
            )
        return chat

    def _thread(self, chat: _Chat, params: _Params) -> int | None:
        thread_id = params.integer("message_thread_id")
        if thread_id is None:
            return None
        if (chat.id, thread_id) in self._faults.deleted_topics or (
            chat.is_forum and thread_id not in chat.topics
        ):
            raise _ApiError(400, THREAD_NOT_FOUND)
        return thread_id

    def _format(
        self, params: _Params, key: str, *, caption: bool = False
    ) -> tuple[str, str | None, FormattedText]:
        """The raw text of `key`, its parse_mode and what it parses to; 400 when refused."""
        text = params.string(key) or ""
        parse_mode = params.string("parse_mode") or None
        if parse_mode is not None:
            parser = PARSERS.get(parse_mode.lower())
            if parser is None:
                raise _ApiError(400, "Bad Request: unsupported parse_mode")
            if self._faults.reject_markup > 0:
                self._faults.reject_markup -= 1
                raise _ApiError(400, CANT_PARSE + REJECTED_MARKUP)
            try:
                formatted = parser(text)
            except EntityParseError as err:
                raise _ApiError(400, f"{CANT_PARSE}{err}") from err
        else:
            given = params.json("caption_entities" if caption else "entities", "JSON array")
            entities = tuple(e for e in given if isinstance(e, dict)) if given else ()
            formatted = FormattedText(text, entities)
        formatted = formatted.trimmed()
        if not caption and not formatted.text:
            raise _ApiError(400, TEXT_EMPTY)
        if utf16_len(formatted.text) > (MAX_CAPTION_LENGTH if caption else MAX_TEXT_LENGTH):
            raise _ApiError(400, CAPTION_TOO_LONG if caption else TEXT_TOO_LONG)
        return text, parse_mode, formatted

    def _reply_target(self, chat: _Chat, params: _Params) -> JSON | None:
        """The message a send replies to (None: no reply); 400 when it does not exist."""
        reply = params.json("reply_parameters")
        if reply is not None:
            if not isinstance(reply, dict):
                raise _ApiError(400, "Bad Request: can't parse reply parameters JSON object")
            reply_params = _Params(reply, {})
            message_id = reply_params.integer("message_id")
            allow = reply_params.boolean("allow_sending_without_reply")
            if "chat_id" in reply_params:  # a reply to a message in another chat
                other = self._chats.get(reply_params.integer("chat_id") or 0)
                target = other.messages.get(message_id or 0) if other is not None else None
                if target is None and not allow:
                    raise _ApiError(400, REPLY_NOT_FOUND)
                return None if target is None else _without_reply(target)
        elif "reply_to_message_id" in params:
            message_id = params.integer("reply_to_message_id")
            allow = params.boolean("allow_sending_without_reply")
        else:
            return None
        target = chat.messages.get(message_id) if isinstance(message_id, int) else None
        if target is None:
            if allow:
                return None
            raise _ApiError(400, REPLY_NOT_FOUND)
        return _without_reply(target)

    def _bot_message(self, chat: _Chat, thread_id: int | None, reply: JSON | None) -> JSON:
        message: JSON = {
            "message_id": chat.next_message_id(),
            "from": dict(self.bot_user),
            "chat": chat.to_json(),
            "date": int(time.time()),
        }
        if thread_id is not None:
            message["message_thread_id"] = thread_id
            if chat.is_forum:
                message["is_topic_message"] = True
        if reply is not None:
            message["reply_to_message"] = reply
        if chat.type == "channel":
            message.pop("from")
        return message

    def _record_sent(
        self,
        method: str,
        chat: _Chat,
        message: JSON,
        params: _Params,
        *,
        text: str,
        parse_mode: str | None,
        formatted: FormattedText,
        upload: Upload | None = None,
    ) -> JSON:
        chat.messages[message["message_id"]] = message
        reply = message.get("reply_to_message")
        self.sent.append(
            Sent(
                method=method,
                chat_id=chat.id,
                message_id=message["message_id"],
                text=text,
                parse_mode=parse_mode,
                plain_text=formatted.text,
                entities=formatted.entities,
                message_thread_id=message.get("message_thread_id"),
                reply_to_message_id=reply["message_id"] if reply is not None else None,
                disable_notification=params.boolean("disable_notification"),
                upload=upload,
                received_at=time.monotonic(),
                reply_markup=message.get("reply_markup"),
            )
        )
        self._changes.notify()
        return copy.deepcopy(message)


def _without_reply(message: JSON) -> JSON:
    """A copy of `message` to embed as `reply_to_message` (Telegram does not nest them)."""
    embedded = copy.deepcopy(message)
    embedded.pop("reply_to_message", None)
    return embedded


def _blocked_description(chat_type: str) -> str:
    if chat_type == "private":
        return BLOCKED_BY_USER
    if chat_type == "channel":
        return "Forbidden: bot is not a member of the channel chat"
    return f"Forbidden: bot was kicked from the {chat_type} chat"
