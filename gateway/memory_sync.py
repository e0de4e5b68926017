"""The external memory provider's writes: queued in SQL with the turn, sent in order.

`SyncQueue` is what the turns use: in the turn's own transaction it writes one row per
finished turn of a person (never for a group, a stateless call or an unknown sender), and
wakes the sender after the commit. `SyncSender` (a child of the supervisor's TaskGroup, on
one instance of a cluster at a time: the `memory-sync` lease) sends each person's rows in
order, one at a time per person, retrying with backoff (honouring `retry_after`) while the
provider is down or rate-limited, and gives a row up (kept as dead) only once it is older
than `memory.sync_max_age`. A row is deleted only after the provider took it, so a restart or
a SIGKILL loses nothing (a kill between the two sends that one row again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import unquote

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_core.memory import MemoryOwner
from agent_core.memory_providers import registry
from agent_core.memory_providers.base import (
    MemoryProvider,
    MemoryProviderError,
    Speaker,
    SyncedMessage,
    SyncedTurn,
)
from agent_core.memory_providers.recall import MemoryHealth, MemoryRecall
from gateway.backoff import Backoff
from gateway.config import MemoryConfig
from gateway.contracts.errors import ConfigError
from gateway.contracts.history import ChatMessage, Role, SessionInfo
from gateway.contracts.ids import TurnId, UserId
from gateway.contracts.messages import utcnow
from gateway.metrics import Metrics
from gateway.store import Store
from gateway.store import memory_sync as sql
from gateway.store.memory_sync import SyncCounts, SyncKind, SyncRow

logger = logging.getLogger(__name__)


def exchange(
    messages: Sequence[ChatMessage], redact: Callable[[str], str] = lambda text: text
) -> list[dict[str, str]]:
    """The person's and the agent's words of a turn (tool calls and results left out), each
    passed through `redact`."""
    out: list[dict[str, str]] = []
    for m in messages:
        if not m.content.strip() or m.interrupted:
            continue
        if m.role is Role.USER:
            out.append({"speaker": str(Speaker.PERSON), "content": redact(m.content)})
        elif m.role is Role.ASSISTANT:
            out.append({"speaker": str(Speaker.AGENT), "content": redact(m.content)})
    return out


class SyncQueue:
    """Writes syncs in the caller's transaction; `wake` tells the sender after the commit.
    What is queued for the provider has passed `redact` (no configured secret leaves)."""

    def __init__(
        self,
        wake: Callable[[], None] = lambda: None,
        *,
        redact: Callable[[str], str] = lambda text: text,
    ) -> None:
        self.wake = wake
        self.redact = redact

    async def turn(
        self,
        conn: AsyncConnection,
        session: SessionInfo,
        turn_id: TurnId,
        messages: Sequence[ChatMessage],
    ) -> bool:
        """Queue a finished turn of `session`; False (nothing queued) when the session
        belongs to no person, is in a group (`session.group`, one person's session there
        too) or the turn has no words to sync."""
        if session.user_id is None or session.group:
            return False
        words = exchange(messages, self.redact)
        if not words:
            return False
        await sql.enqueue(
            conn,
            session.user_id,
            SyncKind.TURN,
            {"messages": words},
            session_key=session.key,
            session_id=session.id,
            turn_id=turn_id,
        )
        return True

    async def session_end(self, conn: AsyncConnection, session: SessionInfo) -> bool:
        """Queue the end of a person's session (`/new`, `/reset`)."""
        if session.user_id is None:
            return False
        await sql.enqueue(
            conn,
            session.user_id,
            SyncKind.SESSION_END,
            {},
            session_key=session.key,
            session_id=session.id,
        )
        return True


def person_of(owner: MemoryOwner) -> UserId | None:
    """The person whose memory files `owner` names (None for a group's)."""
    return UserId(unquote(owner[2:])) if owner.startswith("u-") else None


class MemoryWrites:
    """Mirrors edits of a person's memory files to the provider, through the queue."""

    def __init__(self, store: Store, queue: SyncQueue) -> None:
        self.store = store
        self.queue = queue

    async def __call__(self, owner: MemoryOwner, target: str, action: str, content: str) -> None:
        """Queue the edit (a group's edits are not mirrored)."""
        person = person_of(owner)
        if person is None:
            return
        async with self.store.write() as conn:
            await sql.enqueue(
                conn,
                person,
                SyncKind.MEMORY_WRITE,
                {"target": target, "action": action, "content": self.queue.redact(content)},
                session_key="",
            )
        self.queue.wake()


@dataclass
class SyncStatus:
    """What the sender last saw (for `/health`)."""

    counts: SyncCounts = field(default_factory=lambda: SyncCounts(0, 0, None))
    sent: int = 0


class SyncSender:
    """Sends queued syncs to the provider until cancelled."""

    def __init__(
        self,
        store: Store,
        provider: MemoryProvider,
        health: MemoryHealth,
        *,
        max_age: float,
        timeout: float = 30.0,
        backoff: Backoff = Backoff(initial=1.0, maximum=300.0),
        poll: float = 5.0,
        concurrency: int = 8,
        on_result: Callable[[str], None] = lambda _: None,
        redact: Callable[[str], str] = lambda text: text,
    ) -> None:
        """`on_result(outcome)`: `sent`, `retried` or `dead`, for each try (a metric);
        `redact`: what a failure's error is stored and logged as."""
        self.redact = redact
        self.store = store
        self.provider = provider
        self.health = health
        self.max_age = max_age
        self.timeout = timeout
        self.backoff = backoff
        self.poll = poll
        self.slots = asyncio.Semaphore(concurrency)
        self.on_result = on_result
        self.status = SyncStatus()
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """New rows were committed: look at the queue now."""
        self._wake.set()

    async def run(self) -> None:
        """Send until cancelled. A store error is logged and the loop goes on."""
        while True:
            self._wake.clear()
            try:
                await self.pass_once()
                async with self.store.read() as conn:
                    due = await sql.next_due(conn)
                    self.status.counts = await sql.counts(conn)
            except Exception:
                logger.exception("memory sync: the queue could not be read; trying again")
                due = None
            wait = self.poll
            if due is not None:
                wait = min(wait, max(0.0, (due - utcnow()).total_seconds()))
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._wake.wait()

    async def pass_once(self) -> int:
        """Try every person's due head once (people in parallel); how many were sent."""
        sent = 0
        while True:
            async with self.store.read() as conn:
                rows = await sql.heads(conn, utcnow())
            if not rows:
                return sent
            results = await asyncio.gather(*(self._one(r) for r in rows))
            done = sum(results)
            sent += done
            if not done:
                return sent  # everyone due failed: their heads wait for their backoff

    async def _one(self, row: SyncRow) -> bool:
        async with self.slots:
            async with self.store.write() as conn:
                await sql.sending(conn, row.id)
            try:
                async with asyncio.timeout(self.timeout):
                    await self._send(row)
            except Exception as err:
                await self._failed(row, err)
                return False
        self.health.succeeded()
        async with self.store.write() as conn:
            await sql.sent(conn, row.id)
        self.status.sent += 1
        self.on_result("sent")
        return True

    async def _send(self, row: SyncRow) -> None:
        p = self.provider
        if row.kind is SyncKind.TURN:
            messages = tuple(
                SyncedMessage(Speaker(m["speaker"]), str(m["content"]))
                for m in row.payload.get("messages", ())
            )
            await p.sync_turn(
                SyncedTurn(
                    sync_id=row.id,
                    person=row.person,
                    session_key=row.session_key,
                    session_id=int(row.session_id or 0),
                    messages=messages,
                    at=row.created_at,
                    resent=row.resent,
                )
            )
        elif row.kind is SyncKind.MEMORY_WRITE:
            d = row.payload
            await p.on_memory_write(
                row.person, str(d["target"]), str(d["action"]), str(d["content"])
            )
        else:
            await p.on_session_end(row.person, row.session_key, int(row.session_id or 0))

    async def _failed(self, row: SyncRow, err: Exception) -> None:
        if not isinstance(err, MemoryProviderError | TimeoutError):
            logger.warning("memory sync %d to %s failed", row.id, self.provider.name, exc_info=err)
        self.health.failed(err)
        error = "timed out" if isinstance(err, TimeoutError) else str(err) or type(err).__name__
        error = self.redact(error)
        now = utcnow()
        async with self.store.write() as conn:
            if sql.expired(row, self.max_age, now):
                await sql.give_up(conn, row.id, error)
                logger.error(
                    "memory sync %d (%s of %s) given up after %d tries over %s: %s",
                    row.id,
                    row.kind,
                    row.person,
                    row.attempts + 1,
                    now - row.created_at,
                    error,
                )
                self.on_result("dead")
                return
            delay = self.backoff.delay(row.attempts)
            after = getattr(err, "retry_after", None)
            if isinstance(after, int | float) and after > 0:
                delay = max(delay, float(after))
            await sql.retry(conn, row.id, error, now + timedelta(seconds=delay))
        self.on_result("retried")


def describe_age(when: datetime | None) -> str:
    """`3m 12s` since `when` ("-" for None)."""
    if when is None:
        return "-"
    seconds = int((utcnow() - when).total_seconds())
    minutes, seconds = divmod(max(seconds, 0), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes}m" if hours else f"{minutes}m {seconds}s"


@dataclass
class ExternalMemory:
    """The configured external memory provider and what Herald runs around it."""

    provider: MemoryProvider
    health: MemoryHealth
    recall: MemoryRecall
    queue: SyncQueue
    sender: SyncSender

    def describe(self) -> dict[str, object]:
        """The provider's part of `/health`."""
        counts = self.sender.status.counts
        return {
            "provider": self.provider.name,
            "state": str(self.health.state),
            "detail": self.health.describe(),
            "error": self.health.error,
            "queued": counts.queued,
            "dead": counts.dead,
            "oldest_queued": None
            if counts.oldest_queued is None
            else counts.oldest_queued.isoformat(timespec="seconds"),
        }


def build_provider(config: MemoryConfig, state_dir: Path) -> MemoryProvider | None:
    """The provider `memory.provider` names, not entered (None for `none`). Raises
    ConfigError saying what to fix."""
    try:
        return registry.build(
            config.provider,
            honcho=config.honcho,
            mem0=config.mem0,
            options=config.options,
            state_dir=state_dir,
        )
    except ValueError as err:
        raise ConfigError(f"memory: {err}") from err


async def open_external(
    config: MemoryConfig,
    state_dir: Path,
    store: Store,
    metrics: Metrics,
    stack: AsyncExitStack,
    *,
    redact: Callable[[str], str] = lambda text: text,
) -> ExternalMemory | None:
    """Build and enter the configured provider (closed with `stack`), with its recall, its
    health and its sync queue and sender; None when `memory.provider` is `none`. What is
    synced, and the errors kept, pass `redact`."""
    provider = build_provider(config, state_dir)
    if provider is None:
        return None
    try:
        await stack.enter_async_context(provider)
    except Exception as err:  # entering must not need the service, so this is a setting
        raise ConfigError(
            f"memory.{config.provider}: the provider cannot start: {err}; check its settings"
        ) from err
    health = MemoryHealth(provider.name)
    recall = MemoryRecall(
        provider,
        health,
        timeout=config.recall_timeout,
        on_failure=lambda kind: metrics.memory_recall_failures.labels(kind=kind).inc(),
        on_recall=metrics.memory_recall_seconds.observe,
    )
    sender = SyncSender(
        store,
        provider,
        health,
        max_age=config.sync_max_age,
        timeout=config.sync_timeout,
        backoff=Backoff(initial=config.sync_retry_initial, maximum=config.sync_retry_max),
        on_result=lambda result: metrics.memory_syncs.labels(result=result).inc(),
        redact=redact,
    )
    logger.info("memory provider: %s", provider.name)
    queue = SyncQueue(sender.wake, redact=redact)
    return ExternalMemory(provider, health, recall, queue, sender)
