"""The contract of an external memory provider (Honcho, Mem0, or a third party's).

A provider is long-term memory that learns who a person is across all their sessions and
platforms. Herald runs at most one (`memory.provider`). It calls the provider twice per turn:

- before the model call, `prefetch(person, query)` recalls what is relevant to the new
  message. Herald bounds it by `memory.recall_timeout` and goes on without it on timeout or
  error, so a provider may simply raise; what it returns goes into the user turn inside a
  fenced block (never into the system prompt);
- after the turn, `sync_turn(turn)` stores the exchange. Herald calls it from a durable,
  ordered queue in SQL: in order per person, one call at a time per person, retried with
  backoff while it raises `MemoryUnavailable`, so a provider must not retry for long itself.
  A crash between a provider's success and Herald's record of it sends that turn again
  (`SyncedTurn.resent`), so a provider that can deduplicate should look up
  `SyncedTurn.sync_id` then (the Honcho provider does).

The person is Herald's user id (`UserId`): linked identities across platforms are one user,
so they are one person to the provider. Group chats, stateless API calls and unknown senders
never reach a provider.

Third-party providers: a package declares an entry point in the group
`herald.memory_providers` whose object is a `ProviderFactory`: called with the options under
`memory.options` and Herald's state directory, it returns the provider (not entered yet).
`memory.provider: <entry point name>` selects it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self

from agent_core.tools.base import Tool
from gateway.contracts.ids import UserId


class MemoryProviderError(Exception):
    """A provider call failed. Base of the two kinds below."""


class MemoryUnavailable(MemoryProviderError):
    """The provider could not be reached, timed out, failed (5xx) or is rate-limited: the
    same call may succeed later. `retry_after`: seconds the provider asked to wait (429)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class MemoryRejected(MemoryProviderError):
    """The provider refused the call (bad key, bad request): fix the configuration. Syncs
    are still retried (the operator may fix it) until `memory.sync_max_age`."""


class Speaker(StrEnum):
    """Who said a message of a synced turn."""

    PERSON = "person"
    AGENT = "agent"


@dataclass(frozen=True, slots=True)
class SyncedMessage:
    """One message of a synced exchange (tool calls and results are not synced)."""

    speaker: Speaker
    content: str


@dataclass(frozen=True, slots=True)
class SyncedTurn:
    """One finished turn of a person's session, as the provider stores it."""

    sync_id: int
    """Herald's id of this sync: unique, increasing per person (for deduplication)."""
    person: UserId
    session_key: str
    """Herald's session key (`platform:account:chat[:thread]`, `api:default:<name>`…)."""
    session_id: int
    """The session's id: a new one after `/new` on the same key."""
    messages: tuple[SyncedMessage, ...]
    at: datetime
    """When the turn finished (aware UTC)."""
    resent: bool = False
    """An earlier try may have reached the provider (it timed out or failed, or Herald died
    while it was in flight): a provider that can look `sync_id` up should skip a duplicate."""


class MemoryProvider(ABC):
    """An external long-term memory. Entered once per process (`async with`), then shared by
    every turn and the sync sender; its methods may run concurrently for different people.

    `prefetch` and `sync_turn` must be implemented; the other hooks have do-nothing defaults.
    Every method raises `MemoryUnavailable` (try again later) or `MemoryRejected` (refused);
    anything else it raises is treated like `MemoryUnavailable` and logged as a bug.
    """

    name: str = "provider"
    """Shown in logs, `/health`, `herald memory status` and the recalled block."""

    async def __aenter__(self) -> Self:
        """Open connections. Must not need the provider to be reachable (Herald starts
        during an outage and recalls nothing until it is back)."""
        return self

    async def __aexit__(  # noqa: B027 - optional hook: nothing to close by default
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close connections."""

    @abstractmethod
    async def prefetch(self, person: UserId, query: str, *, session_key: str) -> str:
        """What the provider remembers that is relevant to `query` (the person's new
        message), as plain text for the model; "" when nothing is. Only `person`'s own
        memories, never another person's. Raises MemoryUnavailable, MemoryRejected."""

    @abstractmethod
    async def sync_turn(self, turn: SyncedTurn) -> None:
        """Store one finished exchange of `turn.person`. Returns once the provider has
        accepted it (Herald then forgets the sync). Raises MemoryUnavailable (Herald retries
        later, in order), MemoryRejected."""

    async def ping(self) -> None:  # noqa: B027 - optional hook
        """Check that the provider answers and accepts the credentials (for `herald memory
        status` and `herald doctor`). Raises MemoryUnavailable, MemoryRejected."""

    def system_prompt_block(self) -> str:
        """A static text added to the system prompt of every turn ("" for none). It must not
        change between turns: the prompt cache holds only while the system prompt does."""
        return ""

    def tools(self) -> Sequence[Tool]:
        """Tools the provider gives the agent (none by default). A tool learns the person
        from `ToolContext.user_id` and must refuse when it is None."""
        return ()

    async def on_memory_write(  # noqa: B027 - optional hook
        self, person: UserId, target: str, action: str, content: str
    ) -> None:
        """The agent edited the person's built-in memory file (`target`: `user` for USER.md,
        `memory` for MEMORY.md; `action`: `add`, `replace` or `remove`; `content`: the entry
        written, or removed). Mirror it if the provider wants to. Called from the sync queue,
        in order with the person's turns; raises like `sync_turn`."""

    async def on_session_end(  # noqa: B027 - optional hook
        self, person: UserId, session_key: str, session_id: int
    ) -> None:
        """A session of the person ended (`/new`, `/reset`). Called from the sync queue, in
        order with the person's turns; raises like `sync_turn`."""


class ProviderFactory(Protocol):
    """What a third-party entry point in `herald.memory_providers` is."""

    def __call__(self, options: Mapping[str, Any], state_dir: Path) -> MemoryProvider:
        """Build the provider from `memory.options`; raise ValueError with a message that
        says what to fix when the options are wrong."""
        ...
