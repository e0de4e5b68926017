"""The OpenAI-compatible API: `POST /v1/chat/completions` and `GET /v1/models`."""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import time
import unicodedata
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Depends, Header, HTTPException, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.exc import SQLAlchemyError

from agent_core.media.images import Pictures, UnreadableImage
from agent_core.media.refs import reference
from agent_core.media.vision import BLIND_NOTE
from gateway.agents import UnknownProfile
from gateway.commands import parse_command
from gateway.contracts.errors import FileStoreUnavailable, FileTooLarge, Overloaded, ShuttingDown
from gateway.contracts.history import ChatMessage, Role, ToolCall
from gateway.contracts.ids import (
    API_ACCOUNT,
    AccountId,
    Origin,
    SessionKey,
    UserId,
    session_key,
)
from gateway.contracts.messages import Attachment
from gateway.http import uploads
from gateway.http.deps import AppDeps
from gateway.http.errors import error_body, error_response
from gateway.http.local import require_local
from gateway.http.middleware import RECEIVED_AT
from gateway.profiles import DEFAULT, MODEL_PREFIX, PROFILE_HEADER, parse_model
from gateway.redact import Redactor, SecretStream
from gateway.sessions import Finished, Token, TurnRequest, TurnStream

SESSION_HEADERS = ("x-herald-session-id", "x-hermes-session-id")
IDEMPOTENCY_HEADERS = ("idempotency-key",)
"""A retry of a session request carrying the same key is answered by the same turn."""
USER_HEADERS = ("x-herald-user-id", "x-hermes-user-id")
PROFILE_HEADERS = (PROFILE_HEADER.lower(),)
MAX_ID_LENGTH = 256


class TextPart(BaseModel):
    """One part of a multi-part message content."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class FunctionCallIn(BaseModel):
    """The function of a tool call in a message history."""

    name: str
    arguments: str = ""


class ToolCallIn(BaseModel):
    """A tool call in a message history."""

    model_config = ConfigDict(extra="allow")
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallIn


class MessageIn(BaseModel):
    """One message of the request's `messages`."""

    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The text of the message, parts joined."""
        if isinstance(self.content, list):
            return "\n".join(p.text for p in self.content if p.type == "text" and p.text)
        return self.content or ""


class StreamOptions(BaseModel):
    """`stream_options` of the request."""

    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """The body of `POST /v1/chat/completions`. Unknown OpenAI parameters are accepted."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[MessageIn] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, max_length=MAX_ID_LENGTH)


def _check_id(name: str, value: str) -> str:
    """A session or user name from the body: any text but control characters."""
    if len(value) > MAX_ID_LENGTH:
        raise HTTPException(400, f"{name} is longer than {MAX_ID_LENGTH} characters")
    if not value or any(unicodedata.category(c) in ("Cc", "Cs") for c in value):
        raise HTTPException(400, f"{name} is empty or contains control characters")
    return value


def _header(request: Request, names: tuple[str, ...]) -> tuple[str, str] | None:
    """The first of the headers `names` that is present, checked: printable ASCII only."""
    for name in names:
        value = request.headers.get(name)
        if value is not None:
            _check_id(name, value)
            if not all(" " <= c <= "~" for c in value):
                raise HTTPException(
                    400,
                    f"{name} must be printable ASCII; name a session with other characters "
                    "in the `user` field of the body",
                )
            return name, value
    return None


def _echo(session_id: str) -> str:
    """The session id for the `X-Herald-Session-Id` response header: as it is when ASCII,
    else percent-encoded UTF-8 (a header carries only Latin-1)."""
    return session_id if session_id.isascii() else quote(session_id, safe="")


def require_key(request: Request) -> AppDeps:
    """Check `Authorization: Bearer <api.key>` (in constant time) when a key is configured."""
    deps: AppDeps = request.app.state.deps
    key = deps.config.api.key
    if key is None:
        require_local(request)  # KeyGate refused it already; this guards any other route
        return deps
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    expected = key.get_secret_value().encode()
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected):
        raise HTTPException(401, "missing or wrong API key", headers={"WWW-Authenticate": "Bearer"})
    return deps


Deps = Annotated[AppDeps, Depends(require_key)]
router = APIRouter(prefix="/v1", tags=["openai"])


@router.get("/models", responses={401: {"description": "Missing or wrong API key"}})
async def list_models(deps: Deps) -> dict[str, Any]:
    """The models Herald serves: the agent (`api.model_name`, the default profile) and, when
    profiles are configured, `herald:<profile>` for every profile (a config without profiles
    lists what it always listed)."""
    ids = [deps.config.api.model_name]
    names = deps.manager.profiles.names
    if len(names) > 1:
        ids += [f"{MODEL_PREFIX}{name}" for name in names]
    return {
        "object": "list",
        "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "herald"}
            for name in dict.fromkeys(ids)
        ],
    }


def _brief(name: str) -> str:
    """`name` as an error shows it: a profile's name is at most 32 characters, so what is
    longer is cut (a huge `model` is not echoed back whole)."""
    return name if len(name) <= 40 else name[:40] + "…"


def _profile(request: Request, body: ChatCompletionRequest, deps: AppDeps) -> str:
    """The profile a request asks for: `X-Herald-Profile`, or `model: "herald:<profile>"`
    (any other model: the default profile). 400 naming the profiles there are when it names
    none of them, or when the two disagree."""
    header = _header(request, PROFILE_HEADERS)
    by_header = header[1] if header else None
    by_model = parse_model(body.model)
    if by_header is not None and by_model is not None and by_header != by_model:
        raise HTTPException(
            400,
            f"{PROFILE_HEADER} asks for profile {_brief(by_header)!r} but model asks for "
            f"{_brief(body.model or '')!r}; name one profile",
        )
    name = by_header or by_model or DEFAULT
    try:
        deps.manager.profiles.get(name)
    except UnknownProfile:
        models = ", ".join(f"{MODEL_PREFIX}{n}" for n in deps.manager.profiles.names)
        raise HTTPException(
            400, f"no profile {_brief(name)!r}; use one of the models {models}"
        ) from None
    return name


@router.post(
    "/chat/completions",
    responses={
        400: {"description": "Invalid request"},
        401: {"description": "Missing or wrong API key"},
        403: {"description": "Session or user headers without an API key configured"},
        409: {"description": "The session belongs to another user"},
        422: {"description": "The Idempotency-Key was used for a different request"},
        413: {"description": "Body too large"},
        503: {
            "description": "Shutting down, too many turns waiting (see Retry-After), or the "
            "model is unavailable; retry later"
        },
    },
)
async def chat_completions(
    body: ChatCompletionRequest,
    request: Request,
    deps: Deps,
    x_herald_session_id: Annotated[str | None, Header()] = None,
    x_herald_user_id: Annotated[str | None, Header()] = None,
) -> Response:
    """Answer as the agent. A named session keeps its history; send only the new message.

    The session is named by `X-Herald-Session-Id` (or `X-Hermes-Session-Id`) or the `user`
    field. Without one, the request is stateless and `messages` is the whole conversation.
    A session request sent again (the same `Idempotency-Key`, or the session's last question
    unanswered within `api.retry_window`) is answered by the same turn, never stored twice.
    """
    # Everything the request names is checked before anything runs or is stored.
    session_header = _header(request, SESSION_HEADERS)
    user_header = _header(request, USER_HEADERS)
    idempotency = _header(request, IDEMPOTENCY_HEADERS)
    user_field = _check_id("user", body.user) if body.user is not None else None
    if (session_header or user_header) and deps.config.api.key is None:
        raise HTTPException(
            403, "session and user headers need an API key; set api.key in the config"
        )
    profile = _profile(request, body, deps)
    try:
        deps.manager.admit()  # before any database work: refusing must stay cheap
    except Overloaded as err:
        return _overloaded(err)
    session_id = session_header[1] if session_header else user_field
    max_bytes = deps.config.files.max_upload_bytes

    kept: list[Attachment] = []
    if session_id is not None:
        # The same session name under two profiles is two conversations.
        key = session_key(
            Origin.API, API_ACCOUNT if profile == DEFAULT else AccountId(profile), session_id
        )
        name = user_header[1] if user_header else user_field
        identity = (str(Origin.API), name) if name is not None else OWNER_IDENTITY
        if _with_parts(body.messages):  # decoding pictures blocks
            text, found = await asyncio.to_thread(_new_input, body.messages, max_bytes)
        else:
            text, found = _new_input(body.messages, max_bytes)
        user_id = await _session_user(deps, key, identity, session_id, profile)
        if not found and (command := parse_command(text)) is not None:
            reply = await deps.manager.api_command(key, user_id, command)
            headers = {"X-Herald-Session-Id": _echo(session_id)}
            return _command_reply(body, reply, headers, deps)
        if found:  # kept in the blob store for the session; the history keeps a reference
            kept = await _keep_pictures(deps, key, found)
            text = "\n".join([*([text] if text else []), *map(reference, kept)])
        turn = TurnRequest(
            key,
            str(Origin.API),
            text,
            user_id,
            stream=body.stream,
            # The key holder operates Herald; without a key, callers are not trusted so far.
            operator=deps.config.api.key is not None,
            idempotency_key=idempotency[1] if idempotency else None,
            retry_window=deps.config.api.retry_window,
            profile=profile,
        )
    else:
        last = body.messages[-1]
        if last.role == "user" and (command := parse_command(last.text())) is not None:
            reply = await deps.manager.api_command(None, None, command)
            return _command_reply(body, reply, {}, deps)
        key = SessionKey(f"api:stateless:{uuid.uuid4().hex}")
        if _with_parts(body.messages):
            history = await asyncio.to_thread(_history, body.messages, max_bytes, deps)
        else:
            history = _history(body.messages, max_bytes, deps)
        turn = TurnRequest(
            key, str(Origin.API), "", None, history=history, stream=body.stream, profile=profile
        )

    try:
        stream = deps.manager.submit(turn)
    except (ShuttingDown, Overloaded) as err:
        await _forget_pictures(deps, key, kept)
        if isinstance(err, Overloaded):
            return _overloaded(err)
        return error_response(503, str(err), headers={"Retry-After": "5"})
    stateless = turn.history is not None
    headers = {"X-Herald-Session-Id": _echo(session_id)} if session_id else {}
    model = body.model or deps.config.api.model_name
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        events = _sse(stream, completion_id, model, include_usage, deps, stateless=stateless)
        return StreamingResponse(
            events,
            media_type="text/event-stream",
            headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    done = await _result(request, stream, stateless=stateless)
    headers["Server-Timing"] = _server_timing(request, done, deps)
    if done.status != "completed":
        return _failure(done, headers, deps.redactor)
    content = deps.redactor.secrets(done.text)
    return JSONResponse(_completion(completion_id, model, content, _usage(done)), headers=headers)


async def _keep_pictures(
    deps: AppDeps, key: SessionKey, found: list[uploads.Picture]
) -> list[Attachment]:
    """The pictures kept in the blob store and recorded as files of session `key`. Raises
    HTTPException 503 saying why they cannot be kept."""
    if deps.files is None:
        raise HTTPException(503, "this server keeps no files; send text only")
    scratch = deps.config.state_dir / "files" / "api"
    written = await asyncio.to_thread(uploads.keep, found, scratch)
    kept: list[Attachment] = []
    try:
        for a in written:
            kept.append(await deps.files.keep(a.path, a.filename, a.mime_type))
        await deps.files.blobs.records.add_session_files(key, kept)
    except (FileStoreUnavailable, FileTooLarge, SQLAlchemyError) as err:
        why = deps.redactor(f"{type(err).__name__}: {err}")
        raise HTTPException(
            503, f"the picture cannot be kept now ({why}); try again", {"Retry-After": "5"}
        ) from err
    finally:
        await asyncio.to_thread(uploads.forget, written)
    return kept


async def _forget_pictures(deps: AppDeps, key: SessionKey, kept: list[Attachment]) -> None:
    """Forget pictures `_keep_pictures` recorded for a request that did not run."""
    if kept and deps.files is not None:
        await deps.files.blobs.records.drop_session_files(key, kept)


def _completion(
    completion_id: str, model: str, content: str, usage: dict[str, int]
) -> dict[str, Any]:
    """A `chat.completion` object answering `content`."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": usage,
    }


def _command_reply(
    body: ChatCompletionRequest, reply: str, headers: dict[str, str], deps: AppDeps
) -> Response:
    """A command's answer as a completion (streamed when asked): no model call, no usage."""
    model = body.model or deps.config.api.model_name
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    content = deps.redactor.secrets(reply)
    if not body.stream:
        return JSONResponse(_completion(completion_id, model, content, usage), headers=headers)
    created = int(time.time())
    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        data = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": choices,
            **extra,
        }
        return b"data: " + json.dumps(data).encode() + b"\n\n"

    async def events() -> AsyncIterator[bytes]:
        delta = {"role": "assistant", "content": content}
        yield event([{"index": 0, "delta": delta, "finish_reason": None}])
        yield event([{"index": 0, "delta": {}, "finish_reason": "stop"}])
        if include_usage:
            yield event([], usage=usage)
        yield b"data: [DONE]\n\n"

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


OWNER_IDENTITY = ("local", "owner")
"""Who a session named by header alone belongs to: the key holder, the local owner."""


async def _session_user(
    deps: AppDeps,
    key: SessionKey,
    identity: tuple[str, str],
    session_id: str,
    profile: str = DEFAULT,
) -> UserId:
    """The user the session `key` runs as: its creator. 409 when `identity` is someone else.

    An unknown session is created here, for `identity`, so that two first requests naming
    different users cannot both take it; a request refused with 409 writes nothing.
    """
    existing, owned = await deps.store.session_of(key, identity)
    if existing is None:
        user_id = await deps.store.resolve_user(*identity)
        existing = await deps.store.open_session(
            key,
            platform=str(Origin.API),
            user_id=user_id,
            snapshot=deps.manager.profiles.get(profile).snapshot,
            profile=profile,
        )
        if existing.user_id == user_id:
            return user_id
    elif existing.user_id is not None and owned:
        return existing.user_id
    raise HTTPException(409, await _conflict(deps, existing.user_id, identity, session_id))


async def _conflict(
    deps: AppDeps, owner: UserId | None, identity: tuple[str, str], session_id: str
) -> str:
    """What a 409 says: whose the session is, and the three ways on."""
    held = [] if owner is None else await deps.store.identities_of(owner)
    api_names = [name for platform, name in held if platform == str(Origin.API)]
    you = ":".join(identity)
    if not held:
        return (
            f"session {session_id!r} belongs to another user; name a session of your own "
            "(another X-Herald-Session-Id or user)"
        )
    theirs = ":".join(held[0])
    hint = (
        f"send it as that user (X-Herald-User-Id: {api_names[0]}, or user={api_names[0]!r}), "
        if api_names
        else ""
    )
    return (
        f"session {session_id!r} belongs to {theirs}, not {you}: {hint}make the two one "
        f"person with `herald users link {you} {theirs}`, or name a session of your own"
    )


def _overloaded(err: Overloaded) -> JSONResponse:
    """503 with `Retry-After` (whole seconds, at least 1)."""
    retry_after = str(max(1, math.ceil(err.retry_after)))
    return error_response(503, str(err), headers={"Retry-After": retry_after})


def _server_timing(request: Request, done: Finished, deps: AppDeps) -> str:
    """`Server-Timing` of a whole answer: Herald's own time and the model's, in ms.

    Herald's time runs from the request's arrival to this response, less the model calls.
    """
    received = getattr(request.state, RECEIVED_AT, None)
    total = time.perf_counter() - received if received is not None else done.llm_seconds
    own = max(total - done.llm_seconds, 0.0)
    deps.metrics.turn_overhead_seconds.observe(own)
    return f"herald;dur={own * 1000:.3f}, llm;dur={done.llm_seconds * 1000:.3f}"


def _with_parts(messages: list[MessageIn]) -> bool:
    """Whether a message has content parts other than text (pictures to check)."""
    return any(
        isinstance(m.content, list) and any(p.type != "text" for p in m.content) for m in messages
    )


def _pictures(messages: list[MessageIn], index: int, max_bytes: int) -> list[uploads.Picture]:
    """The checked pictures of `messages[index]`; 400 (nothing stored) when one is refused.
    Blocking (decodes)."""
    content = messages[index].content
    parts = [p.model_dump() for p in content] if isinstance(content, list) else None
    try:
        return uploads.pictures(parts, f"messages[{index}]", max_bytes)
    except uploads.BadUpload as err:
        raise HTTPException(400, f"{err.param}: {err}") from err


def _new_input(messages: list[MessageIn], max_bytes: int) -> tuple[str, list[uploads.Picture]]:
    """The user messages after the last assistant message: what is new in this request (its
    text, and its pictures, checked). Blocking."""
    tail: list[str] = []
    found: list[uploads.Picture] = []
    for n in range(len(messages) - 1, -1, -1):
        m = messages[n]
        if m.role == "assistant":
            break
        if m.role == "user":
            tail.append(m.text())
            found[:0] = _pictures(messages, n, max_bytes)
    text = "\n\n".join(t for t in reversed(tail) if t.strip())
    if not text and not found:
        raise HTTPException(400, "messages: the request has no new user message")
    return text, found


def _history(messages: list[MessageIn], max_bytes: int, deps: AppDeps) -> tuple[ChatMessage, ...]:
    """A stateless request's conversation; its pictures as image parts (scaled like received
    pictures, at most `llm.max_images_per_turn`, none over `media.max_image_pixels` decoded)
    or, without vision, a note. Blocking."""
    llm = deps.config.llm
    pictures = deps.pictures or Pictures(llm.image_max_pixels, deps.config.media.max_image_pixels)
    if messages[-1].role not in ("user", "tool"):
        raise HTTPException(400, "messages: the last message must be from the user")
    found = {
        n: _pictures(messages, n, max_bytes) for n, m in enumerate(messages) if m.role == "user"
    }
    budget = llm.max_images_per_turn
    out = []
    for n, m in enumerate(messages):
        role = Role.SYSTEM if m.role == "developer" else Role(m.role)
        calls = tuple(
            ToolCall(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or ()
        )
        text, images = m.text(), list[str]()
        for p in found.get(n, ()):
            if not llm.vision:
                text = f"{text}\n{BLIND_NOTE}"
                break
            if len(images) >= budget:
                text += f"\n[a picture not shown: more than {llm.max_images_per_turn} pictures]"
                continue
            try:
                images.append(pictures.data_url(p.data))
            except UnreadableImage as err:
                text += f"\n[a picture not shown: {err}]"
        budget -= len(images)
        out.append(
            ChatMessage(
                role,
                text,
                tool_calls=calls,
                tool_call_id=m.tool_call_id,
                name=m.name,
                images=tuple(images),
            )
        )
    return tuple(out)


def _usage(done: Finished) -> dict[str, int]:
    prompt = done.usage.prompt_tokens if done.usage else 0
    completion = done.usage.completion_tokens if done.usage else 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _failure(done: Finished, headers: dict[str, str], redact: Redactor) -> JSONResponse:
    """The error answer of a turn that did not complete; its text without secrets."""
    if done.code is not None:
        return error_response(done.code, redact(done.error or "refused"), headers=headers)
    if done.status == "interrupted":
        return error_response(503, "the turn was interrupted; retry", headers=headers)
    if done.retryable:
        cause = (done.error or "unknown").removesuffix("; retry later")  # said once, below
        message = redact(f"the model could not answer ({cause}); retry later")
        return error_response(503, message, headers={**headers, "Retry-After": "10"})
    message = redact(f"the model refused the request: {done.error}")
    return error_response(502, message, headers=headers)


async def _result(request: Request, stream: TurnStream, *, stateless: bool) -> Finished:
    """The end of the turn. A stateless turn is cancelled when its client goes away first
    (nobody could read its answer); a session turn runs on and is stored."""
    if not stateless:
        return await stream.result()
    result = asyncio.ensure_future(stream.result())
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not result.done():
            result.cancel()
            _cancel(stream)
    if result.cancelled():
        return Finished("interrupted", error="the client went away")
    return result.result()


async def _client_gone(request: Request) -> None:
    """Return when the client disconnects (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _cancel(stream: TurnStream) -> None:
    if stream.task is not None:
        stream.task.cancel()


async def _sse(
    stream: TurnStream,
    completion_id: str,
    model: str,
    include_usage: bool,
    deps: AppDeps,
    *,
    stateless: bool,
) -> AsyncIterator[bytes]:
    """The turn as server-sent events. When the client goes away (the server cancels this
    generator), a stateless turn is cancelled; a session turn runs on and is stored."""
    finished = False
    try:
        async for event in _events(stream, completion_id, model, include_usage, deps):
            yield event
        finished = True
    finally:
        if stateless and not finished:
            _cancel(stream)


async def _events(
    stream: TurnStream, completion_id: str, model: str, include_usage: bool, deps: AppDeps
) -> AsyncIterator[bytes]:
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        data = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return b"data: " + json.dumps(data).encode() + b"\n\n"

    yield chunk({"role": "assistant", "content": ""})
    keepalive = deps.config.api.keepalive_seconds
    shown = SecretStream(deps.redactor)  # a secret the model echoes never leaves, even split
    while True:
        try:
            event = await asyncio.wait_for(stream.next(), keepalive)
        except TimeoutError:
            yield b": keep-alive\n\n"
            continue
        if isinstance(event, Token):
            if text := shown.feed(event.text):
                yield chunk({"content": text})
            continue
        assert isinstance(event, Finished)
        if rest := shown.flush():
            yield chunk({"content": rest})
        if event.status == "completed":
            yield chunk({}, "stop")
            if include_usage:
                usage = {
                    "id": completion_id,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": _usage(event),
                }
                yield b"data: " + json.dumps(usage).encode() + b"\n\n"
        else:
            status = 502 if event.status == "failed" and not event.retryable else 503
            status = event.code or status
            ended = "was interrupted" if event.status == "interrupted" else str(event.status)
            message = deps.redactor(f"the turn {ended}: {event.error}")
            yield b"data: " + json.dumps(error_body(status, message)).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"
        return
