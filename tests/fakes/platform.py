"""An in-process fake platform adapter and a gated LLM: the seams of the message path.

`RecordingAdapter` implements the adapter protocol (send, edit, typing) and records every
call; faults are switched on per chat. `GatedLLM` is an LLM provider whose calls wait until
the test opens the gate of the text they answer, so a test can hold a turn "busy" for as
long as it needs without sleeping.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from adapters.loopback import PLATFORM as TEST
from agent_core.llm import Completion, TokenCallback, Usage
from gateway.contracts.adapter import AdapterState, InboundSink
from gateway.contracts.errors import (
    MarkupRejected,
    NotReady,
    PermanentSendError,
    RateLimited,
)
from gateway.contracts.history import ChatMessage, Role, ToolCall
from gateway.contracts.ids import (
    AccountId,
    ChatId,
    ExternalUserId,
    PlatformMessageId,
    ThreadId,
)
from gateway.contracts.messages import (
    DeliveryReceipt,
    InboundMessage,
    OutboundMessage,
    Sender,
    SendLimits,
    TextFormat,
)


@dataclass(frozen=True, slots=True)
class Delivered:
    """One successful send or edit, as the platform saw it."""

    chat_id: str
    text: str
    key: str
    message_id: str
    recovered: bool = False
    edit_of: str | None = None
    format: TextFormat = TextFormat.MARKDOWN
    thread_id: str | None = None


@dataclass
class _Faults:
    rate_limit: dict[str, list[float]] = field(default_factory=dict)
    fail: dict[str, int] = field(default_factory=dict)
    blocked: set[str] = field(default_factory=set)
    markup_marker: str | None = None


class RecordingAdapter:
    """A platform account that records what Herald sends; faults per chat on demand."""

    platform = TEST

    def __init__(
        self,
        account: str = "acct",
        limits: SendLimits | None = None,
    ) -> None:
        self.account = AccountId(account)
        self.limits = limits or SendLimits(max_chunk=200, min_edit_interval=0.0)
        self.delivered: list[Delivered] = []
        self.typing_calls: list[str] = []
        self.attempts: list[tuple[str, str]] = []
        """(chat, idempotency key) of every send or edit call, failed ones included."""
        self.faults = _Faults()
        self._ids = itertools.count(1)
        self._texts: dict[str, str] = {}
        self.changed = asyncio.Condition()

    # faults ------------------------------------------------------------------------------------

    def rate_limit(self, chat: str, retry_after: float, times: int = 1) -> None:
        """The next `times` sends to `chat` answer 429 with `retry_after`."""
        self.faults.rate_limit.setdefault(chat, []).extend([retry_after] * times)

    def fail(self, chat: str, times: int = 1) -> None:
        """The next `times` sends to `chat` fail transiently (NotReady)."""
        self.faults.fail[chat] = self.faults.fail.get(chat, 0) + times

    def block(self, chat: str) -> None:
        """Every send to `chat` fails permanently (the user blocked the bot)."""
        self.faults.blocked.add(chat)

    def reject_markup(self, marker: str) -> None:
        """Markdown sends containing `marker` are refused as bad markup (plain passes)."""
        self.faults.markup_marker = marker

    # adapter protocol --------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def run(self, sink: InboundSink) -> None:
        await asyncio.Event().wait()

    def liveness(self) -> AdapterState:
        return AdapterState.RECEIVING

    async def send(self, message: OutboundMessage) -> DeliveryReceipt:
        return await self._deliver(message, None)

    async def edit(self, target: PlatformMessageId, message: OutboundMessage) -> DeliveryReceipt:
        if target not in self._texts:
            raise PermanentSendError(f"message {target} not found")
        return await self._deliver(message, target)

    async def typing(self, chat_id: ChatId, thread_id: ThreadId | None) -> None:
        self.typing_calls.append(chat_id)

    async def _deliver(
        self, message: OutboundMessage, edit_of: PlatformMessageId | None
    ) -> DeliveryReceipt:
        chat = message.chat_id
        self.attempts.append((chat, message.idempotency_key))
        waits = self.faults.rate_limit.get(chat)
        if waits:
            raise RateLimited(waits.pop(0))
        if self.faults.fail.get(chat, 0) > 0:
            self.faults.fail[chat] -= 1
            raise NotReady("fake platform: 502 bad gateway")
        if chat in self.faults.blocked:
            raise PermanentSendError("Forbidden: bot was blocked by the user")
        marker = self.faults.markup_marker
        if marker and message.format is TextFormat.MARKDOWN and marker in message.text:
            raise MarkupRejected("Bad Request: can't parse entities")
        message_id = edit_of or str(next(self._ids))
        self._texts[message_id] = message.text
        async with self.changed:
            self.delivered.append(
                Delivered(
                    chat_id=chat,
                    text=message.text,
                    key=message.idempotency_key,
                    message_id=message_id,
                    recovered=message.recovered,
                    edit_of=edit_of,
                    format=message.format,
                    thread_id=message.thread_id,
                )
            )
            self.changed.notify_all()
        return DeliveryReceipt(PlatformMessageId(message_id))

    # inspection --------------------------------------------------------------------------------

    def text_of(self, message_id: str) -> str:
        """The current text of a sent message (after edits)."""
        return self._texts[message_id]

    def texts(self, chat: str) -> list[str]:
        """What the chat shows now: each message's latest text, in the order first sent."""
        seen: dict[str, None] = {}
        for d in self.delivered:
            if d.chat_id == chat:
                seen.setdefault(d.message_id, None)
        return [self._texts[m] for m in seen]

    async def wait_for(self, predicate: Any, timeout: float = 10.0) -> list[Delivered]:
        """Wait until `predicate(delivered)` is true; return the deliveries so far."""
        async with asyncio.timeout(timeout), self.changed:
            await self.changed.wait_for(lambda: bool(predicate(self.delivered)))
        return list(self.delivered)


def inbound(
    text: str,
    *,
    chat: str = "c1",
    sender: str | None = None,
    name: str = "",
    direct: bool = True,
    message_id: str | None = None,
    thread: str | None = None,
    account: str = "acct",
    is_bot: bool = False,
    counter: itertools.count[int] = itertools.count(1),  # noqa: B008 - a shared id source
) -> InboundMessage:
    """An inbound message on the fake platform (ids unique unless `message_id` is given)."""
    return InboundMessage(
        platform=TEST,
        account=AccountId(account),
        chat_id=ChatId(chat),
        sender=Sender(ExternalUserId(sender or chat), name, is_bot),
        text=text,
        platform_message_id=PlatformMessageId(message_id or f"in-{next(counter)}"),
        is_direct=direct,
        thread_id=None if thread is None else ThreadId(thread),
    )


class GatedLLM:
    """An LLM whose call for a user text waits until `release(text)` (or `open_all`).

    It answers `answer to <text>`; texts starting with `tool:` first ask for the `echo` tool
    (so a turn has a tool boundary, where steering happens).
    """

    name = "gated"
    model = "gated"

    def __init__(self, *, gated: bool = True) -> None:
        self.gated = gated
        self.gates: dict[str, asyncio.Event] = {}
        self.calls: list[list[ChatMessage]] = []
        self.started: list[str] = []
        self.changed = asyncio.Condition()

    def gate(self, text: str) -> asyncio.Event:
        """The gate of calls answering `text`."""
        return self.gates.setdefault(text, asyncio.Event())

    def release(self, *texts: str) -> None:
        """Let the calls answering these texts finish."""
        for text in texts:
            self.gate(text).set()

    def open_all(self) -> None:
        """No more waiting, now or later."""
        self.gated = False
        for gate in self.gates.values():
            gate.set()

    async def wait_started(self, text: str, timeout: float = 10.0) -> None:
        """Wait until a call answering `text` has started."""
        async with asyncio.timeout(timeout), self.changed:
            await self.changed.wait_for(lambda: text in self.started)

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[Mapping[str, Any]] = (),
        on_token: TokenCallback | None = None,
    ) -> Completion:
        last_user = next((m for m in reversed(messages) if m.role is Role.USER), None)
        text = "" if last_user is None else last_user.content
        after_tool = messages[-1].role is Role.TOOL
        async with self.changed:
            self.calls.append(list(messages))
            self.started.append(text)
            self.changed.notify_all()
        if on_token is not None:
            await on_token("thinking ")
        if self.gated:
            await self.gate(text).wait()
        if text.startswith("tool:") and tools and not after_tool:
            return Completion(
                "",
                tool_calls=(ToolCall("call_1", "echo", '{"text": "x"}'),),
                usage=Usage(10, 1),
            )
        return Completion(f"answer to {text}", usage=Usage(10, 2))

    async def check(self) -> str:
        return "gated"

    async def aclose(self) -> None:
        return None
