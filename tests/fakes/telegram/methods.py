"""The Bot API methods of `FakeTelegramServer` and its webhook pusher, each taking the server."""

from __future__ import annotations

import contextlib
import copy
import re
import time
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tests.fakes.telegram.records import (
    CHAT_ACTIONS,
    DEFAULT_UPDATE_KINDS,
    EDIT_NOT_FOUND,
    MAX_POLL_TIMEOUT,
    MAX_UPDATES,
    NOT_MODIFIED,
    POLL_CONFLICT,
    WEBHOOK_CONFLICT,
    Action,
    Edit,
    ReactionSet,
    StoredFile,
    Update,
    Upload,
    Webhook,
    WebhookDelivery,
    _api_error,
    _ApiError,
    _document_json,
    _Params,
)

if TYPE_CHECKING:
    from tests.fakes.telegram.server import FakeTelegramServer


# -- Bot API methods --------------------------------------------------------------------------


async def get_me(server: FakeTelegramServer, request: Request, params: _Params) -> Any:
    return {
        **server.bot_user,
        "can_join_groups": True,
        "can_read_all_group_messages": False,
        "supports_inline_queries": False,
        "can_connect_to_business": False,
        "has_main_web_app": False,
    }


async def get_updates(server: FakeTelegramServer, request: Request, params: _Params) -> Any:
    if server._faults.stall_polls > 0:
        server._faults.stall_polls -= 1
        await server._hold(request, None, lambda: False)
        return _api_error(502, "Bad Gateway")  # only if the server stops first
    if server._webhook is not None:
        raise _ApiError(409, WEBHOOK_CONFLICT)
    offset = params.integer("offset") or 0
    limit = min(max(params.integer("limit") or MAX_UPDATES, 1), MAX_UPDATES)
    timeout = min(max(params.number("timeout") or 0.0, 0.0), MAX_POLL_TIMEOUT)
    allowed = params.json("allowed_updates", "JSON array")
    if isinstance(allowed, list):
        kinds = frozenset(str(kind) for kind in allowed)
        server._allowed = kinds or DEFAULT_UPDATE_KINDS
    server._confirm(offset)
    server._poll_generation += 1
    generation = server._poll_generation
    server._changes.notify()  # a waiting older poll ends with 409

    def superseded() -> bool:
        return server._poll_generation != generation

    present = await server._hold(
        request,
        timeout,
        lambda: bool(server._queue) or superseded() or server._webhook is not None,
    )
    if not present:
        return Response(status_code=499)  # nobody to answer: deliver nothing
    if superseded():
        raise _ApiError(409, POLL_CONFLICT)
    if server._webhook is not None:
        raise _ApiError(409, WEBHOOK_CONFLICT)
    batch = server._deliverable(limit)
    for queued in batch:
        queued.delivered = True
    return [copy.deepcopy(queued.update.payload) for queued in batch]


async def send_message(server: FakeTelegramServer, request: Request, params: _Params) -> Any:
    chat = server._target_chat(params)
    thread_id = server._thread(chat, params)
    text, parse_mode, formatted = server._format(params, "text")
    params.json("link_preview_options")
    message = server._bot_message(chat, thread_id, server._reply_target(chat, params))
    message["text"] = formatted.text
    markup = params.json("reply_markup")
    if markup is not None:
        message["reply_markup"] = markup
    if formatted.entities:
        message["entities"] = list(formatted.entities)
    return server._record_sent(
        "sendMessage",
        chat,
        message,
        params,
        text=text,
        parse_mode=parse_mode,
        formatted=formatted,
    )


async def edit_message_text(server: FakeTelegramServer, request: Request, params: _Params) -> Any:
    if "inline_message_id" in params:
        raise _ApiError(400, "Bad Request: inline messages are not supported by the fake")
    chat = server._target_chat(params)
    text, parse_mode, formatted = server._format(params, "text")
    message_id = params.integer("message_id") or 0
    message = chat.messages.get(message_id)
    if message is None:
        raise _ApiError(400, EDIT_NOT_FOUND)
    if message.get("from", server.bot_user).get("id") != server.bot_user["id"]:
        raise _ApiError(400, "Bad Request: message can't be edited")
    if "text" not in message:
        raise _ApiError(400, "Bad Request: there is no text in the message to edit")
    if message["text"] == formatted.text and message.get("entities", []) == list(
        formatted.entities
    ):
        raise _ApiError(400, NOT_MODIFIED)
    message["text"] = formatted.text
    message.pop("entities", None)
    if formatted.entities:
        message["entities"] = list(formatted.entities)
    message["edit_date"] = int(time.time())
    server.edits.append(
        Edit(
            chat.id,
            message_id,
            text,
            parse_mode,
            formatted.text,
            formatted.entities,
            time.monotonic(),
        )
    )
    server._changes.notify()
    return copy.deepcopy(message)


async def delete_message(server: FakeTelegramServer, request: Request, params: _Params) -> Any:
    chat = server._target_chat(params)
    message_id = params.integer("message_id") or 0
    if chat.messages.pop(message_id, None) is None:
        raise _ApiError(400, "Bad Request: message to delete not found")
    server.deleted.append((chat.id, message_id))
    server._changes.notify()
    return True


async def answer_callback_query(
    server: FakeTelegramServer, request: Request, params: _Params
) -> Any:
    query_id = params.string("callback_query_id") or ""
    if not query_id:
        raise _ApiError(400, "Bad Request: query is too old and response timeout expired")
    server.answered_queries.append(query_id)
    server._changes.notify()
    return True


async def send_chat_action(server: FakeTelegramServer, request: Request, params: _Params) -> Any:
    chat = server._target_chat(params)
    thread_id = server._thread(chat, params)
    action = params.string("action") or ""
    if action not in CHAT_ACTIONS:
        raise _ApiError(400, "Bad Request: wrong parameter action in request")
    server.actions.append(Action(chat.id, action, thread_id, time.monotonic()))
    server._changes.notify()
    return True


async def set_message_reaction(
    server: FakeTelegramServer, request: Request, params: _Params
) -> Any:
    chat = server._target_chat(params)
    message_id = params.integer("message_id") or 0
    if message_id not in chat.messages:
        raise _ApiError(400, "Bad Request: message to react not found")
    given = params.json("reaction", "JSON array") if params.values.get("reaction") else []
    emoji = (
        [str(r.get("emoji")) for r in given if isinstance(r, dict) and r.get("type") == "emoji"]
        if isinstance(given, list)
        else []
    )
    server.reactions.append(ReactionSet(chat.id, message_id, tuple(emoji)))
    server._changes.notify()
    return True


async def send_photo(server: FakeTelegramServer, request: Request, params: _Params) -> Any:
    return await send_file(server, "sendPhoto", "photo", params)


async def send_document(server: FakeTelegramServer, request: Request, params: _Params) -> Any:
    return await send_file(server, "sendDocument", "document", params)


async def send_voice(server: FakeTelegramServer, request: Request, params: _Params) -> Any:
    return await send_file(server, "sendVoice", "voice", params)


async def send_file(server: FakeTelegramServer, method: str, kind: str, params: _Params) -> Any:
    chat = server._target_chat(params)
    thread_id = server._thread(chat, params)
    text, parse_mode, formatted = server._format(params, "caption", caption=True)
    reply = server._reply_target(chat, params)
    upload, stored = input_file(server, params, kind)  # last: it registers the file
    message = server._bot_message(chat, thread_id, reply)
    if kind == "photo":
        message["photo"] = server._photo_sizes(stored)
    elif kind == "voice":
        message["voice"] = {
            "file_id": stored.file_id,
            "file_unique_id": stored.file_unique_id,
            "duration": 1,
            "mime_type": stored.mime_type or "audio/ogg",
            "file_size": len(stored.content),
        }
    else:
        message["document"] = _document_json(stored)
    if formatted.text:
        message["caption"] = formatted.text
        if formatted.entities:
            message["caption_entities"] = list(formatted.entities)
    return server._record_sent(
        method,
        chat,
        message,
        params,
        text=text,
        parse_mode=parse_mode,
        formatted=formatted,
        upload=upload,
    )


def input_file(server: FakeTelegramServer, params: _Params, kind: str) -> tuple[Upload, StoredFile]:
    """The file a sendPhoto / sendDocument / sendVoice carries; registered so getFile serves
    it."""
    part = params.files.get(kind)
    value = params.string(kind)
    if part is None and value is not None and value.startswith("attach://"):
        part = params.files.get(value.removeprefix("attach://"))
    if part is not None:
        # Telegram's style: photos/file_3.jpg, documents/file_4.csv
        if kind == "photo":
            folder, suffix = "photos", ".jpg"
        elif kind == "voice":
            folder, suffix = "voice", ".oga"
        else:
            folder = "documents"
            match = re.search(r"\.[A-Za-z0-9]{1,10}$", part.filename or "")
            suffix = match.group() if match else ""
        file_id = server.add_file(
            part.content,
            file_path=f"{folder}/file_{len(server._files) + 1}{suffix}",
            file_name=part.filename,
            mime_type=part.content_type,
        )
        upload = Upload(kind, "upload", file_id, part.filename, part.content_type, part.content)
        return upload, server._files[file_id]
    if not value:
        raise _ApiError(400, f"Bad Request: there is no {kind} in the request")
    if value in server._files:
        stored = server._files[value]
        upload = Upload(kind, "file_id", value, stored.file_name, stored.mime_type, stored.content)
        return upload, stored
    if value.startswith(("http://", "https://")):
        file_id = server.add_file(b"", file_name=value.rsplit("/", 1)[-1] or None)
        return Upload(kind, "url", file_id, None, None, b"", url=value), server._files[file_id]
    raise _ApiError(400, "Bad Request: wrong file identifier/HTTP URL specified")


async def get_file(server: FakeTelegramServer, request: Request, params: _Params) -> Any:
    stored = server._files.get(params.string("file_id") or "")
    if stored is None:
        raise _ApiError(400, "Bad Request: invalid file_id")
    return stored.to_json()


async def download(server: FakeTelegramServer, request: Request) -> Response:
    path = str(request.path_params["file_path"])
    stored = next((f for f in server._files.values() if f.file_path == path), None)
    if not server._authorized(request) or stored is None:
        return _api_error(404, "Not Found")
    failure = server._download_failure()
    if failure is not None:
        return _api_error(failure, "Not Found" if failure == 404 else "Internal Server Error")
    server.downloads.append(path)
    return Response(stored.content, media_type=stored.mime_type or "application/octet-stream")


async def set_webhook(server: FakeTelegramServer, request: Request, params: _Params) -> Any:
    url = params.string("url") or ""
    if not url:
        return await delete_webhook(server, request, params)
    try:
        scheme = httpx.URL(url).scheme
    except httpx.InvalidURL:
        scheme = ""
    if scheme not in ("http", "https"):  # Telegram wants https; the fake takes http too
        raise _ApiError(400, "Bad Request: bad webhook: HTTPS url must be provided for webhook")
    secret = params.string("secret_token") or None
    if secret is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", secret):
        raise _ApiError(400, "Bad Request: secret token contains unallowed characters")
    allowed = params.json("allowed_updates", "JSON array")
    if isinstance(allowed, list):
        kinds = [str(kind) for kind in allowed]
        server._allowed = frozenset(kinds) or DEFAULT_UPDATE_KINDS
    else:
        kinds = None
    if params.boolean("drop_pending_updates"):
        drop_pending(server)
    server._webhook = Webhook(
        url=url,
        secret_token=secret,
        max_connections=params.integer("max_connections") or 40,
        allowed_updates=kinds,
    )
    server._changes.notify()
    return JSONResponse({"ok": True, "result": True, "description": "Webhook was set"})


async def delete_webhook(server: FakeTelegramServer, request: Request, params: _Params) -> Any:
    if params.boolean("drop_pending_updates"):
        drop_pending(server)
    was_set = server._webhook is not None
    server._webhook = None
    server._changes.notify()
    description = "Webhook was deleted" if was_set else "Webhook is already deleted"
    return JSONResponse({"ok": True, "result": True, "description": description})


async def get_webhook_info(server: FakeTelegramServer, request: Request, params: _Params) -> Any:
    return server.webhook_info()


async def set_my_commands(server: FakeTelegramServer, request: Request, params: _Params) -> Any:
    commands = params.json("commands", "JSON array")
    if not isinstance(commands, list):
        raise _ApiError(400, "Bad Request: can't parse commands JSON array")
    server.commands = [dict(c) for c in commands if isinstance(c, dict)]
    server._changes.notify()
    return True


async def get_my_commands(server: FakeTelegramServer, request: Request, params: _Params) -> Any:
    return list(server.commands)


async def delete_my_commands(server: FakeTelegramServer, request: Request, params: _Params) -> Any:
    server.commands = []
    server._changes.notify()
    return True


def drop_pending(server: FakeTelegramServer) -> None:
    server.discarded.extend(queued.update.update_id for queued in server._queue)
    server._queue = []
    server._changes.notify()


# -- webhook pusher ---------------------------------------------------------------------------


async def push_to_webhook(server: FakeTelegramServer) -> None:
    """While a webhook is set, push pending updates to it one at a time, in order."""
    while True:
        await server.wait_for(lambda: server._webhook is not None and bool(server._queue), None)
        webhook = server._webhook
        queued = server._queue[0]
        assert webhook is not None
        status, error = await post_update(server, webhook, queued.update)
        server.webhook_deliveries.append(
            WebhookDelivery(queued.update.update_id, webhook.url, status, error, time.monotonic())
        )
        if error is None:
            if queued in server._queue:
                server._queue.remove(queued)
                server.confirmed.append(queued.update.update_id)
            server._changes.notify()
            continue
        webhook.last_error_date = int(time.time())
        webhook.last_error_message = error
        server._changes.notify()
        await pause_pushing(server, webhook)


async def pause_pushing(server: FakeTelegramServer, webhook: Webhook) -> None:
    """Wait `webhook_retry_delay` before retrying, less if the webhook changes."""
    with contextlib.suppress(TimeoutError):
        await server.wait_for(lambda: server._webhook is not webhook, server._retry_delay)


async def post_update(
    server: FakeTelegramServer, webhook: Webhook, update: Update
) -> tuple[int | None, str | None]:
    """POST one update; (status, None) on a 2xx, else the error Telegram would report."""
    assert server._http is not None
    headers = {}
    if webhook.secret_token is not None:
        headers["X-Telegram-Bot-Api-Secret-Token"] = webhook.secret_token
    try:
        response = await server._http.post(webhook.url, json=update.payload, headers=headers)
    except httpx.ConnectError:
        return None, "Connection refused"
    except httpx.TimeoutException:
        return None, "Read timeout expired"
    except (httpx.HTTPError, httpx.InvalidURL) as err:
        return None, f"{type(err).__name__}: {err}"
    if 200 <= response.status_code < 300:
        return response.status_code, None
    phrase = response.reason_phrase or HTTPStatus(response.status_code).phrase
    return (
        response.status_code,
        f"Wrong response from the webhook: {response.status_code} {phrase}",
    )
