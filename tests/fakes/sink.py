"""Running an adapter's receive loop in a test: an inbox stand-in and the helpers around it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Protocol

from gateway.contracts.adapter import Adapter
from gateway.contracts.messages import InboundMessage, Reaction

WAIT = 10.0
"""Upper bound of every wait for a condition."""


class ListSink:
    """An inbox stand-in: records accepted messages; can hold `accept` or make it fail."""

    def __init__(self, *, fail_on: Callable[[InboundMessage], bool] | None = None) -> None:
        self.messages: list[InboundMessage] = []
        self.accepting: list[InboundMessage] = []
        """Every message `accept` was called with, in call order (failed ones included)."""
        self.gate = asyncio.Event()
        """`accept` waits for this before storing; set by default."""
        self.gate.set()
        self.fail_on = fail_on
        self.reactions: list[Reaction] = []
        """Every reaction passed on (a `ReactionSink`)."""
        self._changed = asyncio.Condition()

    async def react(self, reaction: Reaction) -> None:
        async with self._changed:
            self.reactions.append(reaction)
            self._changed.notify_all()

    async def accept(self, message: InboundMessage) -> None:
        async with self._changed:
            self.accepting.append(message)
            self._changed.notify_all()
        await self.gate.wait()
        if self.fail_on is not None and self.fail_on(message):
            raise RuntimeError(f"inbox unavailable for {message.platform_message_id}")
        async with self._changed:
            self.messages.append(message)
            self._changed.notify_all()

    async def until(self, predicate: Callable[[], bool]) -> None:
        """Return once `predicate()` holds; TimeoutError after `WAIT` seconds."""
        async with asyncio.timeout(WAIT), self._changed:
            await self._changed.wait_for(predicate)

    async def until_stored(self, count: int) -> None:
        """Return once `count` messages are stored; TimeoutError after `WAIT` seconds."""
        await self.until(lambda: len(self.messages) >= count)

    @property
    def texts(self) -> list[str]:
        return [m.text for m in self.messages]


class Fake(Protocol):
    """A fake platform whose state a test can wait on."""

    async def wait_for(self, condition: Callable[[], bool], timeout: float = ...) -> None: ...


@contextlib.asynccontextmanager
async def receiving(adapter: Adapter, sink: ListSink) -> AsyncIterator[asyncio.Task[None]]:
    """Run the receive loop for the block; cancel it after (its own error propagates)."""
    task = asyncio.create_task(adapter.run(sink))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def run_until_error(adapter: Adapter, sink: ListSink) -> None:
    """Run the receive loop until it raises (TimeoutError after `WAIT` seconds)."""
    async with asyncio.timeout(WAIT):
        await adapter.run(sink)


async def until_or_ended(
    fake: Fake, task: asyncio.Task[None], condition: Callable[[], bool]
) -> None:
    """Wait until `condition()` holds; if the receive loop ends first, raise its error."""
    waiter = asyncio.ensure_future(fake.wait_for(condition, WAIT))
    try:
        await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not waiter.done():
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
    if condition():
        return
    if task.done():
        await task
        raise AssertionError("the receive loop ended without an error")
    waiter.result()  # TimeoutError


@contextlib.contextmanager
def refusing_socket() -> Iterator[str]:
    """The URL of a port that is bound but not listening: connections are refused."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{closed.getsockname()[1]}"
