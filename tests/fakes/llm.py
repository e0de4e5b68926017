"""A fake OpenAI-compatible chat-completions server, served by uvicorn on 127.0.0.1.

In tests: `async with FakeLLM() as llm:` then point a client at `llm.base_url`, script replies
with `llm.script(Reply(...))` and inspect `llm.requests`. Standalone (benchmarks, manual runs):
`python -m tests.fakes.llm --port 8000 [--delay 0.5]` serves the default responder until
interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fakes import standalone
from tests.fakes.params import client_left
from tests.fakes.serving import LocalServer, Served
from tests.fakes.standalone import until_signalled


@dataclass(frozen=True, slots=True)
class Reply:
    """What the fake answers to one chat-completions request."""

    text: str = ""
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """(name, arguments) pairs; the server assigns ids `call_1`, `call_2`… and JSON-encodes."""
    usage: tuple[int, int] | None = None
    """(prompt_tokens, completion_tokens); default: characters / 4 of request and reply."""
    delay: float = 0
    """Seconds before answering."""
    chunk_delay: float = 0
    """Seconds between streamed chunks."""
    chunks: int | None = None
    """Split the text into this many stream chunks; default: one chunk per word."""
    status: int = 200
    """Anything but 200 answers an OpenAI-style error body with this status."""
    error: str | None = None
    """The error body's message (default: `fake LLM error <status>`); `{key}` is replaced
    by the request's bearer token, as a provider that echoes a refused key does."""
    retry_after: float | None = None
    """Sets the `Retry-After` header (seconds)."""
    hang: bool = False
    """Never answer; the request ends when the client leaves or the server stops."""
    gate: asyncio.Event | None = None
    """Answer only once the test sets this (the server stopping releases it too)."""


Responder = Callable[[dict[str, Any]], Reply]


@dataclass(frozen=True, slots=True)
class Transcription:
    """One `/v1/audio/transcriptions` request: its form fields and the uploaded file."""

    model: str
    filename: str
    content_type: str
    content: bytes
    language: str | None = None


def last_user_text(body: dict[str, Any]) -> str:
    """The text of the last user message of a chat-completions request body ("" when none)."""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return "".join(
                    str(part.get("text", ""))
                    for part in content
                    if isinstance(part, dict) and part.get("type") == "text"
                )
            return ""
    return ""


def you_said(body: dict[str, Any]) -> Reply:
    """The default responder: `You said: <last user message>`."""
    return Reply(text=f"You said: {last_user_text(body)}")


_ERROR_TYPES = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
}


def _error_body(status: int, message: str | None = None) -> dict[str, Any]:
    kind, code = _ERROR_TYPES.get(status, ("server_error" if status >= 500 else "api_error", None))
    return {
        "error": {
            "message": message or f"fake LLM error {status}",
            "type": kind,
            "param": None,
            "code": code,
        }
    }


def _split(text: str, chunks: int | None) -> list[str]:
    """Pieces of `text` that concatenate back to it: per word, or `chunks` even slices."""
    if not text:
        return []
    if chunks is None:
        return [piece for piece in re.split(r"(?<=\s)(?=\S)", text) if piece]
    size = math.ceil(len(text) / max(1, chunks))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _estimate(chars: int) -> int:
    return math.ceil(chars / 4)


class FakeLLM(Served):
    """An OpenAI-compatible server for one test: scripted replies, recorded requests.

    Single event loop only: the server runs as a task of the loop that enters it.
    """

    def __init__(
        self, *, port: int = 0, model: str = "fake-model", log_level: str | None = None
    ) -> None:
        self.model = model
        self.requests: list[dict[str, Any]] = []
        """Every chat-completions request body, parsed, in arrival order."""
        self.headers: list[dict[str, str]] = []
        """The headers of each request in `requests` (lower-case names)."""
        self.model_listings = 0
        """How many times `GET /v1/models` was called."""
        self.abandoned = 0
        """Delayed or hanging requests whose client went away before the answer."""
        self.responder: Responder = you_said
        """Answers a request when no scripted reply is queued."""
        self.transcriptions: list[Transcription] = []
        """Every audio transcription request, in arrival order."""
        self.transcript = "hello from a voice note"
        """The text every transcription answers (while `transcription_status` is 200)."""
        self.transcription_status = 200
        """Anything but 200 answers transcriptions with an OpenAI-style error."""
        self._port = port
        self._log_level = log_level
        self._script: deque[Reply] = deque()
        self._received = asyncio.Condition()
        self._stopping = asyncio.Event()
        self._call_ids = 0
        self._local: LocalServer | None = None

    @property
    def base_url(self) -> str:
        """The OpenAI base URL of this server, `http://127.0.0.1:<port>/v1`."""
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, *replies: Reply) -> None:
        """Queue replies, consumed one per chat-completions request before the responder."""
        self._script.extend(replies)

    async def wait_for_requests(
        self,
        n: int,
        timeout: float = 10.0,
    ) -> list[dict[str, Any]]:
        """Wait until at least `n` chat-completions requests arrived; return them all.

        Raises TimeoutError after `timeout` seconds.
        """
        async with asyncio.timeout(timeout), self._received:
            await self._received.wait_for(lambda: len(self.requests) >= n)
        return list(self.requests)

    async def _start(self) -> None:
        self._local = LocalServer(self._app(), port=self._port, log_level=self._log_level)
        await self._local.start()

    async def _stop(self) -> None:
        self._stopping.set()  # releases hanging and delayed replies
        if self._local is not None:
            await self._local.stop()

    def _app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/v1/audio/transcriptions", self._transcribe, methods=["POST"]),
            ]
        )

    async def _transcribe(self, request: Request) -> Response:
        """OpenAI's transcription endpoint: a multipart form with `file` and `model`."""
        async with request.form() as form:
            upload = form.get("file")
            if upload is None or isinstance(upload, str):
                return JSONResponse(_error_body(400, "no file"), status_code=400)
            language = form.get("language")
            self.transcriptions.append(
                Transcription(
                    model=str(form.get("model") or ""),
                    filename=upload.filename or "",
                    content_type=upload.content_type or "",
                    content=await upload.read(),
                    language=language if isinstance(language, str) else None,
                )
            )
        if self.transcription_status != 200:
            status = self.transcription_status
            return JSONResponse(_error_body(status), status_code=status)
        return JSONResponse({"text": self.transcript})

    async def _models(self, request: Request) -> Response:
        self.model_listings += 1
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": self.model, "object": "model", "created": 0, "owned_by": "herald-tests"}
                ],
            }
        )

    async def _chat(self, request: Request) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError:
            return JSONResponse(_error_body(400, "request body is not JSON"), status_code=400)
        if not isinstance(body, dict):
            return JSONResponse(_error_body(400, "request body is not an object"), status_code=400)
        async with self._received:
            self.requests.append(body)
            self.headers.append(dict(request.headers))
            self._received.notify_all()
        reply = self._script.popleft() if self._script else self.responder(body)

        headers: dict[str, str] = {}
        if reply.retry_after is not None:
            headers["retry-after"] = f"{reply.retry_after:g}"
        if reply.gate is not None:
            opened = asyncio.create_task(reply.gate.wait())
            stopping = asyncio.create_task(self._stopping.wait())
            try:
                await asyncio.wait({opened, stopping}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                opened.cancel()
                stopping.cancel()
                await asyncio.gather(opened, stopping, return_exceptions=True)
        if reply.hang or reply.delay > 0:
            left = await self._pause(request, None if reply.hang else reply.delay)
            if left or reply.hang:
                return JSONResponse(_error_body(503, "fake LLM stopped"), status_code=503)
        if reply.status != 200:
            said = reply.error
            if said is not None:
                token = request.headers.get("authorization", "").partition(" ")[2]
                said = said.replace("{key}", token)
            return JSONResponse(
                _error_body(reply.status, said), status_code=reply.status, headers=headers
            )

        calls = [self._tool_call(name, arguments) for name, arguments in reply.tool_calls]
        prompt, completion = reply.usage or (
            _estimate(len(raw)),
            _estimate(len(reply.text) + sum(len(c["function"]["arguments"]) for c in calls)),
        )
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        finish = "tool_calls" if calls else "stop"
        model = str(body.get("model") or self.model)
        completion_id = f"chatcmpl-{len(self.requests)}"
        created = int(time.time())
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
            if calls:
                message["tool_calls"] = calls
            return JSONResponse(
                {
                    "id": completion_id,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
                    ],
                    "usage": usage,
                },
                headers=headers,
            )

        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))

        def chunk(delta: dict[str, Any] | None, finish_reason: str | None = None) -> bytes:
            data: dict[str, Any] = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": []
                if delta is None
                else [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            }
            if include_usage:
                data["usage"] = usage if delta is None else None
            return f"data: {json.dumps(data)}\n\n".encode()

        async def events() -> AsyncIterator[bytes]:
            pieces: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
            pieces += [{"content": text} for text in _split(reply.text, reply.chunks)]
            for index, call in enumerate(calls):
                arguments = call["function"]["arguments"]
                half = len(arguments) // 2
                head = {**call, "index": index, "function": {"name": call["function"]["name"]}}
                head["function"]["arguments"] = arguments[:half]
                pieces.append({"tool_calls": [head]})
                tail = {"index": index, "function": {"arguments": arguments[half:]}}
                pieces.append({"tool_calls": [tail]})
            for i, delta in enumerate(pieces):
                if i > 1 and reply.chunk_delay > 0:  # the role chunk and the first go together
                    await self._sleep(reply.chunk_delay)
                yield chunk(delta)
            yield chunk({}, finish)
            if include_usage:
                yield chunk(None)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    def _tool_call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        self._call_ids += 1
        return {
            "id": f"call_{self._call_ids}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }

    async def _sleep(self, seconds: float) -> None:
        """Sleep, cut short when the server stops."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stopping.wait()

    async def _pause(self, request: Request, seconds: float | None) -> bool:
        """Wait `seconds` (None: forever) or until the server stops; True if the client left."""
        left = asyncio.create_task(client_left(request))
        stopping = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait(
                {left, stopping}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            left.cancel()
            stopping.cancel()
            await asyncio.gather(left, stopping, return_exceptions=True)
        gone = left.done() and not left.cancelled()
        self.abandoned += gone
        return gone


async def _main(port: int, delay: float) -> None:
    async with FakeLLM(port=port, log_level="info") as llm:
        if delay > 0:
            llm.responder = lambda body: dataclasses.replace(you_said(body), delay=delay)
        print(f"fake LLM serving {llm.base_url}", flush=True)
        await until_signalled()


def main(argv: list[str] | None = None) -> None:
    """Serve the default responder on `--port` until SIGINT or SIGTERM."""
    parser = standalone.parser("tests.fakes.llm", __doc__)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each reply")
    args = parser.parse_args(argv)
    standalone.run(_main(args.port, args.delay), logging.INFO)


if __name__ == "__main__":
    main()
