"""The language-model provider protocol, the OpenAI-compatible client, and the offline echo.

Providers turn a prompt into one `Completion`. They retry nothing themselves beyond what the
OpenAI SDK does per request (429 / 408 / 409 / 5xx / connection errors, honouring
`Retry-After`); what is left over surfaces as `LLMUnavailable` (retry later) or `LLMRejected`
(fix the configuration).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol

import aiohttp
import openai
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from agent_core.config import LLMConfig
from gateway.contracts.errors import LLMError, LLMRejected, LLMUnavailable
from gateway.contracts.history import ChatMessage, Role, ToolCall

logger = logging.getLogger(__name__)

TokenCallback = Callable[[str], Awaitable[None]]
"""Receives each streamed content delta, in order."""


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens spent by one model call."""

    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class Completion:
    """One answer of the model: text, the tool calls it asked for, and what it cost."""

    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage | None = None
    finish_reason: str | None = None


class LLMProvider(Protocol):
    """A chat model. Stateless between calls; `aclose` once when done."""

    name: str
    """`openai` or `echo`."""
    model: str

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[Mapping[str, Any]] = (),
        on_token: TokenCallback | None = None,
    ) -> Completion:
        """One model call. Streams content deltas to on_token when given.

        Raises LLMUnavailable (retry later) or LLMRejected (fix config).
        """
        ...

    async def check(self) -> str:
        """Reachability check for `herald doctor`; returns a one-line description.

        Raises LLMUnavailable or LLMRejected.
        """
        ...

    async def aclose(self) -> None:
        """Release connections. The provider is not usable afterwards."""
        ...


NOT_LISTED = "not listed"
"""What `OpenAIProvider.check` says of a model the endpoint's `/models` does not list."""


class OpenAIProvider:
    """Any OpenAI-compatible chat-completions endpoint, through `openai.AsyncOpenAI`."""

    def __init__(self, config: LLMConfig) -> None:
        self.name = "openai"
        self.model = config.model
        self._temperature = config.temperature
        key = config.api_key.get_secret_value() if config.api_key is not None else ""
        self._client = openai.AsyncOpenAI(
            base_url=config.base_url,
            # Local servers (llama.cpp, vLLM, Ollama) accept any key; the SDK demands one.
            api_key=key or "not-needed",
            timeout=openai.Timeout(config.request_timeout, connect=config.connect_timeout),
            max_retries=config.max_retries,
            # The SDK's aiohttp transport: on a bare route, about 2 ms of CPU per call instead
            # of 3.6 with its httpx one; same errors, retries and timeouts.
            http_client=openai.DefaultAioHttpClient(),
        )

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[Mapping[str, Any]] = (),
        on_token: TokenCallback | None = None,
    ) -> Completion:
        """One chat completion, streamed when `on_token` is given. See `LLMProvider.complete`."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [m.to_openai() for m in messages],
        }
        if tools:
            body["tools"] = [dict(t) for t in tools]
        if self._temperature is not None:
            body["temperature"] = self._temperature
        logger.debug(
            "model call: %s, %d messages, %d tools%s",
            self.model,
            len(messages),
            len(tools),
            ", streamed" if on_token is not None else "",
        )
        try:
            # The SDK's own `post`: `chat.completions.create` would first walk every message
            # against the SDK's TypedDicts (milliseconds per call with a long history)
            # to produce the same JSON. Retries, timeouts, auth and errors are the SDK's.
            if on_token is None:
                response = await self._client.post(
                    "/chat/completions",
                    cast_to=ChatCompletion,
                    body=body,
                    options=_request_options(),
                )
                return _from_response(response)
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
            stream = await self._client.post(
                "/chat/completions",
                cast_to=ChatCompletion,
                body=body,
                options=_request_options(),
                stream=True,
                stream_cls=openai.AsyncStream[ChatCompletionChunk],
            )
            accumulator = _StreamAccumulator()
            async with stream:
                async for chunk in stream:
                    delta = accumulator.add(chunk)
                    if delta:
                        await on_token(delta)
            return accumulator.result()
        except openai.OpenAIError as err:
            raise _map_error(err) from err

    async def check(self) -> str:
        """List the endpoint's models; describe the endpoint and whether our model is there."""
        try:
            page = await self._client.models.list()
        except openai.OpenAIError as err:
            raise _map_error(err) from err
        ids = [m.id for m in page.data]
        where = str(self._client.base_url)
        listed = "listed" if self.model in ids else NOT_LISTED
        return f"{where} reachable: {len(ids)} models, {self.model!r} {listed}"

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        await self._client.close()


class EchoProvider:
    """The offline provider: answers `echo: <last user message>`, never calls tools."""

    def __init__(self, model: str = "echo") -> None:
        self.name = "echo"
        self.model = model

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[Mapping[str, Any]] = (),
        on_token: TokenCallback | None = None,
    ) -> Completion:
        """Echo the last user message, streamed word by word to `on_token` when given."""
        last = next((m.content for m in reversed(messages) if m.role is Role.USER), "")
        content = f"echo: {last}"
        if on_token is not None:
            for word in _words(content):
                await on_token(word)
        prompt_chars = sum(len(m.content) for m in messages)
        usage = Usage(_estimate_tokens(prompt_chars), _estimate_tokens(len(content)))
        return Completion(content=content, usage=usage, finish_reason="stop")

    async def check(self) -> str:
        """Always reachable."""
        return "offline echo provider (no LLM configured)"

    async def aclose(self) -> None:
        """Nothing to release."""


def make_provider(config: LLMConfig) -> LLMProvider:
    """The provider `config.effective_provider` names."""
    if config.effective_provider == "echo":
        return EchoProvider()
    return OpenAIProvider(config)


def _words(text: str) -> list[str]:
    """`text` split before each word, so the pieces concatenate back to `text`."""
    return [piece for piece in re.split(r"(?<=\s)(?=\S)", text) if piece]


def _estimate_tokens(chars: int) -> int:
    return math.ceil(chars / 4)


def _from_response(response: ChatCompletion) -> Completion:
    if not response.choices:
        raise LLMUnavailable("the model endpoint returned no choices; retry later")
    choice = response.choices[0]
    calls = tuple(
        ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments)
        for c in choice.message.tool_calls or ()
        if c.type == "function"
    )
    return Completion(
        content=choice.message.content or "",
        tool_calls=calls,
        usage=_usage(response.usage),
        finish_reason=choice.finish_reason,
    )


def _usage(usage: CompletionUsage | None) -> Usage | None:
    if usage is None:
        return None
    return Usage(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens)


@dataclass(slots=True)
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _StreamAccumulator:
    """Folds streamed chunks into one `Completion`."""

    content: list[str] = field(default_factory=list)
    calls: dict[int, _PartialCall] = field(default_factory=dict)
    usage: Usage | None = None
    finish_reason: str | None = None

    def add(self, chunk: ChatCompletionChunk) -> str:
        """Take in one chunk; return its content delta ("" when none)."""
        if chunk.usage is not None:
            self.usage = _usage(chunk.usage)
        if not chunk.choices:
            return ""
        choice = chunk.choices[0]
        if choice.finish_reason is not None:
            self.finish_reason = choice.finish_reason
        for delta_call in choice.delta.tool_calls or ():
            call = self.calls.setdefault(delta_call.index, _PartialCall())
            if delta_call.id and not call.id:
                call.id = delta_call.id
            if delta_call.function is not None:
                # Names and arguments may arrive in pieces; the SDK's own accumulator concatenates.
                call.name += delta_call.function.name or ""
                call.arguments.append(delta_call.function.arguments or "")
        text = choice.delta.content or ""
        if text:
            self.content.append(text)
        return text

    def result(self) -> Completion:
        """The completion so far."""
        calls = tuple(
            ToolCall(id=c.id or f"call_{i}", name=c.name, arguments="".join(c.arguments))
            for i, c in sorted(self.calls.items())
        )
        return Completion(
            content="".join(self.content),
            tool_calls=calls,
            usage=self.usage,
            finish_reason=self.finish_reason,
        )


def _retry_after(err: openai.RateLimitError) -> float | None:
    """Seconds from `retry-after-ms` / `retry-after` (numeric forms only), as the SDK reads them."""
    for header, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = err.response.headers.get(header)
        if value is None:
            continue
        try:
            seconds = float(value) / divisor
        except ValueError:
            continue
        if math.isfinite(seconds) and seconds >= 0:
            return seconds
    return None


def _detail(err: openai.APIError) -> str:
    """The server's own error message when it sent one, else the SDK's."""
    if isinstance(err.body, Mapping):
        message = err.body.get("message")
        if isinstance(message, str) and message:
            return message
    return err.message


def _request_options() -> openai.RequestOptions:
    """What `chat.completions.create` adds to each request: the API key as a bearer token."""
    return {"security": {"bearer_auth": True}}


def _connect_failure(err: BaseException) -> BaseException | None:
    """The connection error (refused, unknown host) behind an SDK error, if there is one.

    The SDK's aiohttp transport reports every failed connect as a connect *timeout*.
    """
    cause = err.__cause__
    while cause is not None:
        if isinstance(cause, aiohttp.ClientConnectorError):
            return cause
        cause = cause.__cause__
    return None


def _map_error(err: openai.OpenAIError) -> LLMError:
    """The Herald error for an SDK error that survived the SDK's own retries."""
    refused = _connect_failure(err)
    if isinstance(err, openai.APITimeoutError) and refused is None:
        return LLMUnavailable("the model endpoint timed out; retry later")
    if isinstance(err, openai.APIConnectionError):
        cause = refused or err.__cause__
        detail = f"{type(cause).__name__}: {cause}" if cause is not None else err.message
        return LLMUnavailable(f"cannot reach the model endpoint ({detail}); retry later")
    if isinstance(err, openai.RateLimitError):
        after = _retry_after(err)
        hint = f"retry after {after:g}s" if after is not None else "retry later"
        return LLMUnavailable(f"the model endpoint is rate limiting (429: {_detail(err)}); {hint}")
    if isinstance(err, openai.APIStatusError):
        status = err.status_code
        if status >= 500 or status == 408:
            return LLMUnavailable(
                f"the model endpoint failed ({status}: {_detail(err)}); retry later"
            )
        what = {
            401: "the API key was refused",
            403: "the API key may not use this model",
            404: "unknown model or wrong base_url",
            400: "the request was refused",
        }.get(status, "the request was refused")
        return LLMRejected(f"{what} ({status}: {_detail(err)}); check the llm configuration")
    if isinstance(err, openai.APIError):
        # An error event inside a stream, or a malformed answer: the server's problem.
        return LLMUnavailable(
            f"the model endpoint answered with an error ({_detail(err)}); retry later"
        )
    return LLMRejected(
        f"the OpenAI client refused the request ({err}); check the llm configuration"
    )


class ModelState(StrEnum):
    """What the latest model calls said about the endpoint."""

    UNKNOWN = "unknown"
    """No call yet."""
    OK = "ok"
    UNREACHABLE = "unreachable"
    """Unreachable, overloaded, 5xx or 429 after the SDK's retries: retry later."""
    REJECTED = "rejected"
    """The endpoint refused the key or the request: fix the configuration."""


@dataclass(slots=True)
class ModelHealth:
    """The model endpoint's state as the calls see it, with when it last changed.

    One line is logged per change of state (an outage is logged once, not once per call).
    """

    state: ModelState = ModelState.UNKNOWN
    since: datetime | None = None
    error: str | None = None
    failures: int = 0
    """Calls failed since the last success."""

    def succeeded(self) -> None:
        """A call was answered."""
        if self.state in (ModelState.UNREACHABLE, ModelState.REJECTED):
            logger.warning(
                "the model endpoint answers again (after %d failed call(s) since %s)",
                self.failures,
                self.since.isoformat(timespec="seconds") if self.since else "?",
            )
        if self.state is not ModelState.OK:
            self.state, self.since = ModelState.OK, datetime.now(UTC)
        self.error, self.failures = None, 0

    def failed(self, err: LLMError) -> None:
        """A call failed with `err` (after the SDK's own retries)."""
        state = ModelState.REJECTED if isinstance(err, LLMRejected) else ModelState.UNREACHABLE
        self.failures += 1
        self.error = str(err)
        if state is not self.state:
            self.state, self.since = state, datetime.now(UTC)
            if state is ModelState.REJECTED:
                logger.error("the model endpoint refuses Herald's requests: %s", err)
            else:
                logger.error("the model endpoint is unreachable: %s", err)

    def describe(self) -> str:
        """`ok`, or `unreachable since <UTC time>` (for /health and the CLI)."""
        if self.since is None or self.state in (ModelState.OK, ModelState.UNKNOWN):
            return str(self.state)
        return f"{self.state} since {self.since.isoformat(timespec='seconds')}"


class ObservedProvider:
    """A provider whose calls update a `ModelHealth` and report each failure's kind
    (`unreachable` or `rejected`) to `on_failure` (a metric), and whose errors pass `redact`
    (an endpoint that echoes the key in its error body must not put it in the turn's error,
    `/health` or the log). Otherwise the same provider."""

    def __init__(
        self,
        inner: LLMProvider,
        health: ModelHealth,
        on_failure: Callable[[str], None] = lambda _: None,
        *,
        redact: Callable[[str], str] = lambda text: text,
    ) -> None:
        self.inner = inner
        self.health = health
        self.on_failure = on_failure
        self.redact = redact
        self.name = inner.name
        self.model = inner.model

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[Mapping[str, Any]] = (),
        on_token: TokenCallback | None = None,
    ) -> Completion:
        """See `LLMProvider.complete`."""
        try:
            completion = await self.inner.complete(messages, tools=tools, on_token=on_token)
        except LLMError as err:
            clean = self._redacted(err)
            self.health.failed(clean)
            self.on_failure(
                str(ModelState.REJECTED if isinstance(err, LLMRejected) else ModelState.UNREACHABLE)
            )
            if clean is err:
                raise
            raise clean from None  # the SDK's error below it carries the echoed secret
        self.health.succeeded()
        return completion

    def _redacted(self, err: LLMError) -> LLMError:
        """`err`, or one of its class whose message has the secrets taken out."""
        text = str(err)
        clean = self.redact(text)
        return err if clean == text else type(err)(clean)

    async def check(self) -> str:
        """See `LLMProvider.check`."""
        try:
            return await self.inner.check()
        except LLMError as err:
            clean = self._redacted(err)
            if clean is err:
                raise
            raise clean from None

    async def aclose(self) -> None:
        """See `LLMProvider.aclose`."""
        await self.inner.aclose()
