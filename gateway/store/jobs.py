"""The SQL of scheduled jobs and their runs. Every method is its own transaction unless it
takes a connection.

A run row is the claim on one scheduled time: UNIQUE (job id, scheduled time), inserted
before the run starts, so no two schedulers (or a restarted one) ever run the same slot.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import RowMapping, delete, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.contracts.errors import LeaseLost
from gateway.contracts.ids import UserId
from gateway.store import Store
from gateway.store.instances import stopped_or_silent
from gateway.store.outbox import SettledReport
from gateway.store.sql import insert_ignore
from gateway.store.tables import instances, job_runs, jobs, turns
from gateway.store.types import aware


class RunStatus(StrEnum):
    """How a run's execution went."""

    QUEUED = "queued"
    RUNNING = "running"
    OK = "ok"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    INTERRUPTED = "interrupted"
    MISSED = "missed"


class DeliveryStatus(StrEnum):
    """How a run's report got out (None: nothing to deliver, as after a failed run)."""

    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"
    SUPPRESSED = "suppressed"


class Trigger(StrEnum):
    """Why a run exists."""

    SCHEDULE = "schedule"
    MANUAL = "manual"


@dataclass(frozen=True, slots=True)
class Job:
    """One stored job."""

    id: str
    name: str
    prompt: str
    schedule: str
    timezone: str
    targets: tuple[str, ...]
    enabled: bool
    created_by: str
    user_id: UserId | None
    timeout: float | None
    created_at: datetime
    updated_at: datetime
    anchor_at: datetime
    consecutive_failures: int = 0
    failure_notified: bool = False
    profile: str = "default"
    """The profile its runs answer as; `home` is that profile's home."""


@dataclass(frozen=True, slots=True)
class Run:
    """One stored run (or missed slot) of a job."""

    id: int
    job_id: str
    scheduled_for: datetime
    status: RunStatus
    trigger: Trigger
    delivery_status: DeliveryStatus | None = None
    delivery_detail: str | None = None
    output: str | None = None
    error: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    owner: str | None = None

    @property
    def failed(self) -> bool:
        """Whether the run counts as a failure (of the run or of its delivery)."""
        return self.status in (
            RunStatus.FAILED,
            RunStatus.TIMED_OUT,
            RunStatus.INTERRUPTED,
        ) or (self.status is RunStatus.OK and self.delivery_status is DeliveryStatus.FAILED)

    @property
    def succeeded(self) -> bool:
        """Whether the run and its delivery (or suppression) both went through."""
        return self.status is RunStatus.OK and self.delivery_status in (
            DeliveryStatus.DELIVERED,
            DeliveryStatus.SUPPRESSED,
        )


FINISHED = (
    RunStatus.OK,
    RunStatus.FAILED,
    RunStatus.TIMED_OUT,
    RunStatus.INTERRUPTED,
)


Fence = Callable[[AsyncConnection], Awaitable[None]]
"""A check run inside a claim's transaction; raises LeaseLost when this instance may not
schedule any more (its lease's token is stale)."""


class JobStore:
    """Queries of the jobs and job_runs tables."""

    def __init__(self, store: Store) -> None:
        self.store = store

    # jobs ------------------------------------------------------------------------------------

    async def insert(self, job: Job) -> None:
        """Store a new job (its id must be new)."""
        async with self.store.write() as conn:
            await conn.execute(insert(jobs).values(**_job_values(job)))

    async def get(self, job_id: str) -> Job | None:
        """The job with that id, or None."""
        async with self.store.read() as conn:
            row = (await conn.execute(select(jobs).where(jobs.c.id == job_id))).mappings().first()
        return None if row is None else _job(row)

    async def find(
        self,
        *,
        enabled: bool | None = None,
        user_id: UserId | None = None,
        target: str | None = None,
    ) -> list[Job]:
        """Jobs, oldest first; with `user_id` and/or `target`, those of that user or with
        that target (either matches)."""
        query = select(jobs).order_by(jobs.c.created_at, jobs.c.id)
        if enabled is not None:
            query = query.where(jobs.c.enabled == enabled)
        async with self.store.read() as conn:
            rows = (await conn.execute(query)).mappings().all()
        found = [_job(r) for r in rows]
        if user_id is None and target is None:
            return found
        return [
            j
            for j in found
            if (user_id is not None and j.user_id == user_id)
            or (target is not None and target in j.targets)
        ]

    async def update(self, job_id: str, **values: Any) -> Job:
        """Change columns of a job; LookupError when there is none."""
        async with self.store.write() as conn:
            result = await conn.execute(update(jobs).where(jobs.c.id == job_id).values(**values))
        if not result.rowcount:
            raise LookupError(f"there is no job {job_id!r}")
        job = await self.get(job_id)
        assert job is not None
        return job

    async def delete(self, job_id: str) -> None:
        """Delete a job and its runs; LookupError when there is none."""
        async with self.store.write() as conn:
            await conn.execute(delete(job_runs).where(job_runs.c.job_id == job_id))
            result = await conn.execute(delete(jobs).where(jobs.c.id == job_id))
        if not result.rowcount:
            raise LookupError(f"there is no job {job_id!r}")

    # runs ------------------------------------------------------------------------------------

    async def cursors(self) -> dict[str, datetime]:
        """Per job, the newest scheduled time already claimed or recorded missed."""
        async with self.store.read() as conn:
            rows = (
                await conn.execute(
                    select(job_runs.c.job_id, func.max(job_runs.c.scheduled_for))
                    .where(job_runs.c.trigger == str(Trigger.SCHEDULE))
                    .group_by(job_runs.c.job_id)
                )
            ).all()
        return {str(r[0]): aware(r[1]) for r in rows if r[1] is not None}

    async def claim(
        self,
        job_id: str,
        scheduled_for: datetime,
        owner: str,
        now: datetime,
        *,
        fence: Fence | None = None,
    ) -> int | None:
        """Insert the running row of a slot; its id, or None when the slot was taken.
        `fence` runs first in the same transaction (raises LeaseLost: nothing is claimed)."""
        async with self.store.write() as conn:
            if fence is not None:
                await fence(conn)
            return await insert_ignore(
                conn,
                job_runs,
                {
                    "job_id": job_id,
                    "scheduled_for": scheduled_for,
                    "status": str(RunStatus.RUNNING),
                    "trigger": str(Trigger.SCHEDULE),
                    "owner": owner,
                    "started_at": now,
                },
            )

    async def missed(self, job_id: str, slots: Sequence[datetime], detail: str) -> int:
        """Record slots that will never run; how many were new."""
        count = 0
        async with self.store.write() as conn:
            for slot in slots:
                new = await insert_ignore(
                    conn,
                    job_runs,
                    {
                        "job_id": job_id,
                        "scheduled_for": slot,
                        "status": str(RunStatus.MISSED),
                        "trigger": str(Trigger.SCHEDULE),
                        "error": detail,
                    },
                )
                count += new is not None
        return count

    async def queue(self, job_id: str, now: datetime) -> Run:
        """A manual run ("run now"), waiting for a scheduler to take it.

        Its time is `now`, moved on by a microsecond or so if a run already has that time.
        """
        for shift in range(10):
            async with self.store.write() as conn:
                run_id = await insert_ignore(
                    conn,
                    job_runs,
                    {
                        "job_id": job_id,
                        "scheduled_for": now + timedelta(microseconds=shift),
                        "status": str(RunStatus.QUEUED),
                        "trigger": str(Trigger.MANUAL),
                    },
                )
                if run_id is not None:
                    # Read back in the same transaction: a scheduler may take the run the
                    # moment it commits, and the caller is told what it queued.
                    row = (
                        (await conn.execute(select(job_runs).where(job_runs.c.id == run_id)))
                        .mappings()
                        .one()
                    )
                    return _run(row)
        raise LookupError(f"a run of {job_id!r} is already queued for {now.isoformat()}")

    async def take_queued(
        self, owner: str, now: datetime, *, fence: Fence | None = None
    ) -> list[Run]:
        """Queued manual runs this scheduler now owns (queued → running), each taken in a
        transaction that runs `fence` first (see `claim`)."""
        async with self.store.read() as conn:
            ids = (
                await conn.scalars(
                    select(job_runs.c.id)
                    .where(job_runs.c.status == str(RunStatus.QUEUED))
                    .order_by(job_runs.c.id)
                )
            ).all()
        taken: list[Run] = []
        for run_id in ids:
            async with self.store.write() as conn:
                if fence is not None:
                    await fence(conn)
                result = await conn.execute(
                    update(job_runs)
                    .where(job_runs.c.id == run_id, job_runs.c.status == str(RunStatus.QUEUED))
                    .values(status=str(RunStatus.RUNNING), owner=owner, started_at=now)
                )
            if result.rowcount:
                run = await self.run(int(run_id))
                assert run is not None
                taken.append(run)
        return taken

    async def run(self, run_id: int) -> Run | None:
        """The run with that id, or None."""
        async with self.store.read() as conn:
            row = (
                (await conn.execute(select(job_runs).where(job_runs.c.id == run_id)))
                .mappings()
                .first()
            )
        return None if row is None else _run(row)

    async def runs(self, job_id: str, *, limit: int = 20) -> list[Run]:
        """The job's runs, newest scheduled time first."""
        async with self.store.read() as conn:
            rows = (
                (
                    await conn.execute(
                        select(job_runs)
                        .where(job_runs.c.job_id == job_id)
                        .order_by(job_runs.c.scheduled_for.desc(), job_runs.c.id.desc())
                        .limit(limit)
                    )
                )
                .mappings()
                .all()
            )
        return [_run(r) for r in rows]

    async def running(self) -> list[Run]:
        """Every run marked running, whoever owns it."""
        async with self.store.read() as conn:
            rows = (
                (
                    await conn.execute(
                        select(job_runs).where(job_runs.c.status == str(RunStatus.RUNNING))
                    )
                )
                .mappings()
                .all()
            )
        return [_run(r) for r in rows]

    async def gone_owners(self, now: datetime, ttl: float) -> set[str]:
        """Registered instances that are not alive (stopped, or no heartbeat for `ttl`)."""
        async with self.store.read() as conn:
            rows = (
                await conn.execute(select(instances.c.id).where(stopped_or_silent(now, ttl)))
            ).all()
        return {str(r[0]) for r in rows}

    async def interrupt(self, run_id: int, now: datetime, reason: str) -> bool:
        """running → interrupted (never re-run), and its turn with it; False when it was no
        longer running."""
        async with self.store.write() as conn:
            result = await conn.execute(
                update(job_runs)
                .where(job_runs.c.id == run_id, job_runs.c.status == str(RunStatus.RUNNING))
                .values(status=str(RunStatus.INTERRUPTED), finished_at=now, error=reason)
            )
            if result.rowcount:
                its_turn = select(job_runs.c.turn_id).where(job_runs.c.id == run_id)
                await conn.execute(
                    update(turns)
                    .where(turns.c.id == its_turn.scalar_subquery(), turns.c.status == "running")
                    .values(status="interrupted", finished_at=now, error=reason)
                )
        return bool(result.rowcount)

    async def prune(self, job_id: str, keep: int) -> list[Run]:
        """Delete all but the newest `keep` finished runs of a job; return those deleted.

        The newest scheduled run always stays: it is where the schedule resumes.
        """
        async with self.store.write() as conn:
            rows = (
                (
                    await conn.execute(
                        select(job_runs)
                        .where(
                            job_runs.c.job_id == job_id,
                            job_runs.c.status.in_([str(s) for s in (*FINISHED, RunStatus.MISSED)]),
                        )
                        .order_by(job_runs.c.scheduled_for.desc(), job_runs.c.id.desc())
                        .offset(keep)
                    )
                )
                .mappings()
                .all()
            )
            old = [_run(r) for r in rows]
            newest = await conn.scalar(
                select(func.max(job_runs.c.scheduled_for)).where(
                    job_runs.c.job_id == job_id, job_runs.c.trigger == str(Trigger.SCHEDULE)
                )
            )
            old = [r for r in old if newest is None or r.scheduled_for != aware(newest)]
            if old:
                await conn.execute(delete(job_runs).where(job_runs.c.id.in_([r.id for r in old])))
        return old

    async def decided(self, job_id: str, limit: int) -> list[Run]:
        """The newest finished runs of a job, newest first (missed slots left out)."""
        async with self.store.read() as conn:
            rows = (
                (
                    await conn.execute(
                        select(job_runs)
                        .where(
                            job_runs.c.job_id == job_id,
                            job_runs.c.status.in_([str(s) for s in FINISHED]),
                        )
                        .order_by(job_runs.c.scheduled_for.desc(), job_runs.c.id.desc())
                        .limit(limit)
                    )
                )
                .mappings()
                .all()
            )
        return [_run(r) for r in rows]


async def finish_run(conn: AsyncConnection, run_id: int, **values: Any) -> None:
    """In the caller's transaction: store how a run ended. Raises LeaseLost when the run is
    no longer running (it was counted as cut off while this process was away): nothing of
    it may be stored or delivered then."""
    result = await conn.execute(
        update(job_runs)
        .where(job_runs.c.id == run_id, job_runs.c.status == str(RunStatus.RUNNING))
        .values(**values)
    )
    if not result.rowcount:
        raise LeaseLost(f"run {run_id} was recorded as cut off meanwhile; its result is dropped")


async def mark_notified(conn: AsyncConnection, job_id: str, streak: int) -> bool:
    """In the caller's transaction: record a failure streak; True if the owner is to be
    told now (the first to set the flag)."""
    result = await conn.execute(
        update(jobs)
        .where(jobs.c.id == job_id, jobs.c.failure_notified.is_(False))
        .values(failure_notified=True, consecutive_failures=streak)
    )
    return bool(result.rowcount)


def _job_values(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "name": job.name,
        "prompt": job.prompt,
        "schedule": job.schedule,
        "timezone": job.timezone,
        "targets": list(job.targets),
        "enabled": job.enabled,
        "created_by": job.created_by,
        "user_id": job.user_id,
        "timeout": job.timeout,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        "anchor_at": job.anchor_at,
        "consecutive_failures": job.consecutive_failures,
        "failure_notified": job.failure_notified,
        "profile": job.profile,
    }


def _job(r: RowMapping) -> Job:
    created = aware(r["created_at"])
    return Job(
        id=str(r["id"]),
        name=str(r["name"]),
        prompt=str(r["prompt"]),
        schedule=str(r["schedule"]),
        timezone=str(r["timezone"]),
        targets=tuple(str(t) for t in r["targets"] or ()),
        enabled=bool(r["enabled"]),
        created_by=str(r["created_by"]),
        user_id=None if r["user_id"] is None else UserId(r["user_id"]),
        timeout=None if r["timeout"] is None else float(r["timeout"]),
        created_at=created,
        updated_at=aware(r["updated_at"]),
        anchor_at=created if r["anchor_at"] is None else aware(r["anchor_at"]),
        consecutive_failures=int(r["consecutive_failures"]),
        failure_notified=bool(r["failure_notified"]),
        profile=str(r["profile"] or "default"),
    )


def _run(r: RowMapping) -> Run:
    return Run(
        id=int(r["id"]),
        job_id=str(r["job_id"]),
        scheduled_for=aware(r["scheduled_for"]),
        status=RunStatus(r["status"]),
        trigger=Trigger(r["trigger"]),
        delivery_status=None
        if r["delivery_status"] is None
        else DeliveryStatus(r["delivery_status"]),
        delivery_detail=r["delivery_detail"],
        output=r["output"],
        error=r["error"],
        started_at=None if r["started_at"] is None else aware(r["started_at"]),
        finished_at=None if r["finished_at"] is None else aware(r["finished_at"]),
        owner=r["owner"],
    )


async def record_report(conn: AsyncConnection, report: SettledReport) -> None:
    """In the outbox's transaction (an `Outbox` listener): every chunk of a run's report is
    settled, so its pending delivery status becomes delivered, or failed with the reasons."""
    status = DeliveryStatus.FAILED if report.failures else DeliveryStatus.DELIVERED
    await conn.execute(
        update(job_runs)
        .where(
            job_runs.c.id == report.run_id,
            job_runs.c.delivery_status == str(DeliveryStatus.PENDING),
        )
        .values(
            delivery_status=str(status),
            delivery_detail="; ".join(report.failures) if report.failures else None,
        )
    )


async def start_run(conn: AsyncConnection, run_id: int, session_id: int, turn_id: int) -> None:
    """In the caller's transaction: the session and turn a running run works in (known
    from the start, so a run cut off with its instance ends its turn too)."""
    await conn.execute(
        update(job_runs)
        .where(job_runs.c.id == run_id)
        .values(session_id=session_id, turn_id=turn_id)
    )


async def set_streak(
    conn: AsyncConnection, job_id: str, streak: int, *, notified: bool | None
) -> None:
    """In the caller's transaction: a job's count of failed runs in a row (and whether its
    owner was told of them, unless `notified` is None)."""
    values: dict[str, Any] = {"consecutive_failures": streak}
    if notified is not None:
        values["failure_notified"] = notified
    await conn.execute(update(jobs).where(jobs.c.id == job_id).values(**values))
