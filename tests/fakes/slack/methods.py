"""The Web API methods of `FakeSlackServer`, each taking the server."""

from __future__ import annotations

import copy
import secrets
import time
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from tests.fakes.slack.records import (
    _REACTION,
    JSON,
    Deleted,
    Download,
    Posted,
    ReactionChange,
    Updated,
    Upload,
    _ApiError,
    _Params,
    _random_id,
    _read_params,
    _User,
)

if TYPE_CHECKING:
    from tests.fakes.slack.server import FakeSlackServer


async def auth_test(server: FakeSlackServer, params: _Params) -> JSON:
    return {
        "url": f"https://{server.team}.slack.com/",
        "team": server.team,
        "user": server.bot_name,
        "team_id": server.team_id,
        "user_id": server.bot_user_id,
        "bot_id": server.bot_id,
        "is_enterprise_install": False,
    }


async def apps_connections_open(server: FakeSlackServer, params: _Params) -> JSON:
    if server._faults.refuse_open > 0:
        server._faults.refuse_open -= 1
        server.refused_connections += 1
        raise _ApiError("internal_error")
    ticket = str(uuid.uuid4())
    server._tickets.add(ticket)
    return {"url": f"ws://127.0.0.1:{server.ws_port}/link/?ticket={ticket}&app_id={server.app_id}"}


async def chat_post_message(server: FakeSlackServer, params: _Params) -> JSON:
    channel = server._target(params)
    if not channel.is_member and channel.kind != "im":
        raise _ApiError("not_in_channel")
    text = server._text(params)
    thread_ts = params.string("thread_ts") or None
    ts = server._next_ts()
    message = server._bot_message(text, ts, thread_ts)
    blocks = params.decoded("blocks")
    if blocks:
        message["blocks"] = blocks
    server._messages[(channel.id, ts)] = copy.deepcopy(message)
    server._bot_messages.append((channel.id, ts))
    server.posted.append(
        Posted(
            channel=channel.id,
            ts=ts,
            text=text,
            thread_ts=thread_ts,
            reply_broadcast=params.boolean("reply_broadcast"),
            mrkdwn=params.boolean("mrkdwn", default=True),
            blocks=blocks,
            params=params.logged(),
            received_at=time.monotonic(),
        )
    )
    if server.echo_bot_messages:
        server._queue(server._message_event(message, channel.id, None))
    return {"channel": channel.id, "ts": ts, "message": message}


async def chat_update(server: FakeSlackServer, params: _Params) -> JSON:
    channel, ts, message = server._own_message(params)
    if message.get("user") != server.bot_user_id:
        raise _ApiError("cant_update_message")
    text = server._text(params)
    message["text"] = text
    message["edited"] = {"user": server.bot_user_id, "ts": server._next_ts()}
    blocks = params.decoded("blocks")
    if blocks:
        message["blocks"] = blocks
    server.updates.append(Updated(channel.id, ts, text, params.logged(), time.monotonic()))
    return {
        "channel": channel.id,
        "ts": ts,
        "text": text,
        "message": {k: v for k, v in message.items() if k != "ts"},
    }


async def chat_delete(server: FakeSlackServer, params: _Params) -> JSON:
    channel, ts, message = server._own_message(params)
    if message.get("user") != server.bot_user_id:
        raise _ApiError("cant_delete_message")
    del server._messages[(channel.id, ts)]
    server._current_reactions.pop((channel.id, ts), None)
    server.deleted.append(Deleted(channel.id, ts, time.monotonic()))
    return {"channel": channel.id, "ts": ts}


def reaction(server: FakeSlackServer, params: _Params) -> tuple[str, str, str, list[str]]:
    name = (params.string("name") or "").strip(":")
    if not _REACTION.match(name):
        raise _ApiError("invalid_name")
    channel, ts, _ = server._own_message(params, "timestamp")
    return channel.id, ts, name, server._current_reactions.setdefault((channel.id, ts), [])


async def reactions_add(server: FakeSlackServer, params: _Params) -> JSON:
    channel, ts, name, current = reaction(server, params)
    if name in current:
        raise _ApiError("already_reacted")
    current.append(name)
    server.reactions.append(ReactionChange("add", channel, ts, name, time.monotonic()))
    return {}


async def reactions_remove(server: FakeSlackServer, params: _Params) -> JSON:
    channel, ts, name, current = reaction(server, params)
    if name not in current:
        raise _ApiError("no_reaction")
    current.remove(name)
    server.reactions.append(ReactionChange("remove", channel, ts, name, time.monotonic()))
    return {}


async def conversations_info(server: FakeSlackServer, params: _Params) -> JSON:
    return {"channel": server._target(params).to_json()}


async def users_info(server: FakeSlackServer, params: _Params) -> JSON:
    user_id = params.string("user") or ""
    if user_id == server.bot_user_id:
        bot = _User(user_id, server.bot_name, server.bot_name, server.bot_name, is_bot=True)
        return {"user": bot.to_json(server.team_id)}
    user = server._user(user_id)
    if user is None:
        raise _ApiError("user_not_found")
    return {"user": user.to_json(server.team_id)}


async def files_get_upload_url(server: FakeSlackServer, params: _Params) -> JSON:
    filename = params.string("filename") or ""
    length = params.string("length") or ""
    if not filename or not length.isdigit():
        raise _ApiError("invalid_arguments")
    slot = secrets.token_urlsafe(16)
    file_id = _random_id("F")
    server._upload_slots[slot] = {
        "file_id": file_id,
        "filename": filename,
        "length": int(length),
        "content": None,
    }
    return {"upload_url": f"{server.url}/upload/v1/{slot}", "file_id": file_id}


async def upload_endpoint(server: FakeSlackServer, request: Request) -> Response:
    slot = server._upload_slots.get(str(request.path_params["slot"]))
    if slot is None:
        return PlainTextResponse("Not Found", status_code=404)
    params = await _read_params(request)
    part = next(iter(params.files.values()), None)
    content = part.content if part is not None else await request.body()
    slot["content"] = content
    server._changes.notify()
    return PlainTextResponse(f"OK - {len(content)}")


async def files_complete_upload(server: FakeSlackServer, params: _Params) -> JSON:
    items = params.decoded("files")
    if not isinstance(items, list) or not items:
        raise _ApiError("invalid_arguments")
    by_id = {slot["file_id"]: slot for slot in server._upload_slots.values()}
    completed: list[tuple[dict[str, Any], str]] = []
    for item in items:
        if not isinstance(item, dict) or item.get("id") not in by_id:
            raise _ApiError("file_not_found")
        slot = by_id[item["id"]]
        if slot["content"] is None:
            raise _ApiError("file_not_found")
        completed.append((slot, str(item.get("title") or slot["filename"])))
    channel = server._target(params, "channel_id") if params.string("channel_id") else None
    thread_ts = params.string("thread_ts") or None
    comment = params.string("initial_comment") or None
    ts = server._next_ts() if channel is not None else None
    answer = []
    for slot, title in completed:
        server._upload_slots = {k: v for k, v in server._upload_slots.items() if v is not slot}
        stored = server._store_file(
            slot["content"],
            name=slot["filename"],
            mimetype="application/octet-stream",
            title=title,
            user=server.bot_user_id,
            file_id=slot["file_id"],
        )
        file_json = stored.to_json()
        if channel is not None and ts is not None:
            share: JSON = {"ts": ts, "channel_name": channel.display_name}
            if thread_ts is not None:
                share["thread_ts"] = thread_ts
            scope = "public" if channel.kind == "channel" else "private"
            file_json["shares"] = {scope: {channel.id: [share]}}
            file_json["channels" if scope == "public" else "groups"] = [channel.id]
        answer.append(file_json)
        server.uploads.append(
            Upload(
                file_id=stored.id,
                filename=stored.name,
                title=title,
                content=stored.content,
                channel=channel.id if channel is not None else None,
                thread_ts=thread_ts,
                initial_comment=comment,
                ts=ts,
                received_at=time.monotonic(),
            )
        )
    if channel is not None and ts is not None:
        message = server._bot_message(comment or "", ts, thread_ts)
        message.update(subtype="file_share", files=copy.deepcopy(answer), upload=True)
        server._messages[(channel.id, ts)] = message
    return {"files": answer}


async def download(server: FakeSlackServer, request: Request) -> Response:
    key = str(request.path_params["key"])
    file_id = key.removeprefix(f"{server.team_id}-")
    stored = server._files.get(file_id)
    header = request.headers.get("authorization", "")
    token = header[7:].strip() if header.lower().startswith("bearer ") else ""
    authorized = server._token_kind(token) == "bot"
    status = 404 if stored is None else 200 if authorized else 403
    server.downloads.append(Download(file_id, authorized, status, time.monotonic()))
    server._changes.notify()
    if stored is None:
        return PlainTextResponse("Not Found", status_code=404)
    if not authorized:
        return PlainTextResponse("Forbidden", status_code=403)
    disposition = f"attachment; filename*=UTF-8''{quote(stored.name)}"
    return Response(
        stored.content,
        media_type=stored.mimetype,
        headers={"Content-Disposition": disposition},
    )
