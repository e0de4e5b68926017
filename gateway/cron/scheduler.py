"""The scheduler: finds due slots, claims each by inserting its run row, runs it as an agent
turn in the job's own session, and hands the report to the outbox.

Fire times come from the jobs' schedules (`gateway.cron.schedule`, APScheduler triggers);
time comes from an injectable `Clock`. Jobs are re-read from SQL on every look, which
happens at the next fire time, when `wake()` is called after a change, and every
`cron.poll_interval` seconds (changes by the CLI or another instance).

Exactly one run per scheduled time: the run row (UNIQUE job + time) is inserted before the
run starts; an insert that finds the row already there means another scheduler (or an
earlier life of this one) has it. After downtime, the newest missed slot runs if it is
within `cron.catchup_grace`; the others are recorded `missed`. A run cut off by a stop is
recorded `interrupted` and never re-run: at once when the process drains, at the next start
when the same instance id comes back, or once its timeout has passed otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_core.agent import Agent
from agent_core.loop import TurnProgress
from agent_core.media import Destination, OutgoingFile, TurnMedia
from gateway.agents import ProfileAgents, UnknownProfile
from gateway.backoff import Backoff, FailureLog
from gateway.channels import Channels
from gateway.chunking import split_chunks
from gateway.config import CronConfig
from gateway.contracts.config import PlatformSection
from gateway.contracts.errors import LeaseLost
from gateway.contracts.history import ChatMessage, Role
from gateway.contracts.ids import (
    AccountId,
    ChatId,
    Origin,
    SessionId,
    SessionKey,
    ThreadId,
    TurnId,
    UserId,
    session_key,
)
from gateway.contracts.messages import TextFormat
from gateway.cron.clock import Clock
from gateway.cron.schedule import ScheduleError, stored_schedule
from gateway.cron.targets import HOME, HOME_SETTING, resolve
from gateway.profiles import DEFAULT
from gateway.store import Store
from gateway.store.jobs import (
    DeliveryStatus,
    Job,
    JobStore,
    Run,
    RunStatus,
    finish_run,
    mark_notified,
    set_streak,
    start_run,
)
from gateway.store.outbox import Chunk, OutboxKind, Target, enqueue
from gateway.store.store import SnapshotFactory, record_finish, record_start
from gateway.turns import FailureKind, TurnStatus, run_agent

logger = logging.getLogger(__name__)

SILENT = "[SILENT]"
"""A run whose whole answer is this is not delivered."""
CRON_ACCOUNT = "default"
MAX_MISSED = 100
"""Missed slots recorded per look at most (the newest); older ones are only logged."""
REAP_MARGIN = timedelta(seconds=60)
"""A run still `running` this long after its timeout has no live owner."""


class SchedulingRight(Protocol):
    """Decides whether this instance schedules now (the `cron` lease, with several)."""

    async def holds(self) -> bool:
        """True while this instance may claim and run slots."""
        ...

    async def fence(self, conn: AsyncConnection) -> None:
        """In a claim's transaction: raise LeaseLost unless the right still holds there
        (a process paused past its lease must not claim on waking)."""
        ...


class AlwaysSchedule:
    """Every instance schedules; the run rows keep them from firing a slot twice."""

    async def holds(self) -> bool:
        """Always True."""
        return True

    async def fence(self, conn: AsyncConnection) -> None:
        """Always holds."""


def job_session_key(job_id: str) -> SessionKey:
    """The session a job's runs share (so a run sees the previous ones)."""
    return session_key(Origin.CRON, CRON_ACCOUNT, job_id)


class CronScheduler:
    """Runs until cancelled; `wake()` makes it look at the jobs again at once."""

    def __init__(
        self,
        store: Store,
        agent: Agent,
        config: CronConfig,
        *,
        homes: Sequence[str],
        sections: Mapping[tuple[str, str], PlatformSection],
        state_dir: Path,
        channels: Channels,
        snapshot: SnapshotFactory,
        clock: Clock,
        instance: str,
        on_outbox: Callable[[], None] = lambda: None,
        right: SchedulingRight | None = None,
        lease_ttl: float = 15.0,
        operator: Callable[[UserId | None, str], Awaitable[bool]] | None = None,
        profiles: ProfileAgents | None = None,
        profile_homes: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """`operator(owner, created_by)`: whether a job's run has operator rights (it may
        then reach other chats through tools), asked at each run; by default it has not.
        `profiles`: the agent a job of each profile runs with (None: `agent` for all);
        `profile_homes`: the home of each profile but the default one (`homes`)."""
        self.store = store
        self.jobs = JobStore(store)
        self.agent = agent
        self.config = config
        self.homes = tuple(homes)
        self.sections = dict(sections)
        self.state_dir = state_dir
        self.channels = channels
        self.snapshot = snapshot
        self.clock = clock
        self.instance = instance
        self.on_outbox = on_outbox
        self.right: SchedulingRight = right or AlwaysSchedule()
        self.lease_ttl = lease_ttl
        self._operator = operator
        self.profiles = profiles or ProfileAgents.single(agent)
        self.profile_homes = {k: tuple(v) for k, v in (profile_homes or {}).items()}
        self.backoff = Backoff(initial=1.0, maximum=60.0)
        self.failures = FailureLog(logger, "looking at the scheduled jobs")
        """The current run of failures to read or write the jobs (each backs off further)."""
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(config.max_concurrent_runs)
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._active: set[int] = set()
        self._bad: set[tuple[str, str]] = set()
        self._tg: asyncio.TaskGroup | None = None
        self.ticks = 0
        """Looks at the jobs completed so far (tests wait on it)."""
        self._draining = False
        self._idle = asyncio.Event()
        self._idle.set()

    def wake(self) -> None:
        """Jobs changed (or a run was queued): look again now."""
        self._wake.set()

    @property
    def active_runs(self) -> int:
        """Runs this scheduler is executing now."""
        return len(self._active)

    async def run(self) -> None:
        """Schedule until cancelled; runs cut off by the cancellation become interrupted."""
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            recovered = False
            while True:
                self._wake.clear()
                next_fire = None
                try:
                    if not recovered:
                        await self._recover()
                        recovered = True
                    if not self._draining and await self.right.holds():
                        next_fire = await self._tick()
                except LeaseLost as err:  # another instance schedules now
                    logger.warning("not scheduling: %s", err)
                except Exception as err:  # the database may be away or full: back off
                    self.failures.failed(err)
                    self.ticks += 1
                    delay = self.backoff.delay(self.failures.failures - 1)
                    await self.clock.sleep_until(self.clock.now() + timedelta(seconds=delay))
                    continue
                else:
                    self.failures.recovered()
                self.ticks += 1
                await self._pause(next_fire)

    async def drain(self, grace: float) -> None:
        """Start no more runs; wait up to `grace` seconds for the running ones to finish.

        Runs still going afterwards are interrupted when the scheduler is cancelled.
        """
        self._draining = True
        self.wake()
        if self._active:
            logger.info("waiting up to %.0fs for %d job run(s)", grace, len(self._active))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self._idle.wait()

    async def _recover(self) -> None:
        now = self.clock.now()
        for run in await self.jobs.running():
            if run.owner == self.instance and await self.jobs.interrupt(
                run.id, now, "Herald restarted during the run; it is not run again"
            ):
                logger.warning("job %s: the run for %s was cut off", run.job_id, run.scheduled_for)

    async def _pause(self, next_fire: datetime | None) -> None:
        assert self._tg is not None
        waits: list[Coroutine[Any, Any, Any]] = [self._wake.wait()]
        if next_fire is not None:
            waits.append(self.clock.sleep_until(next_fire))
        tasks = [self._tg.create_task(w, name="cron wait") for w in waits]
        try:
            await asyncio.wait(
                tasks, timeout=self.config.poll_interval, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # looking at the jobs -----------------------------------------------------------------------

    async def _tick(self) -> datetime | None:
        """Claim and start what is due; return the next fire time of any job."""
        now = self.clock.now()
        await self._reap(now)
        enabled = await self.jobs.find(enabled=True)
        cursors = await self.jobs.cursors()
        earliest: datetime | None = None
        for job in enabled:
            try:
                schedule = stored_schedule(job.schedule, job.timezone)
            except ScheduleError as err:
                if (job.id, job.schedule) not in self._bad:
                    self._bad.add((job.id, job.schedule))
                    logger.error("job %s has an unusable schedule: %s", job.id, err)
                continue
            start = max(cursors.get(job.id, job.anchor_at), job.anchor_at)
            due, older = schedule.slots(start, now, job.anchor_at, keep=MAX_MISSED + 1)
            if due:
                await self._fire(job, due, older, now)
                start = due[-1]
            following = schedule.next_after(start, job.anchor_at)
            if following is not None and (earliest is None or following < earliest):
                earliest = following
        for run in await self.jobs.take_queued(self.instance, now, fence=self.right.fence):
            queued = await self.jobs.get(run.job_id)
            if queued is not None:
                self._start(queued, run)
        for job in await self.jobs.find():
            await self._account(job)
        return earliest

    async def _fire(self, job: Job, due: list[datetime], older: int, now: datetime) -> None:
        newest = due[-1]
        catch_up = (now - newest).total_seconds() <= self.config.catchup_grace
        missed = due[:-1] if catch_up else due
        if missed:
            detail = (
                "not run: Herald was not running at that time (only the newest missed time "
                "within cron.catchup_grace runs)"
            )
            count = await self.jobs.missed(job.id, missed, detail)
            if count or older:
                logger.warning("job %s: %d scheduled time(s) missed", job.id, count + older)
        if not catch_up:
            return
        run_id = await self.jobs.claim(job.id, newest, self.instance, now, fence=self.right.fence)
        if run_id is None:
            return  # another scheduler has it
        run = await self.jobs.run(run_id)
        assert run is not None
        self._start(job, run)

    async def _reap(self, now: datetime) -> None:
        """Runs left `running` by a process that is gone become interrupted: at once when
        its instance is known to be gone, else once its timeout has long passed."""
        running = await self.jobs.running()
        gone = await self.jobs.gone_owners(now, self.lease_ttl) if running else set()
        for run in running:
            if run.id in self._active or run.started_at is None:
                continue
            if run.owner in gone and run.owner != self.instance:
                if await self.jobs.interrupt(
                    run.id, now, f"instance {run.owner} stopped during the run; not run again"
                ):
                    logger.warning("job %s: run %d was cut off", run.job_id, run.id)
                continue
            job = await self.jobs.get(run.job_id)
            timeout = timedelta(
                seconds=(job.timeout if job and job.timeout else self.config.run_timeout)
            )
            if now - run.started_at > timeout + REAP_MARGIN and await self.jobs.interrupt(
                run.id, now, "the process running it stopped; it is not run again"
            ):
                logger.warning("job %s: run %d had no live owner", run.job_id, run.id)

    # running -----------------------------------------------------------------------------------

    def _start(self, job: Job, run: Run) -> None:
        assert self._tg is not None
        self._active.add(run.id)
        self._idle.clear()
        self._tg.create_task(self._execute(job, run), name=f"cron {job.id}")

    async def _execute(self, job: Job, run: Run) -> None:
        try:
            async with self._slots, self._locks[job.id]:
                await self._run(job, run)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.shield(
                    self.jobs.interrupt(run.id, self.clock.now(), "Herald stopped during the run")
                )
            raise
        except LeaseLost as err:
            logger.warning("job %s: %s", job.id, err)
        except Exception:  # a run must never take the scheduler down
            logger.exception("job %s: run %d failed", job.id, run.id)
            with contextlib.suppress(Exception):
                async with self.store.write() as conn:
                    await finish_run(
                        conn,
                        run.id,
                        status=str(RunStatus.FAILED),
                        error="internal error",
                        finished_at=self.clock.now(),
                    )
        finally:
            self._active.discard(run.id)
            if not self._active:
                self._idle.set()

    def _prompt(self, job: Job, run: Run) -> str:
        local = run.scheduled_for.astimezone(stored_schedule(job.schedule, job.timezone).tz)
        return (
            f"[Scheduled job “{job.name}”, run for {local:%Y-%m-%d %H:%M %Z}. Reply exactly "
            f"{SILENT} if there is nothing worth reporting.]\n\n{job.prompt}"
        )

    async def _run(self, job: Job, run: Run) -> None:
        job = await self.jobs.get(job.id) or job
        missing: UnknownProfile | None = None
        try:
            agent = self.profiles.get(job.profile)
        except UnknownProfile as err:  # the run fails saying so; nothing runs as another
            agent, missing = self.agent, err
        session = await self.store.open_session(
            job_session_key(job.id),
            platform=str(Origin.CRON),
            user_id=job.user_id,
            snapshot=self.snapshot if agent is self.agent else agent.snapshot,
            profile=job.profile,
        )
        async with self.store.write() as conn:
            turn_id, _ = await record_start(
                conn, session.id, [ChatMessage(Role.USER, self._prompt(job, run))]
            )
            await start_run(conn, run.id, session.id, turn_id)
        progress = TurnProgress()
        timeout = job.timeout or self.config.run_timeout
        # Files `send_file` sends go where the report goes (checked against those chats'
        # limits now, and again when the run ends and its report is queued).
        targets, _ = await self._targets(job.targets, job.profile)
        media = TurnMedia(report_to=tuple(self._destination(t) for t in targets))

        async def work() -> None:
            if missing is not None:
                raise missing
            # A run has its owner's rights and scope, never more.
            operator = self._operator is not None and await self._operator(
                job.user_id, job.created_by
            )
            await agent.run_turn(session, progress, operator=operator, turn_id=turn_id, media=media)

        try:
            failure = await run_agent(work, timeout=timeout, what=f"job {job.id}: run {run.id}")
        except asyncio.CancelledError:
            async with self.store.write() as conn:
                await record_finish(
                    conn,
                    session.id,
                    turn_id,
                    progress.result(TurnStatus.INTERRUPTED, "process stopping"),
                )
            raise
        status, error = RunStatus.OK, None
        if failure is not None:  # a failed run is recorded; the scheduler goes on
            timed_out = failure.kind is FailureKind.TIMEOUT
            status = RunStatus.TIMED_OUT if timed_out else RunStatus.FAILED
            error = failure.error
        output = progress.final_text if status is RunStatus.OK else None
        await self._finish(
            job, run, session.id, turn_id, progress, status, error, output, media.files
        )

    async def _finish(  # noqa: PLR0917 - the parts of one finished run
        self,
        job: Job,
        run: Run,
        session_id: SessionId,
        turn_id: TurnId,
        progress: TurnProgress,
        status: RunStatus,
        error: str | None,
        output: str | None,
        files: Sequence[OutgoingFile] = (),
    ) -> None:
        """Store how the run ended and queue its report, then the files it sent (only a
        run that succeeded sends anything; a `[SILENT]` one sends its files alone)."""
        now = self.clock.now()
        delivery: DeliveryStatus | None = None
        detail: str | None = None
        chunks: list[Chunk] = []
        if output is not None:
            silent = output.strip() == SILENT
            if silent and not files:
                delivery = DeliveryStatus.SUPPRESSED
            else:
                targets, problems = await self._targets(job.targets, job.profile)
                report = None if silent else self._report(job, output)
                chunks = self._chunks(run.id, targets, report, files, problems)
                delivery = DeliveryStatus.FAILED if problems or not chunks else None
                delivery = delivery or DeliveryStatus.PENDING
                detail = "; ".join(problems) or None
        turn_status = "completed" if status is RunStatus.OK else "failed"
        async with self.store.write() as conn:
            await record_finish(conn, session_id, turn_id, progress.result(turn_status, error))
            await finish_run(
                conn,
                run.id,
                status=str(status),
                error=error,
                output=output,
                finished_at=now,
                delivery_status=None if delivery is None else str(delivery),
                delivery_detail=detail,
                session_id=session_id,
                turn_id=turn_id,
            )
            if chunks:
                await enqueue(conn, chunks)
        if delivery is DeliveryStatus.FAILED:
            logger.warning(
                "job %s: run for %s %s, but its report cannot be delivered: %s",
                job.id,
                run.scheduled_for,
                status,
                detail or "no target",
            )
        else:
            logger.info("job %s: run for %s %s", job.id, run.scheduled_for, status)
        if chunks:
            self.on_outbox()
        await self._prune(job.id)
        await self._account(job)

    async def _targets(
        self, targets: Sequence[str], profile: str = DEFAULT
    ) -> tuple[list[Target], list[str]]:
        """Where `targets` of a job of `profile` go: `home` is the profile's home (the
        default profile's is `home.targets`, else the chat `/sethome` chose)."""
        if profile == DEFAULT:
            sethome = await self.store.get_setting(HOME_SETTING)
            homes = self.homes
        else:
            sethome, homes = None, self.profile_homes.get(profile, ())
        resolved = resolve(targets, homes=homes, sethome=sethome, sections=self.sections)
        return list(resolved.targets), list(resolved.problems)

    def _report(self, job: Job, output: str) -> str:
        """The report as delivered: the configured heading, then the answer."""
        heading = self.config.report_heading.format(name=job.name, id=job.id).strip()
        return f"{heading}\n\n{output}" if heading else output

    def _destination(self, target: Target) -> Destination:
        """A report target as `send_file` sees it (max_bytes 0: it takes no files)."""
        limit = self.channels.limits(target.platform, target.account).max_file_bytes
        return Destination(
            target.platform, target.account, target.chat_id, target.thread_id, limit or 0
        )

    def _chunks(
        self,
        run_id: int,
        targets: Sequence[Target],
        text: str | None,
        files: Sequence[OutgoingFile] = (),
        problems: list[str] | None = None,
    ) -> list[Chunk]:
        """For each target the report's chunks (none when `text` is None: a silent run),
        then each file sent to the report's chats; then the files sent to a chat of their
        own. Keys are per (run, target, chunk or file), so the run's rows are written once.
        A target that takes no files gets none; a file too large for a target (one that
        changed during the run) is left out for it and noted in `problems`."""
        chunks: list[Chunk] = []
        here = [(i, f) for i, f in enumerate(files) if f.to is None]
        for n, target in enumerate(targets):
            limits = self.channels.limits(target.platform, target.account)
            pieces = (
                []
                if text is None
                else split_chunks(text, limits.max_chunk, utf16=limits.count_utf16)
                or ["(no output)"]
            )
            chunks.extend(
                Chunk(
                    f"job:{run_id}:{n}:c{i}",
                    target,
                    piece,
                    kind=OutboxKind.REPORT,
                    chunk_index=i,
                    job_run_id=run_id,
                )
                for i, piece in enumerate(pieces)
            )
            index = len(pieces)
            most = limits.max_file_bytes or 0
            for i, f in here:
                if not most:  # takes no files: `send_file` said it would leave it out
                    continue
                if f.attachment.size > most:  # the target changed during the run
                    if problems is not None:
                        problems.append(
                            f"{f.attachment.filename or 'a file'} not sent to "
                            f"{target.platform}:{target.chat_id}: it takes files of at most "
                            f"{most} bytes"
                        )
                    continue
                chunks.append(self._file_chunk(f"job:{run_id}:{n}:f{i}", target, f, run_id, index))
                index += 1
        for i, f in enumerate(files):
            if f.to is not None:
                to = Target(
                    f.to.platform,
                    AccountId(f.to.account),
                    ChatId(f.to.chat_id),
                    None if f.to.thread_id is None else ThreadId(f.to.thread_id),
                )
                chunks.append(self._file_chunk(f"job:{run_id}:f{i}", to, f, run_id, 0))
        return chunks

    @staticmethod
    def _file_chunk(key: str, target: Target, f: OutgoingFile, run_id: int, index: int) -> Chunk:
        return Chunk(
            key,
            target,
            f.caption,
            kind=OutboxKind.REPORT if f.to is None else OutboxKind.SEND,
            format=TextFormat.PLAIN,
            chunk_index=index,
            job_run_id=run_id,
            attachment=f.attachment,
        )

    async def _prune(self, job_id: str) -> None:
        await self.jobs.prune(job_id, self.config.output_retention)

    # failures ----------------------------------------------------------------------------------

    async def _account(self, job: Job) -> None:
        """Count the job's consecutive failures; tell the owner once when they reach
        `cron.failure_notice_after`, and forget the notice after a success."""
        threshold = self.config.failure_notice_after
        streak = 0
        newest_failed: Run | None = None
        for run in await self.jobs.decided(job.id, threshold + 10):
            if run.failed:
                streak += 1
                newest_failed = newest_failed or run
            elif run.succeeded:
                break
        if streak >= threshold and not job.failure_notified:
            assert newest_failed is not None
            targets, problems = await self._targets([HOME], job.profile)
            text = (
                f"⚠ Scheduled job “{job.name}” ({job.id}) failed {streak} times in a row. "
                f"Last problem: {_reason(newest_failed)}. It keeps its schedule; see "
                f"`herald jobs runs {job.id}`."
            )
            async with self.store.write() as conn:
                if await mark_notified(conn, job.id, streak):
                    await enqueue(
                        conn,
                        [
                            Chunk(f"cron-fail:{job.id}:{newest_failed.id}:{n}", t, text)
                            for n, t in enumerate(targets)
                        ],
                    )
            if problems:
                logger.warning("job %s: failure notice not delivered: %s", job.id, problems)
            logger.warning("job %s failed %d times in a row", job.id, streak)
            self.on_outbox()
        elif streak != job.consecutive_failures or (job.failure_notified and streak < threshold):
            async with self.store.write() as conn:
                await set_streak(
                    conn, job.id, streak, notified=False if streak < threshold else None
                )


def _reason(run: Run) -> str:
    if run.status is RunStatus.OK:
        return f"delivery failed ({run.delivery_detail or 'no detail'})"
    return f"{run.status}: {run.error or 'no detail'}"
