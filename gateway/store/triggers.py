"""The SQL of triggers' deliveries and their runs (`trigger_runs`). Every method is its own
transaction unless it takes a connection.

A row is the claim on a delivery id: UNIQUE (trigger, delivery id), inserted before the
sender is answered, so a redelivery finds it and runs nothing. It waits `queued` until a
runner takes it (`running`), and ends `ok`, `failed`, `timed_out` or `interrupted`. A run
cut off by a crash is queued again once (`attempts`), then recorded interrupted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import RowMapping, delete, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.contracts.errors import LeaseLost
from gateway.store import Store
from gateway.store.instances import stopped_or_silent
from gateway.store.sql import insert_ignore
from gateway.store.tables import instances, trigger_runs, turns
from gateway.store.types import aware


class TriggerStatus(StrEnum):
    """Where a delivery's run is."""

    QUEUED = "queued"
    RUNNING = "running"
    OK = "ok"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    INTERRUPTED = "interrupted"
    SKIPPED = "skipped"
    """Left out by the trigger's filters: kept only so that a replay of it (say, with an
    unsigned event header changed) is known and runs nothing."""


WAITING = (TriggerStatus.QUEUED, TriggerStatus.RUNNING)


class Accepted(StrEnum):
    """What `accept` made of a delivery."""

    NEW = "new"
    DUPLICATE = "duplicate"
    FULL = "full"


@dataclass(frozen=True, slots=True)
class TriggerRun:
    """One stored delivery and its run."""

    id: int
    trigger: str
    delivery_id: str
    status: TriggerStatus
    event: str | None
    headers: Mapping[str, str]
    payload: str
    received_at: datetime
    attempts: int = 0
    started_at: datetime | None = None
    finished_at: datetime | None = None
    owner: str | None = None
    output: str | None = None
    error: str | None = None
    delivery_status: str | None = None


class TriggerRuns:
    """Queries of the trigger_runs table."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def accept(
        self,
        trigger: str,
        delivery_id: str,
        *,
        event: str | None,
        headers: Mapping[str, str],
        payload: str,
        now: datetime,
        max_queued: int,
        content_key: str | None = None,
        skipped: bool = False,
    ) -> tuple[Accepted, int | None]:
        """Store a verified delivery as a queued run, in one transaction: (NEW, its id);
        (DUPLICATE, None) when its delivery id or its content key is known (whatever became
        of it); (FULL, None), storing nothing, when `max_queued` runs of the trigger wait
        or run. `skipped`: recorded as skipped (never run), the queue not counted."""
        same = trigger_runs.c.delivery_id == delivery_id
        if content_key is not None:
            same = or_(same, trigger_runs.c.content_key == content_key)
        async with self.store.write() as conn:
            known = await conn.scalar(
                select(trigger_runs.c.id).where(trigger_runs.c.trigger == trigger, same).limit(1)
            )
            if known is not None:
                return Accepted.DUPLICATE, None
            waiting = await conn.scalar(
                select(func.count())
                .select_from(trigger_runs)
                .where(
                    trigger_runs.c.trigger == trigger,
                    trigger_runs.c.status.in_([str(s) for s in WAITING]),
                )
            )
            if not skipped and int(waiting or 0) >= max_queued:
                return Accepted.FULL, None
            run_id = await insert_ignore(
                conn,
                trigger_runs,
                {
                    "trigger": trigger,
                    "delivery_id": delivery_id,
                    "status": str(TriggerStatus.SKIPPED if skipped else TriggerStatus.QUEUED),
                    **({"finished_at": now} if skipped else {}),
                    "event": event,
                    "headers": dict(headers),
                    "payload": payload,
                    "received_at": now,
                    "content_key": content_key,
                },
            )
        return (Accepted.DUPLICATE, None) if run_id is None else (Accepted.NEW, run_id)

    async def take(self, owner: str, now: datetime, limit: int) -> list[TriggerRun]:
        """Up to `limit` queued runs, oldest first, now running here (each taken with a
        conditional write, so no two instances take one)."""
        async with self.store.read() as conn:
            ids = (
                await conn.scalars(
                    select(trigger_runs.c.id)
                    .where(trigger_runs.c.status == str(TriggerStatus.QUEUED))
                    .order_by(trigger_runs.c.id)
                    .limit(limit)
                )
            ).all()
        taken: list[TriggerRun] = []
        for run_id in ids:
            async with self.store.write() as conn:
                result = await conn.execute(
                    update(trigger_runs)
                    .where(
                        trigger_runs.c.id == run_id,
                        trigger_runs.c.status == str(TriggerStatus.QUEUED),
                    )
                    .values(
                        status=str(TriggerStatus.RUNNING),
                        owner=owner,
                        started_at=now,
                        attempts=trigger_runs.c.attempts + 1,
                    )
                )
            if result.rowcount:
                run = await self.get(int(run_id))
                assert run is not None
                taken.append(run)
        return taken

    async def recover(
        self,
        me: str,
        now: datetime,
        *,
        own: bool,
        lease_ttl: float | None,
        max_attempts: int,
    ) -> tuple[int, int]:
        """Runs left `running` by an instance that is gone: with `own` (at the start) an
        earlier life of this one (`me`), and, with `lease_ttl`, any other silent or stopped
        that long (never `me`, whose runs may be going on). Each is queued again while it
        has started fewer than `max_attempts` times, else interrupted with its turn.
        (requeued, interrupted)."""
        async with self.store.write() as conn:
            owners = [me] if own else []
            if lease_ttl is not None:
                gone = await conn.scalars(
                    select(instances.c.id).where(stopped_or_silent(now, lease_ttl))
                )
                owners += [str(g) for g in gone if g != me]
            if not owners:
                return 0, 0
            rows = (
                (
                    await conn.execute(
                        select(trigger_runs).where(
                            trigger_runs.c.status == str(TriggerStatus.RUNNING),
                            trigger_runs.c.owner.in_(owners),
                        )
                    )
                )
                .mappings()
                .all()
            )
            requeued = interrupted = 0
            for row in rows:
                if int(row["attempts"]) < max_attempts:
                    await conn.execute(
                        update(trigger_runs)
                        .where(trigger_runs.c.id == row["id"])
                        .values(status=str(TriggerStatus.QUEUED), owner=None)
                    )
                    requeued += 1
                else:
                    reason = f"cut off {row['attempts']} times by a stopped process; not run again"
                    await conn.execute(
                        update(trigger_runs)
                        .where(trigger_runs.c.id == row["id"])
                        .values(
                            status=str(TriggerStatus.INTERRUPTED), finished_at=now, error=reason
                        )
                    )
                    interrupted += 1
                if row["turn_id"] is not None:
                    await conn.execute(
                        update(turns)
                        .where(turns.c.id == row["turn_id"], turns.c.status == "running")
                        .values(status="interrupted", finished_at=now, error="process stopped")
                    )
        return requeued, interrupted

    async def requeue(self, run_id: int) -> None:
        """A run this instance stops during (a drain): queued again for the next start."""
        async with self.store.write() as conn:
            await conn.execute(
                update(trigger_runs)
                .where(
                    trigger_runs.c.id == run_id,
                    trigger_runs.c.status == str(TriggerStatus.RUNNING),
                )
                .values(status=str(TriggerStatus.QUEUED), owner=None)
            )

    async def prune(self, before: datetime) -> int:
        """Delete finished runs that ended before `before` (a delivery older than that is
        no longer recognized when it comes again); how many."""
        async with self.store.write() as conn:
            result = await conn.execute(
                delete(trigger_runs).where(
                    trigger_runs.c.status.not_in([str(s) for s in WAITING]),
                    trigger_runs.c.finished_at < before,
                )
            )
        return int(result.rowcount or 0)

    async def get(self, run_id: int) -> TriggerRun | None:
        """The run with that id, or None."""
        async with self.store.read() as conn:
            row = (
                (await conn.execute(select(trigger_runs).where(trigger_runs.c.id == run_id)))
                .mappings()
                .first()
            )
        return None if row is None else _run(row)

    async def runs(self, trigger: str | None = None, *, limit: int = 20) -> list[TriggerRun]:
        """Runs, newest first (of one trigger, or of all)."""
        query = select(trigger_runs).order_by(trigger_runs.c.id.desc()).limit(limit)
        if trigger is not None:
            query = query.where(trigger_runs.c.trigger == trigger)
        async with self.store.read() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [_run(r) for r in rows]

    async def waiting(self) -> dict[str, int]:
        """Per trigger, its runs queued or running."""
        async with self.store.read() as conn:
            rows = (
                await conn.execute(
                    select(trigger_runs.c.trigger, func.count())
                    .where(trigger_runs.c.status.in_([str(s) for s in WAITING]))
                    .group_by(trigger_runs.c.trigger)
                )
            ).all()
        return {str(r[0]): int(r[1]) for r in rows}


async def start_run(conn: AsyncConnection, run_id: int, session_id: int, turn_id: int) -> None:
    """In the caller's transaction: the session and turn a running run works in."""
    await conn.execute(
        update(trigger_runs)
        .where(trigger_runs.c.id == run_id)
        .values(session_id=session_id, turn_id=turn_id)
    )


async def finish_run(conn: AsyncConnection, run_id: int, **values: Any) -> None:
    """In the caller's transaction: store how a run ended. Raises LeaseLost when it is no
    longer running here (recovered meanwhile): nothing of it may be stored or sent then."""
    result = await conn.execute(
        update(trigger_runs)
        .where(
            trigger_runs.c.id == run_id,
            trigger_runs.c.status == str(TriggerStatus.RUNNING),
        )
        .values(**values)
    )
    if not result.rowcount:
        raise LeaseLost(f"trigger run {run_id} was taken back meanwhile; its result is dropped")


def _run(r: RowMapping) -> TriggerRun:
    return TriggerRun(
        id=int(r["id"]),
        trigger=str(r["trigger"]),
        delivery_id=str(r["delivery_id"]),
        status=TriggerStatus(r["status"]),
        event=r["event"],
        headers={str(k): str(v) for k, v in (r["headers"] or {}).items()},
        payload=str(r["payload"]),
        received_at=aware(r["received_at"]),
        attempts=int(r["attempts"]),
        started_at=None if r["started_at"] is None else aware(r["started_at"]),
        finished_at=None if r["finished_at"] is None else aware(r["finished_at"]),
        owner=r["owner"],
        output=r["output"],
        error=r["error"],
        delivery_status=r["delivery_status"],
    )
