"""The store's contracts: what each repository, the lanes and the signal bus promise.

Each protocol below is implemented once or twice in this package (the implementation is
named in its docstring); callers depend on the protocol, tests check the implementations
against it (`tests/contract/test_store_protocols.py`, `test_lanes.py`, `test_bus.py`).

Two shapes of repository:
- functions that take the caller's `AsyncConnection` and work inside its transaction, so
  that one transaction can span several repositories (accept a message, write its notice,
  signal the owner). A module of such functions implements its protocol as a module.
- methods of a class holding the `Store` that open a transaction of their own, for work
  that is complete in one (an operator's command, one chunk's new status).
There is one way to do each write: no method repeats what a function does.

Raises: every call may raise SQLAlchemy's `DBAPIError` (an `OperationalError` when the
database is unreachable, full or read-only; the `Store` records it in `Store.health`). Only
the other exceptions are listed below. Only modules of `gateway/store/` import the tables.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy.ext.asyncio import AsyncConnection

if TYPE_CHECKING:
    from agent_core.skills.model import SkillWrite, WriteStatus
    from gateway.cluster.bus import Handler, Signal
    from gateway.cluster.lanes import Claim, LaneState
    from gateway.contracts.history import (
        ChatMessage,
        History,
        SearchHit,
        SessionInfo,
        TurnResult,
    )
    from gateway.contracts.ids import InboxId, MessageId, SessionId, SessionKey, TurnId, UserId
    from gateway.contracts.messages import InboundMessage
    from gateway.store.approvals import ApprovalRow, ApprovalStatus
    from gateway.store.inbox import InboxRow, Outcome
    from gateway.store.instances import InstanceInfo
    from gateway.store.jobs import Fence, Job, Run
    from gateway.store.leases import LeaseInfo
    from gateway.store.memory_sync import SyncCounts, SyncKind, SyncRow
    from gateway.store.outbox import Chunk, OutboxRow, OutboxStatus, ReportListener
    from gateway.store.pairings import Pairing
    from gateway.store.store import SnapshotFactory


# users and identities ----------------------------------------------------------------------


class UserRepository(Protocol):
    """Herald users and the platform identities linked to them. `Store`."""

    async def resolve_user(self, platform: str, external_id: str, display_name: str = "") -> UserId:
        """The user of `platform:external_id`, created on first sight. Raises RuntimeError
        when concurrent creators kept colliding (three tries)."""
        ...

    async def user_of(self, platform: str, external_id: str) -> UserId | None:
        """The user of `platform:external_id`, or None when it is unknown (creates nothing)."""
        ...

    async def link_identities(
        self, first: tuple[str, str], second: tuple[str, str]
    ) -> tuple[UserId, UserId | None]:
        """Make two identities one user; returns (kept user, merged-away user or None)."""
        ...

    async def identities_of(self, user_id: UserId) -> list[tuple[str, str]]:
        """The (platform, external id) pairs of a user, oldest first ([] when unknown)."""
        ...

    async def list_users(self) -> list[tuple[UserId, str, list[tuple[str, str]]]]:
        """Every user, oldest first: (id, display name, identities)."""
        ...

    async def unlink_identity(self, identity: tuple[str, str]) -> UserId:
        """Detach an identity from its user, making it a user of its own (with the jobs it
        made); returns the user it left. Raises LookupError when the identity is unknown or
        its user's only one."""
        ...


# sessions and transcripts ----------------------------------------------------------------


class SessionRepository(Protocol):
    """Sessions (one per key and epoch). `Store`."""

    async def get_session(self, key: SessionKey | str) -> SessionInfo | None:
        """The current (highest epoch) session of `key`; None when there is none."""
        ...

    async def get_session_by_id(self, session_id: SessionId) -> SessionInfo | None:
        """The session with that id, of any epoch; None when there is none."""
        ...

    async def session_of(
        self, key: SessionKey, identity: tuple[str, str]
    ) -> tuple[SessionInfo | None, bool]:
        """The current session of `key` (None when there is none) and whether the
        (platform, external id) `identity` is one of its user's, from one read transaction."""
        ...

    async def open_session(
        self,
        key: SessionKey,
        *,
        platform: str,
        user_id: UserId | None,
        snapshot: SnapshotFactory,
        new_epoch: bool = False,
        profile: str = "default",
    ) -> SessionInfo:
        """The current session of `key`, created with frozen memory snapshots when there is
        none (always a new epoch with `new_epoch`, or when the current one was answered by
        another `profile`). Raises ValueError when the row cannot be
        created for another reason than a concurrent creator."""
        ...

    async def set_busy_mode(self, key: SessionKey, mode: str | None) -> None:
        """Set (None: clear) the busy mode of the current session of `key`. Raises
        LookupError when `key` has no session."""
        ...

    async def list_sessions(
        self,
        *,
        user_id: UserId | None = None,
        limit: int = 50,
        offset: int = 0,
        profile: str | None = None,
    ) -> list[SessionInfo]:
        """Sessions (of `user_id`, answered by `profile`, when given), most recently active
        first."""
        ...

    async def recent_sessions(
        self, *, user_id: UserId | None, limit: int = 10, profile: str | None = None
    ) -> list[SessionInfo]:
        """The `limit` most recently active sessions of `user_id` (everyone's when None),
        answered by `profile` when given."""
        ...


class SessionWrites(Protocol):
    """Session reads inside the caller's transaction. Module `gateway.store.store`."""

    async def busy_mode_of(self, conn: AsyncConnection, key: SessionKey) -> str | None:
        """The busy mode set on the current session of `key`; None when unset or no session."""
        ...


class TranscriptRepository(Protocol):
    """Turns, messages and summaries of sessions, read in a transaction of their own.
    `Store`."""

    async def turn_status(self, turn_id: TurnId) -> str | None:
        """running, completed, failed or interrupted; None when there is no such turn."""
        ...

    async def interrupt_running_turns(self) -> int:
        """Mark every `running` turn interrupted (a previous process left it); how many."""
        ...

    async def load_history(self, session_id: SessionId, window: int) -> History:
        """The latest summary, at most `window` messages after it (oldest first) and the
        latest turn's token usage, from one read transaction of two statements."""
        ...

    async def save_summary(
        self, session_id: SessionId, upto_message_id: MessageId, content: str
    ) -> None:
        """Record a summary of the session up to `upto_message_id`. Raises IntegrityError
        when the session does not exist."""
        ...

    async def transcript(
        self, session_id: SessionId, *, limit: int = 200, before: MessageId | None = None
    ) -> list[ChatMessage]:
        """Up to `limit` messages of a session (older than `before`), oldest first."""
        ...

    async def messages_around(
        self, message_id: MessageId, *, before: int, after: int
    ) -> list[ChatMessage]:
        """The conversation (user messages, assistant texts) around `message_id`, itself
        included; [] when there is no such message."""
        ...

    async def search_messages(
        self, query: str, *, user_id: UserId | None, limit: int = 10, profile: str | None = None
    ) -> list[SearchHit]:
        """Full-text hits among user and assistant messages (of `user_id`, in sessions
        `profile` answered, when given), best first; [] when the query has no words."""
        ...


class TurnRecords(Protocol):
    """A turn's writes, inside the caller's transaction (with the inbox, outbox and lane
    writes of the same step). Module `gateway.store.store`."""

    async def record_start(
        self, conn: AsyncConnection, session_id: SessionId, user_messages: Sequence[ChatMessage]
    ) -> tuple[TurnId, list[MessageId]]:
        """A running turn and the user messages that started it; returns their ids. Raises
        IntegrityError when the session does not exist, StatementError for a naive
        timestamp."""
        ...

    async def record_finish(
        self, conn: AsyncConnection, session_id: SessionId, turn_id: TurnId, result: TurnResult
    ) -> list[MessageId]:
        """Store the turn's messages and final status; returns the messages' ids. Raises
        IntegrityError when the session does not exist, StatementError for a naive
        timestamp (the caller's transaction then writes nothing)."""
        ...


# settings ----------------------------------------------------------------------------------


class SettingsReader(Protocol):
    """Values set at runtime (the home channel, adapter checkpoints). `Store`."""

    async def get_setting(self, name: str) -> str | None:
        """The value of `name`; None when it was never set."""
        ...


class SettingsWrites(Protocol):
    """Module `gateway.store.store`."""

    async def set_setting(self, conn: AsyncConnection, name: str, value: str) -> None:
        """In the caller's transaction: set `name` (last write wins)."""
        ...


# inbox -------------------------------------------------------------------------------------


class InboxQueue(Protocol):
    """The inbound queue, inside the caller's transaction. Module `gateway.store.inbox`."""

    async def insert(
        self,
        conn: AsyncConnection,
        message: InboundMessage,
        *,
        key: SessionKey,
        user_id: UserId | None,
        text: str | None = None,
        kind: str = "message",
        priority: int = 0,
        steer: bool = False,
        outcome: Outcome | None = None,
        detail: str | None = None,
    ) -> InboxId | None:
        """Store an inbound message; its id, or None when it was already stored (a
        duplicate delivery)."""
        ...

    async def count_waiting(self, conn: AsyncConnection, key: SessionKey) -> int:
        """Messages of the session waiting for a turn (commands and steer rows excluded)."""
        ...

    async def pending(
        self, conn: AsyncConnection, key: SessionKey, *, kind: str = "message"
    ) -> list[InboxRow]:
        """The session's pending rows of `kind`, in the order they are to be handled."""
        ...

    async def take(self, conn: AsyncConnection, ids: Sequence[InboxId], turn_id: TurnId) -> int:
        """pending → running in `turn_id`; how many were still pending."""
        ...

    async def take_command(self, conn: AsyncConnection, inbox_id: InboxId, instance: str) -> bool:
        """pending → running for a command row run by `instance`; False when taken already."""
        ...

    async def settle(
        self,
        conn: AsyncConnection,
        ids: Sequence[InboxId],
        outcome: Outcome,
        *,
        turn_id: TurnId | None = None,
        detail: str | None = None,
        only_pending: bool = False,
    ) -> int:
        """Record the final outcome of rows that have none yet; how many were settled."""
        ...

    async def requeue(
        self,
        conn: AsyncConnection,
        ids: Sequence[InboxId],
        *,
        turn_id: TurnId | None = None,
        refund: bool = False,
    ) -> None:
        """running / steer → plain pending (the turn stopped before answering them)."""
        ...

    async def restore_pending(self, conn: AsyncConnection, key: SessionKey) -> int:
        """Waiting rows an earlier turn stored in the history are stored again by their
        next turn (after `/new`); how many."""
        ...


class InboxReader(Protocol):
    """Recovery and inspection, each in a transaction of its own. `gateway.store.inbox.Inbox`."""

    async def recover(self) -> list[SessionKey]:
        """Rows of turns that never finished go back to pending; the keys with pending rows."""
        ...

    async def get(self, inbox_id: InboxId) -> InboxRow | None:
        """The row with that id; None when there is none."""
        ...

    async def for_session(
        self, key: SessionKey | str, *, limit: int = 200, profile: str | None = None
    ) -> list[InboxRow]:
        """The inbound messages of a session key (every epoch), oldest first. With
        `profile`, not those a turn of another profile took."""
        ...

    async def counts(self) -> dict[str, int]:
        """Rows per outcome (`pending` / `running` for rows without one)."""
        ...

    async def recent(self, *, limit: int = 10) -> list[InboxRow]:
        """The newest inbound messages of every session, newest first."""
        ...

    async def last_received(self) -> dict[str, datetime]:
        """When the newest inbound message of each platform (`platform`) and of each of its
        accounts (`platform:account`) was received (UTC)."""
        ...


# outbox ------------------------------------------------------------------------------------


class OutboxWrites(Protocol):
    """Module `gateway.store.outbox`."""

    async def enqueue(self, conn: AsyncConnection, chunks: Sequence[Chunk]) -> list[int]:
        """In the caller's transaction: write chunks (an existing key is left as it is);
        the new rows' ids."""
        ...


class OutboxRepository(Protocol):
    """The delivery side of the outbox, each method its own transaction.
    `gateway.store.outbox.Outbox`.

    When every chunk of a job run's report is sent or dead, the outbox announces a
    `SettledReport` to its listeners inside that transaction (cron records the run's
    delivery status); it never writes another repository's table."""

    def subscribe(self, listener: ReportListener) -> None:
        """Announce each settled report to `listener` from now on."""
        ...

    async def enqueue(self, chunks: Sequence[Chunk]) -> list[int]:
        """Write chunks in a transaction of their own; the new rows' ids."""
        ...

    async def get(self, row_id: int) -> OutboxRow | None:
        """The row with that id; None when there is none."""
        ...

    async def due_chats(
        self,
        now: datetime,
        *,
        platforms: Sequence[str],
        limit: int,
        away: Sequence[tuple[str, str]] = (),
    ) -> list[tuple[str, str, str]]:
        """Chats with a due chunk and nothing being sent, oldest first (at most `limit`),
        those of the `away` accounts (platform, account) left out."""
        ...

    async def look(
        self,
        now: datetime,
        *,
        platforms: Sequence[str],
        limit: int,
        away: Sequence[tuple[str, str]] = (),
    ) -> tuple[list[tuple[str, str, str]], datetime | None]:
        """`due_chats(now, …)`, and when the earliest pending chunk due after `now` becomes
        due (None: none), in one read."""
        ...

    async def next_due_at(
        self, *, platforms: Sequence[str], away: Sequence[tuple[str, str]] = ()
    ) -> datetime | None:
        """When the earliest pending chunk becomes due (the `away` accounts' left out);
        None when nothing is pending."""
        ...

    async def take(
        self, chat: tuple[str, str, str], *, owner: str, now: datetime, interval: float
    ) -> OutboxRow | float | None:
        """The chat's next chunk, now `sending` for `owner`; a float: seconds to wait for
        the chat's spacing; None: nothing to send now (or another instance sends)."""
        ...

    async def head(self, chat: tuple[str, str, str]) -> OutboxRow | None:
        """The chat's oldest pending chunk; None when there is none."""
        ...

    async def unsent(self, chat: tuple[str, str, str]) -> bool:
        """Whether the chat has chunks pending or being sent."""
        ...

    async def claim(self, row_id: int, owner: str = "") -> bool:
        """pending → sending for `owner`; False when the row is not pending."""
        ...

    async def sent(self, row_id: int, platform_message_id: str | None, at: datetime) -> bool:
        """sending → sent, with the platform's id of the message; whether the chat has other
        chunks not yet sent (read in the same transaction)."""
        ...

    async def retry_at(
        self, row_id: int, when: datetime, error: str, *, attempt: bool = True
    ) -> None:
        """Back to pending, due at `when` (`attempt=False`: the try does not count)."""
        ...

    async def without_edit(self, row_id: int, error: str) -> None:
        """Back to pending, due now, as a new message instead of an edit."""
        ...

    async def as_plain(self, row_id: int, text: str) -> None:
        """Back to pending, due now, as plain `text`."""
        ...

    async def delivery_report(
        self,
        platform: str,
        account: str,
        platform_message_id: str,
        status: str,
        error: str | None = None,
    ) -> bool:
        """Record a platform's later report on a sent chunk; False when no chunk has that
        platform message id."""
        ...

    async def dead(self, row_id: int, reason: str) -> None:
        """A dead letter, never sent automatically again (may announce a settled report)."""
        ...

    async def recover(
        self,
        *,
        max_age: float,
        max_attempts: int,
        owner: str | None = None,
        lease_ttl: float | None = None,
        started: bool = True,
    ) -> tuple[int, int]:
        """Chunks whose send outcome is unknown are resent once or die; returns (to resend,
        dead). Announces the reports the dead ones settle."""
        ...

    async def list(
        self,
        *,
        status: OutboxStatus | None = None,
        session_id: SessionId | None = None,
        limit: int = 50,
    ) -> list[OutboxRow]:
        """Rows, newest first."""
        ...

    async def retry(self, row_id: int) -> OutboxRow:
        """A dead letter back to pending, due now. Raises LookupError when there is no dead
        letter with that id."""
        ...

    async def discard(self, row_id: int) -> OutboxRow:
        """A dead letter becomes discarded (kept, never sent). Raises LookupError when there
        is no dead letter with that id."""
        ...

    async def counts(self) -> dict[str, int]:
        """Rows per status."""
        ...


# jobs and runs -----------------------------------------------------------------------------


class JobRepository(Protocol):
    """Scheduled jobs and their runs, each method its own transaction.
    `gateway.store.jobs.JobStore`."""

    async def insert(self, job: Job) -> None:
        """Store a new job. Raises IntegrityError when its id exists."""
        ...

    async def get(self, job_id: str) -> Job | None:
        """The job with that id; None when there is none."""
        ...

    async def find(
        self,
        *,
        enabled: bool | None = None,
        user_id: UserId | None = None,
        target: str | None = None,
    ) -> list[Job]:
        """Jobs, oldest first, of `user_id` or with `target` when given."""
        ...

    async def update(self, job_id: str, **values: Any) -> Job:
        """Change a job's columns; the job as it is now. Raises LookupError when there is
        no such job."""
        ...

    async def delete(self, job_id: str) -> None:
        """Delete a job and its runs. Raises LookupError when there is no such job."""
        ...

    async def cursors(self) -> dict[str, datetime]:
        """Per job, the newest scheduled time claimed or recorded missed."""
        ...

    async def claim(
        self,
        job_id: str,
        scheduled_for: datetime,
        owner: str,
        now: datetime,
        *,
        fence: Fence | None = None,
    ) -> int | None:
        """The new running run's id; None when the slot was taken. Raises LeaseLost from
        `fence` (nothing claimed)."""
        ...

    async def missed(self, job_id: str, slots: Sequence[datetime], detail: str) -> int:
        """Record slots that will never run; how many were new."""
        ...

    async def queue(self, job_id: str, now: datetime) -> Run:
        """A manual run waiting for a scheduler."""
        ...

    async def take_queued(
        self, owner: str, now: datetime, *, fence: Fence | None = None
    ) -> list[Run]:
        """Queued manual runs now running for `owner`. Raises LeaseLost from `fence`."""
        ...

    async def run(self, run_id: int) -> Run | None:
        """The run with that id; None when there is none."""
        ...

    async def runs(self, job_id: str, *, limit: int = 20) -> list[Run]:
        """The job's runs, newest scheduled time first."""
        ...

    async def running(self) -> list[Run]:
        """Every running run, whoever owns it."""
        ...

    async def gone_owners(self, now: datetime, ttl: float) -> set[str]:
        """Registered instances that are stopped or silent for `ttl`."""
        ...

    async def interrupt(self, run_id: int, now: datetime, reason: str) -> bool:
        """running → interrupted, with its turn; False when it was not running."""
        ...

    async def prune(self, job_id: str, keep: int) -> list[Run]:
        """Delete all but the newest `keep` finished runs; those deleted."""
        ...

    async def decided(self, job_id: str, limit: int) -> list[Run]:
        """The newest finished runs (missed slots left out), newest first."""
        ...


class RunRecords(Protocol):
    """A run's writes, inside the caller's transaction. Module `gateway.store.jobs`."""

    async def start_run(
        self, conn: AsyncConnection, run_id: int, session_id: int, turn_id: int
    ) -> None:
        """Record the session and turn a running run works in."""
        ...

    async def finish_run(self, conn: AsyncConnection, run_id: int, **values: Any) -> None:
        """Store how a run ended. Raises LeaseLost when it is no longer running (it was cut
        off meanwhile): nothing of it may be stored or delivered."""
        ...

    async def mark_notified(self, conn: AsyncConnection, job_id: str, streak: int) -> bool:
        """Record a failure streak; True when the owner is to be told now."""
        ...

    async def set_streak(
        self, conn: AsyncConnection, job_id: str, streak: int, *, notified: bool | None
    ) -> None:
        """Set a job's failures in a row (and whether its owner was told, unless None)."""
        ...


# access ------------------------------------------------------------------------------------


class PairingRepository(Protocol):
    """Pairing requests and grants, inside the caller's transaction.
    Module `gateway.store.pairings`."""

    async def is_granted(
        self, conn: AsyncConnection, platform: str, external_id: str, account: str | None = None
    ) -> bool:
        """Whether the sender holds a grant (with `account`: one reaching that account)."""
        ...

    async def grant(
        self, conn: AsyncConnection, platform: str, external_id: str, *, via: str
    ) -> None:
        """Grant the sender access (idempotent)."""
        ...

    async def delete_grants(self, conn: AsyncConnection, platform: str, external_id: str) -> int:
        """Withdraw the sender's grants; how many there were."""
        ...

    async def lock_pairings(self, conn: AsyncConnection, platform: str) -> None:
        """Serialise the creation of `platform`'s pairings until the transaction ends."""
        ...

    async def expire_pairings(self, conn: AsyncConnection, now: datetime) -> None:
        """Pending requests past their expiry become expired."""
        ...

    async def pending_code(
        self, conn: AsyncConnection, platform: str, external_id: str, account: str | None = None
    ) -> str | None:
        """The code of the sender's pending request (with `account`: on that account); None
        when there is none."""
        ...

    async def count_pending(
        self, conn: AsyncConnection, platform: str, account: str | None = None
    ) -> int:
        """Pending requests of `platform` (with `account`: asked on that account)."""
        ...

    async def insert_pairing(self, conn: AsyncConnection, values: dict[str, Any]) -> bool:
        """Record a pending request; False when its code is taken."""
        ...

    async def list_pairings(self, conn: AsyncConnection, *, all_: bool = False) -> list[Pairing]:
        """Pending unexpired requests (all with `all_`), newest first."""
        ...

    async def pairing_by_code(self, conn: AsyncConnection, code: str) -> Pairing | None:
        """The request with that code; None when there is none."""
        ...

    async def decide_pairing(
        self, conn: AsyncConnection, pairing_id: int, status: str, now: datetime
    ) -> None:
        """Set a request's status, decided at `now`."""
        ...

    async def revoke_pairings(
        self, conn: AsyncConnection, platform: str, external_id: str, now: datetime
    ) -> int:
        """The sender's pending and approved requests become revoked; how many."""
        ...


class ApprovalRepository(Protocol):
    """Tool calls waiting for a person's yes, inside the caller's transaction.
    Module `gateway.store.approvals`."""

    async def insert_approval(self, conn: AsyncConnection, values: dict[str, Any]) -> int:
        """Record a pending approval; its id."""
        ...

    async def open_approval(self, conn: AsyncConnection, call_key: str) -> ApprovalRow | None:
        """The newest pending or approved (not yet run) approval of this call, or None."""
        ...

    async def get_approval(self, conn: AsyncConnection, approval_id: int) -> ApprovalRow | None:
        """The approval with that id, or None."""
        ...

    async def pending_approvals(self, conn: AsyncConnection, session_key: str) -> list[ApprovalRow]:
        """The session's pending approvals, oldest first."""
        ...

    async def recent_approvals(self, conn: AsyncConnection, limit: int = 50) -> list[ApprovalRow]:
        """The newest approvals of every session, pending or decided, newest first."""
        ...

    async def ask_again(
        self, conn: AsyncConnection, approval_id: int, *, turn_id: int | None, expires_at: datetime
    ) -> None:
        """Count one more question of the same call; move its expiry."""
        ...

    async def decide_approval(
        self,
        conn: AsyncConnection,
        approval_id: int,
        status: ApprovalStatus,
        *,
        by: str | None,
        now: datetime,
    ) -> bool:
        """Decide a pending approval; False when it was not pending any more."""
        ...

    async def close_approval(
        self, conn: AsyncConnection, approval_id: int, status: ApprovalStatus, now: datetime
    ) -> None:
        """End an open approval (`used`, `cancelled`)."""
        ...


# cluster: membership, leases, lanes, signals -----------------------------------------------


class MembershipRepository(Protocol):
    """This instance's row in `instances`. `gateway.store.instances.Membership`."""

    async def register(self) -> int:
        """Record this start; its incarnation. Raises InstanceConflict when another live
        process runs under this id."""
        ...

    async def beat(self, holds: Sequence[str]) -> bool:
        """Renew the heartbeat; False when this instance was counted as gone meanwhile."""
        ...

    async def leave(self) -> None:
        """Mark this instance stopped."""
        ...


class LeaseRepository(Protocol):
    """Named leases with fencing tokens. `gateway.store.leases.Leases`."""

    async def acquire(self, name: str) -> int | None:
        """Take `name`; the new fencing token, or None while a live owner holds it."""
        ...

    async def renew(self, name: str, token: int) -> bool:
        """Extend a held lease; False when it was taken over."""
        ...

    async def release(self, name: str, token: int) -> None:
        """Give the lease up now (the token stays, so fencing holds)."""
        ...

    async def check(self, conn: AsyncConnection, name: str, token: int) -> None:
        """In the caller's transaction: raise LeaseLost unless `name` is still held with
        `token` (on PostgreSQL the row stays locked until the commit)."""
        ...


class ClusterReads(Protocol):
    """What `herald status` shows, in the caller's transaction. Modules
    `gateway.store.instances`, `gateway.store.leases`, `gateway.store.lanes`."""

    async def list_instances(self, conn: AsyncConnection) -> list[InstanceInfo]:
        """Every registered instance, most recent heartbeat first."""
        ...

    async def list_leases(self, conn: AsyncConnection) -> list[LeaseInfo]:
        """Every lease, by name."""
        ...

    async def lanes_by_owner(self, conn: AsyncConnection) -> dict[str, int]:
        """Lanes held per owner (`""`: released)."""
        ...


class Lanes(Protocol):
    """Where a session's turns may run: at most one instance at a time.
    `gateway.cluster.lanes.SoloLanes` (one process), `gateway.store.lanes.SqlLanes`."""

    @property
    def clustered(self) -> bool:
        """Whether other instances may share the database (lanes are claimed in SQL)."""
        ...

    async def claim(self, key: SessionKey) -> Claim | None:
        """Take the lane, recovering a dead owner's leftovers (its running turn becomes
        interrupted, its taken messages wait again); None while a live instance holds it."""
        ...

    async def release(self, claim: Claim) -> None:
        """Give the lane up (nothing of the session runs or waits here). A stale claim
        releases nothing."""
        ...

    async def check(self, conn: AsyncConnection, claim: Claim, turn_id: TurnId | None) -> None:
        """In the caller's transaction: raise LeaseLost unless the claim still holds, and
        record `turn_id` as the session's running turn (None: none runs)."""
        ...

    async def state(self, conn: AsyncConnection, key: SessionKey) -> LaneState:
        """Who holds the lane (a live owner only) and what it runs, in the caller's
        transaction."""
        ...

    async def request_cancel(
        self, conn: AsyncConnection, key: SessionKey, turn_id: TurnId, reason: str
    ) -> None:
        """In the caller's transaction: ask whoever runs turn `turn_id` of `key` to cancel
        it; durable, so the owner finds it even if the signal that goes with it is lost."""
        ...

    async def cancel_requested(self, claim: Claim) -> str | None:
        """Why the turn running under `claim` was asked to cancel; None when it was not."""
        ...

    async def orphans(self, limit: int = 200, *, started: bool = False) -> list[SessionKey]:
        """Sessions with work no live instance is doing: waiting or cut-off messages, or a
        lane whose owner is gone (this instance's own too when it has just `started`)."""
        ...


class SignalBus(Protocol):
    """Hints between instances, published in the transaction that made them necessary.
    `gateway.cluster.bus.LocalBus` (one process), `gateway.cluster.bus.PgBus`."""

    @property
    def clustered(self) -> bool:
        """Whether signals reach other instances."""
        ...

    @property
    def connected(self) -> bool:
        """Whether signals from others can arrive now (always, for one process)."""
        ...

    def subscribe(self, handler: Handler) -> None:
        """Call `handler` for each signal from another instance, never for this one's.
        A handler that raises is logged; the others still get the signal."""
        ...

    on_ignored: Callable[[str], None]
    """Called with a reason for each signal not acted upon (a metric)."""

    def ignore(self, reason: str, what: str) -> None:
        """Count (`on_ignored`) and log, at most one line a minute, a signal that is not acted
        upon: `malformed`, or `unconfirmed` (what it asks is not stored: forged)."""
        ...

    async def publish(self, conn: AsyncConnection, signal: Signal) -> None:
        """Send `signal` when the caller's transaction commits (never, if it rolls back)."""
        ...

    async def run(self) -> None:
        """Listen until cancelled, reconnecting after failures; after each (re)connection
        every handler gets `resync`. Never returns; raises nothing but CancelledError."""
        ...


# the memory provider's sync queue ----------------------------------------------------------


class MemorySyncQueue(Protocol):
    """Module `gateway.store.memory_sync`: the external memory provider's durable queue.

    Rows are sent in `id` order per person: only a person's oldest live row is ever due.
    """

    async def enqueue(
        self,
        conn: AsyncConnection,
        person: UserId,
        kind: SyncKind,
        payload: dict[str, Any],
        *,
        session_key: str,
        session_id: SessionId | None = None,
        turn_id: TurnId | None = None,
    ) -> int:
        """In the caller's transaction (the turn's own): queue one sync; its id."""
        ...

    async def heads(self, conn: AsyncConnection, now: datetime, limit: int = 64) -> list[SyncRow]:
        """Each person's oldest live sync, when it is due at `now`; oldest first."""
        ...

    async def next_due(self, conn: AsyncConnection) -> datetime | None:
        """When the earliest live sync is due (None: nothing queued)."""
        ...

    async def sending(self, conn: AsyncConnection, sync_id: int) -> None:
        """A try starts (a row found so later counts as possibly sent: `SyncRow.resent`)."""
        ...

    async def sent(self, conn: AsyncConnection, sync_id: int) -> None:
        """The provider took the sync: delete it."""
        ...

    async def retry(self, conn: AsyncConnection, sync_id: int, error: str, at: datetime) -> None:
        """A try failed: count it, keep `error`, try again at `at`."""
        ...

    async def give_up(self, conn: AsyncConnection, sync_id: int, error: str) -> None:
        """Keep the sync as dead (never sent again); the person's next one becomes due."""
        ...

    async def reassign(self, conn: AsyncConnection, source: UserId, into: UserId) -> None:
        """In the caller's transaction: `source`'s syncs become `into`'s (linked users)."""
        ...

    async def counts(self, conn: AsyncConnection) -> SyncCounts:
        """Queued and dead syncs, and when the oldest queued one was written."""
        ...

    async def dead(self, conn: AsyncConnection, limit: int = 50) -> list[SyncRow]:
        """The most recently given-up syncs, newest first."""
        ...

    async def queued(self, conn: AsyncConnection, person: UserId | None = None) -> list[SyncRow]:
        """Live syncs (of `person`, or everyone's), in the order they are sent."""
        ...


# skills --------------------------------------------------------------------------------------


class SkillWriteJournal(Protocol):
    """Every write to a skill, and the writes waiting for approval (the protocol the agent
    core names `agent_core.skills.SkillJournal`). `gateway.store.skills.SkillWrites`."""

    async def record(self, write: SkillWrite) -> int:
        """Store `write` with its diff and its session's latest turn; return its id."""
        ...

    async def writes(
        self, *, status: WriteStatus | None = None, skill: str | None = None, limit: int = 100
    ) -> list[SkillWrite]:
        """Recorded writes, newest first, filtered by status and skill name."""
        ...

    async def get(self, write_id: int) -> SkillWrite:
        """One write. Raises LookupError when there is none of that id."""
        ...

    async def decide(self, write_id: int, status: WriteStatus) -> bool:
        """Mark a pending write approved or rejected; False when it was not pending."""
        ...
