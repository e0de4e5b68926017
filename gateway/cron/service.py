"""The operations on jobs that the HTTP API, the CLI, the `schedule_job` tool and `/cron`
share: every change is validated first (a bad schedule, time zone or target changes
nothing) and then committed; the scheduler is told through `on_change`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from agent_core.tools.base import ToolContext, ToolError
from gateway.contracts.ids import UserId
from gateway.cron.clock import Clock, SystemClock
from gateway.cron.schedule import ScheduleError, parse_schedule, stored_schedule, zone
from gateway.cron.targets import (
    ALL,
    HOME,
    HOME_SETTING,
    TargetError,
    account_for,
    normalize_targets,
    parse_target,
    session_chat,
)
from gateway.store import Store
from gateway.store.jobs import Job, JobStore, Run

MAX_NAME = 200
MAX_PROMPT = 20_000


class JobError(ValueError):
    """A job that cannot be saved as asked; the message says why."""


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What a new job is made of; None fields take their defaults."""

    prompt: str
    schedule: str
    name: str | None = None
    timezone: str | None = None
    targets: Sequence[str] | None = None
    enabled: bool = True
    timeout: float | None = None


class JobService:
    """Validated job operations. `configured` are the (platform, account) pairs set up."""

    def __init__(
        self,
        store: Store,
        *,
        configured: Collection[tuple[str, str]],
        default_timezone: str = "UTC",
        clock: Clock | None = None,
        homes: Sequence[str] = (),
    ) -> None:
        self.jobs = JobStore(store)
        self.homes = tuple(homes)
        """`home.targets` from the config (for `home_problem`)."""
        self.configured = frozenset(configured)
        self.default_timezone = default_timezone
        self.clock: Clock = clock or SystemClock()
        self.on_change: Callable[[], None] = lambda: None
        """Called after every committed change (the scheduler sets it to its wake-up)."""

    def normalize(self, targets: Sequence[str]) -> tuple[str, ...]:
        """Targets in their stored form (`home`, `all`, `<platform>:<chat>`…). Raises JobError."""
        return self._targets(targets)

    def _targets(self, targets: Sequence[str]) -> tuple[str, ...]:
        try:
            return normalize_targets(targets, self.configured)
        except TargetError as err:
            raise JobError(str(err)) from err

    def _schedule(self, text: str, timezone: str, now: datetime) -> str:
        try:
            return parse_schedule(text, timezone, now=now).text
        except ScheduleError as err:
            raise JobError(str(err)) from err

    @staticmethod
    def _text(name: str, value: str, limit: int) -> str:
        value = value.strip()
        if not value:
            raise JobError(f"{name} is empty")
        if len(value) > limit:
            raise JobError(f"{name} is longer than {limit} characters")
        if any(ord(c) < 32 and c not in "\n\t" for c in value):
            raise JobError(f"{name} contains control characters")
        return value

    @staticmethod
    def _timeout(value: float | None) -> float | None:
        if value is not None and not (0 < value <= 86_400):
            raise JobError("timeout must be between 0 and 86400 seconds")
        return value

    async def create(
        self,
        spec: JobSpec,
        *,
        created_by: str,
        user_id: UserId | None = None,
        default_target: str = HOME,
        profile: str = "default",
    ) -> Job:
        """Validate and store a new job (run as `profile`). Raises JobError."""
        now = self.clock.now()
        timezone = spec.timezone or self.default_timezone
        try:
            zone(timezone)
        except ScheduleError as err:
            raise JobError(str(err)) from err
        prompt = self._text("prompt", spec.prompt, MAX_PROMPT)
        schedule = self._schedule(spec.schedule, timezone, now)
        name = self._text("name", spec.name or _default_name(prompt), MAX_NAME)
        targets = self._targets(spec.targets if spec.targets else [default_target])
        job = Job(
            id=secrets.token_hex(4),
            name=name,
            prompt=prompt,
            schedule=schedule,
            timezone=timezone,
            targets=targets,
            enabled=spec.enabled,
            created_by=created_by,
            user_id=user_id,
            timeout=self._timeout(spec.timeout),
            created_at=now,
            updated_at=now,
            anchor_at=now,
            profile=profile,
        )
        await self.jobs.insert(job)
        self.on_change()
        return job

    async def home_problem(self, job: Job) -> str | None:
        """Why the job's `home` / `all` target reaches no chat now, or None."""
        if not {t.lower() for t in job.targets} & {HOME, ALL}:
            return None
        if self.homes or await self.jobs.store.get_setting(HOME_SETTING):
            return None
        return (
            "no home channel is set, so its reports go nowhere: send /sethome in the chat "
            "that should get them, or set home.targets in the config"
        )

    async def get(self, job_id: str) -> Job:
        """The job; LookupError when there is none."""
        job = await self.jobs.get(job_id)
        if job is None:
            raise LookupError(f"there is no job {job_id!r}")
        return job

    async def update(self, job_id: str, **changes: Any) -> Job:
        """Change a job's name, prompt, schedule, timezone, targets, enabled or timeout.

        Raises LookupError, JobError. A new schedule or time zone counts from now.
        """
        job = await self.get(job_id)
        now = self.clock.now()
        values: dict[str, Any] = {}
        if changes.get("name") is not None:
            values["name"] = self._text("name", changes["name"], MAX_NAME)
        if changes.get("prompt") is not None:
            values["prompt"] = self._text("prompt", changes["prompt"], MAX_PROMPT)
        timezone = changes.get("timezone") or job.timezone
        if changes.get("timezone") is not None:
            try:
                zone(timezone)
            except ScheduleError as err:
                raise JobError(str(err)) from err
            values["timezone"] = timezone
        if changes.get("schedule") is not None or "timezone" in values:
            text = changes.get("schedule") or job.schedule
            values["schedule"] = self._schedule(text, timezone, now)
            values["anchor_at"] = now
        if changes.get("targets") is not None:
            values["targets"] = list(self._targets(changes["targets"]))
        if changes.get("enabled") is not None:
            values.update(self._enabled(job, bool(changes["enabled"]), now))
        if "timeout" in changes:
            values["timeout"] = self._timeout(changes["timeout"])
        if not values:
            return job
        values["updated_at"] = now
        updated = await self.jobs.update(job_id, **values)
        self.on_change()
        return updated

    @staticmethod
    def _enabled(job: Job, enabled: bool, now: datetime) -> dict[str, Any]:
        if enabled and not job.enabled:
            # Slots that passed while paused are neither run nor recorded as missed.
            return {"enabled": True, "anchor_at": now}
        return {"enabled": enabled}

    async def pause(self, job_id: str) -> Job:
        """Stop running the job until resumed. Raises LookupError."""
        return await self.update(job_id, enabled=False)

    async def resume(self, job_id: str) -> Job:
        """Run the job on its schedule again, from now on. Raises LookupError."""
        return await self.update(job_id, enabled=True)

    async def delete(self, job_id: str) -> None:
        """Delete the job and its runs. Raises LookupError."""
        await self.jobs.delete(job_id)
        self.on_change()

    async def run_now(self, job_id: str) -> Run:
        """Queue a run outside the schedule; a running scheduler takes it within seconds."""
        await self.get(job_id)
        run = await self.jobs.queue(job_id, self.clock.now())
        self.on_change()
        return run

    async def find(self, *, user_id: UserId | None = None, target: str | None = None) -> list[Job]:
        """Every job, or those of a user or with a target."""
        return await self.jobs.find(user_id=user_id, target=target)

    async def delivering_to(
        self, chat: str, *, homes: Sequence[str] = (), sethome: str | None = None
    ) -> list[Job]:
        """The jobs whose reports go to `chat` (`platform:chat[:thread]`) as things stand:
        named explicitly, or as the home (`home`: `sethome`, else the first of `homes`) or
        one of the homes (`all`)."""
        here = self._address(chat)
        home_list = [
            a for a in map(self._address, ([sethome] if sethome else []) + list(homes)) if a
        ]
        first_home, any_home = home_list[:1] == [here], here in home_list
        found: list[Job] = []
        for job in await self.jobs.find():
            for target in job.targets:
                kind = target.lower()
                if (
                    (kind == HOME and first_home)
                    or (kind == ALL and any_home)
                    or (kind not in (HOME, ALL) and self._address(target) == here)
                ):
                    found.append(job)
                    break
        return found

    async def runs(self, job_id: str, *, limit: int = 20) -> list[Run]:
        """The job's runs, newest first. Raises LookupError."""
        await self.get(job_id)
        return await self.jobs.runs(job_id, limit=limit)

    def next_run(self, job: Job) -> datetime | None:
        """When the job runs next (ignoring catch-up), or None (paused or done)."""
        if not job.enabled:
            return None
        try:
            schedule = stored_schedule(job.schedule, job.timezone)
        except ScheduleError:
            return None
        return schedule.next_after(max(self.clock.now(), job.anchor_at), job.anchor_at)

    def _address(self, target: str) -> str | None:
        """The chat a target names, normalized (an alias prefix becomes its platform, the
        account is named), or None."""
        try:
            parsed = parse_target(target, self.configured)
        except TargetError:
            return None
        if isinstance(parsed, str):
            return None
        try:
            account = account_for(parsed.platform, parsed.account, self.configured)
        except TargetError:
            return str(parsed)
        return str(replace(parsed, account=account))


def _default_name(prompt: str) -> str:
    first = " ".join(prompt.split())
    return first if len(first) <= 60 else first[:59] + "…"


def describe(job: Job, next_run: datetime | None) -> str:
    """One line about a job, for chat and the agent."""
    state = "paused" if not job.enabled else "active"
    when = f", next {next_run:%Y-%m-%d %H:%M} UTC" if next_run else ""
    return (
        f"{job.id} “{job.name}”: {job.schedule} ({job.timezone}) → "
        f"{', '.join(job.targets)}; {state}{when}"
    )


class AgentJobs:
    """The `schedule_job` tool's view of the jobs: acting for the session's user."""

    def __init__(self, service: JobService, profile: str = "default") -> None:
        """`profile`: the profile whose agent the tool belongs to (its jobs run as it)."""
        self.service = service
        self.profile = profile

    async def create(
        self,
        ctx: ToolContext,
        *,
        prompt: str,
        schedule: str,
        name: str | None,
        timezone: str | None,
        targets: Sequence[str] | None,
    ) -> str:
        """Create a job for the asking user; the session's chat is the default target.

        Only an operator may send a job's reports to another chat, `home` or `all`; anyone
        else schedules for the chat they are in.
        """
        session = ctx.session
        chat = session_chat(session.key, self.service.configured) if session is not None else None
        # The identity that asked (`platform:id`): a run's rights are computed from it, never
        # from a user it is linked to (`Access.job_operator`, `Store.unlink_identity`).
        created_by = ctx.sender or ctx.user_id or (session.key if session is not None else "agent")
        if not ctx.operator:
            if chat is None:
                raise ToolError(
                    "only Herald's operator may schedule jobs from here (there is no chat "
                    "to send the reports to)"
                )
            try:
                asked = self.service.normalize(targets) if targets else (chat,)
            except JobError as err:
                raise ToolError(str(err)) from err
            others = [t for t in asked if t != chat]
            if others:
                raise ToolError(
                    f"you may schedule reports only to this chat ({chat}); "
                    f"{', '.join(others)} is for Herald's operator to choose"
                )
        try:
            job = await self.service.create(
                JobSpec(
                    prompt=prompt, schedule=schedule, name=name, timezone=timezone, targets=targets
                ),
                created_by=str(created_by),
                user_id=ctx.user_id,
                default_target=chat or HOME,
                profile=self.profile,
            )
        except JobError as err:
            raise ToolError(str(err)) from err
        return "Scheduled: " + describe(job, self.service.next_run(job))

    async def listing(self, ctx: ToolContext) -> str:
        """The jobs of this chat, and in a direct chat the asking user's own too."""
        jobs = await self._mine(ctx)
        if not jobs:
            return "No scheduled jobs."
        return "\n".join(describe(j, self.service.next_run(j)) for j in jobs)

    async def remove(self, ctx: ToolContext, job_id: str) -> str:
        """Delete one of the jobs `listing` shows; in a group only its maker's or an
        operator's request does (ToolError otherwise, the job and its runs untouched)."""
        job = next((j for j in await self._mine(ctx) if j.id == job_id), None)
        if job is None:
            raise ToolError(f"there is no job {job_id!r} of yours; list them first")
        if not may_change(ctx, job):
            raise ToolError(
                f"job {job_id} was made by someone else; only they or Herald's operator may "
                "change or remove it. Leave it as it is"
            )
        await self.service.delete(job_id)
        return f"Removed job {job_id}."

    async def _mine(self, ctx: ToolContext) -> list[Job]:
        """The jobs of this tool's profile reporting to this chat; in a direct chat the
        user's own too (in a group everyone would read the list). Another profile's jobs
        are not this agent's to show or change."""
        session = ctx.session
        chat = session_chat(session.key, self.service.configured) if session is not None else None
        user_id = None if ctx.group else ctx.user_id
        if user_id is None and chat is None:
            return []
        found = await self.service.find(user_id=user_id, target=chat)
        return [j for j in found if j.profile == self.profile]


def may_change(ctx: ToolContext, job: Job) -> bool:
    """Whether the person acting in `ctx` may change or remove `job`: an operator (with
    nobody else's words in the turn), its owner (the user it runs for, or in a group the
    person who made it), or anyone in their own direct chat the job reports to."""
    if ctx.operator:
        return True
    if ctx.others:
        return False  # someone else's words are in the turn: only the rights all share
    if ctx.user_id is not None and job.user_id == ctx.user_id:
        return True
    if ctx.sender is not None and job.created_by == ctx.sender:
        return True
    return not ctx.group
