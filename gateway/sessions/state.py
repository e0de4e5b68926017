"""What a session lane holds in memory: the turn it runs now and its steer buffer.

Everything durable (the queue, the outcomes) is in SQL; this is only the running state of
one process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from agent_core.loop import Steered
from gateway.cluster.lanes import Claim
from gateway.contracts.ids import InboxId, TurnId
from gateway.turns import TurnFailure

INTERRUPTED_BY_NEWER = "interrupted by a newer message"


PrepareSteer = Callable[[InboxId, str], Awaitable[str | None]]
"""Makes a steer message with files ready to inject: its voice notes transcribed, its files
named. Returns the text to inject, or None when the message was settled instead (a voice
note that could not be heard and says nothing else)."""


@dataclass(frozen=True, slots=True)
class Speaker:
    """Who wrote a message steered into a turn."""

    sender: str
    """`platform:id`."""
    operator: bool
    """Whether they operate Herald (the turn keeps operator rights only if so)."""
    name: str | None = None
    """Shown as `[name]` before their words in a group, as in a turn's own messages; None
    in a direct chat."""


class Steer:
    """The steer buffer of a running turn (the loop's SteerSource)."""

    def __init__(self, prepare: PrepareSteer | None = None) -> None:
        self.waiting: list[tuple[InboxId, str]] = []
        self.taken: list[InboxId] = []
        self.prepare = prepare
        self.with_files: set[InboxId] = set()
        """Waiting messages that carry files: `prepare` reads them from the inbox."""
        self.speakers: dict[InboxId, Speaker] = {}

    def add(self, row_id: InboxId, text: str, *, speaker: Speaker, files: bool = False) -> None:
        """Queue a message of `speaker` for injection at the next boundary."""
        self.waiting.append((row_id, text))
        self.speakers[row_id] = speaker
        if files:
            self.with_files.add(row_id)

    async def take(self) -> list[Steered]:
        """The messages waiting to be injected, each with its writer (and `[name]` in a
        group); they count as taken from now on (but those `prepare` settled instead).
        Cancelled meanwhile, the rest stay waiting."""
        waiting, self.waiting = self.waiting, []
        texts: list[Steered] = []
        for n, (row_id, text) in enumerate(waiting):
            ready: str | None = text
            if row_id in self.with_files and self.prepare is not None:
                try:
                    ready = await self.prepare(row_id, text)
                except BaseException:
                    self.waiting[:0] = waiting[n:]
                    raise
                self.with_files.discard(row_id)
            if ready is not None:
                self.taken.append(row_id)
                who = self.speakers[row_id]
                shown = ready if who.name is None else f"[{who.name}] {ready}"
                texts.append(Steered(shown, who.sender, who.operator))
        return texts


@dataclass
class Running:
    """The turn a lane is running now."""

    turn_id: TurnId
    ids: list[InboxId]
    started: float
    steer: Steer = field(default_factory=Steer)
    task: asyncio.Task[TurnFailure | None] | None = None
    cancel_reason: str | None = None
    finishing: bool = False
    profile: str = "default"
    """The profile whose agent runs the turn: a message of a chat bound to another profile
    since is never steered into it."""

    def cancel(self, reason: str) -> bool:
        """Cancel the agent's work unless its result is already being stored.

        Before the work has started, it is cancelled as soon as it starts.
        """
        if self.finishing or (self.task is not None and self.task.done()):
            return False
        self.cancel_reason = self.cancel_reason or reason
        if self.task is not None:
            self.task.cancel()
        return True


@dataclass
class Lane:
    """One session's lane in this process: at most one turn at a time."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    users: int = 0
    """HTTP API turns waiting for or holding the lock."""
    worker: asyncio.Task[None] | None = None
    running: Running | None = None
    claim: Claim | None = None
    """This instance's hold on the session (several instances share the database)."""
    claiming: asyncio.Lock = field(default_factory=asyncio.Lock)
    retries: int = 0
    """Tries in a row that failed because the model was unreachable (for the backoff)."""
    retry_in: float = 0.0
    """Seconds to wait before the next try, after such a failure; 0 when none."""
    told_outage: bool = False
    """Whether this session's sender was told of the outage that is going on."""
    stops: int = 0
    """/stop and /new requests seen; a turn that failed for an unreachable model while one
    came drops its messages instead of trying them again."""
    drained: bool = False
    """The last turn's settlement found no message of the session waiting: unless woken since,
    the lane's worker lets go without looking again."""
    batch_stops: int = 0
    """`stops` when the lane last read its waiting rows: a turn whose rows were read before a
    /stop or /new read them again (/new may have made them new to the next conversation)."""
    settling: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while a turn decides and stores its outcome, and while /stop or /new runs."""
