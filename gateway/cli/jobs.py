"""`herald jobs …`: scheduled jobs, from the command line (straight to the database).

A running daemon notices changes within `cron.poll_interval` seconds; `jobs run` queues a
run that the daemon's scheduler takes (at its next start when none is running).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from gateway.cli.base import load
from gateway.cli.help import HeraldTyper
from gateway.cli.output import Column, JsonOption, Kind, print_json, print_rows
from gateway.config import HeraldConfig, load_config
from gateway.contracts.ids import UserId
from gateway.contracts.messages import utcnow
from gateway.cron.service import JobError, JobService, JobSpec
from gateway.store import Store
from gateway.store.instances import list_instances
from gateway.store.jobs import Job

jobs_app = HeraldTyper(help="Manage scheduled jobs.", no_args_is_help=True)

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML config file (default: $HERALD_CONFIG)."),
]


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _fail(message: str, code: int = 1) -> typer.Exit:
    Console(stderr=True, highlight=False).print(f"[red]error:[/] {escape(message)}")
    return typer.Exit(code)


def _with_jobs(
    config: Path | None,
    work: Callable[[JobService, Store], Awaitable[None]],
    *,
    create: bool = False,
) -> None:
    """Run `work` on the configured store; unless `create`, a database that does not exist
    yet is an error naming where it was looked for (exit 2), never created empty."""
    cfg: HeraldConfig = load(config)

    async def go() -> None:
        async with Store.open(cfg.effective_database_url, create=create) as store:
            service = JobService(
                store,
                configured=cfg.platforms.accounts(),
                default_timezone=cfg.cron.timezone,
                homes=cfg.home.targets,
            )
            await work(service, store)

    asyncio.run(go())


def _show(console: Console, job: Job, service: JobService) -> None:
    nxt = service.next_run(job)
    console.print(f"[bold]{escape(job.id)}[/] {escape(job.name)}")
    for label, value in (
        ("schedule", f"{job.schedule} ({job.timezone})"),
        ("targets", ", ".join(job.targets)),
        ("state", "active" if job.enabled else "paused"),
        ("next run", f"{nxt:%Y-%m-%d %H:%M:%S} UTC" if nxt else "-"),
        ("created by", job.created_by),
        ("profile", job.profile),
        ("failures in a row", str(job.consecutive_failures)),
        ("prompt", job.prompt),
    ):
        console.print(f"  {label}: ", end="")
        console.print(value, markup=False)


@jobs_app.command("add")
def jobs_add(  # noqa: PLR0917 - one parameter per option
    schedule: Annotated[
        str, typer.Option(help="'0 9 * * 1-5', 'every 30m', 'in 45m' or an ISO time.")
    ],
    prompt: Annotated[str, typer.Option(help="What the agent is asked at each run.")],
    name: Annotated[str | None, typer.Option(help="A short name.")] = None,
    tz: Annotated[
        str | None, typer.Option("--tz", help="IANA time zone (default: cron.timezone).")
    ] = None,
    target: Annotated[
        list[str] | None,
        typer.Option("--target", "-t", help="home, all, or platform:chat (repeatable)."),
    ] = None,
    timeout: Annotated[float | None, typer.Option(help="Seconds a run may take.")] = None,
    paused: Annotated[bool, typer.Option("--paused", help="Create it paused.")] = False,
    profile: Annotated[
        str, typer.Option(help="The profile its runs answer as (its home is `home`).")
    ] = "default",
    config: ConfigOption = None,
) -> None:
    """Create a job."""
    console = _console()
    names = load(config).profile_names()
    if profile not in names:
        raise _fail(f"no profile {profile!r} (profiles: {', '.join(names)})")

    async def work(service: JobService, store: Store) -> None:
        owner = await store.resolve_user("local", "owner")
        spec = JobSpec(
            prompt=prompt,
            schedule=schedule,
            name=name,
            timezone=tz,
            targets=target or None,
            enabled=not paused,
            timeout=timeout,
        )
        try:
            job = await service.create(
                spec, created_by="cli", user_id=UserId(owner), profile=profile
            )
        except JobError as err:
            raise _fail(str(err)) from err
        console.print(f"created job {escape(job.id)}")
        _show(console, job, service)
        problem = await service.home_problem(job)
        if problem is not None:
            Console(stderr=True, highlight=False).print(f"[yellow]warning:[/] {escape(problem)}")

    _with_jobs(config, work, create=True)


@jobs_app.command("list")
def jobs_list(config: ConfigOption = None, json_: JsonOption = False) -> None:
    """Every job with its schedule, targets and next run."""
    console = _console()

    async def work(service: JobService, store: Store) -> None:
        found = await service.find()
        if json_:
            print_json(
                [
                    {
                        "id": j.id,
                        "name": j.name,
                        "schedule": j.schedule,
                        "timezone": j.timezone,
                        "targets": list(j.targets),
                        "enabled": j.enabled,
                        "next_run_at": service.next_run(j),
                        "prompt": j.prompt,
                        "profile": j.profile,
                    }
                    for j in found
                ]
            )
            return
        if not found:
            console.print("no jobs")
            return
        profiles = any(j.profile != "default" for j in found)  # the column only then
        rows = []
        for j in found:
            nxt = service.next_run(j)
            rows.append(
                [
                    j.id,
                    j.name,
                    f"{j.schedule} ({j.timezone})",
                    ", ".join(j.targets),
                    *([j.profile] if profiles else []),
                    f"{nxt:%Y-%m-%d %H:%M}" if nxt else "paused" if not j.enabled else "-",
                ]
            )
        print_rows(
            console,
            [
                Column("id", Kind.ID),
                Column("name"),
                Column("schedule"),
                Column("targets"),
                *([Column("profile", Kind.ID)] if profiles else []),
                Column("next run (UTC)"),
            ],
            rows,
        )

    _with_jobs(config, work)


@jobs_app.command("show")
def jobs_show(job_id: str, config: ConfigOption = None) -> None:
    """One job in full."""
    console = _console()

    async def work(service: JobService, store: Store) -> None:
        try:
            job = await service.get(job_id)
        except LookupError as err:
            raise _fail(str(err)) from err
        _show(console, job, service)

    _with_jobs(config, work)


def _simple(job_id: str, config: Path | None, action: str) -> None:
    console = _console()

    async def work(service: JobService, store: Store) -> None:
        try:
            if action == "rm":
                await service.delete(job_id)
                console.print(f"deleted job {escape(job_id)}")
            elif action == "pause":
                await service.pause(job_id)
                console.print(f"paused job {escape(job_id)}")
            elif action == "resume":
                job = await service.resume(job_id)
                nxt = service.next_run(job)
                when = f"; next run {nxt:%Y-%m-%d %H:%M} UTC" if nxt else ""
                console.print(f"resumed job {escape(job_id)}{when}")
            else:
                run = await service.run_now(job_id)
                ttl = load_config(config).cluster.lease_ttl  # read and checked already
                async with store.read() as conn:
                    running = [i for i in await list_instances(conn) if i.alive(utcnow(), ttl)]
                when = (
                    f"the running daemon ({escape(running[0].id)}) takes it within seconds"
                    if running
                    else "no Herald daemon is running: it runs when `herald run` starts"
                )
                console.print(f"queued run {run.id} of job {escape(job_id)}; {when}")
        except LookupError as err:
            raise _fail(str(err)) from err

    _with_jobs(config, work)


@jobs_app.command("rm")
def jobs_rm(job_id: str, config: ConfigOption = None) -> None:
    """Delete a job and its runs."""
    _simple(job_id, config, "rm")


@jobs_app.command("pause")
def jobs_pause(job_id: str, config: ConfigOption = None) -> None:
    """Stop running a job until resumed."""
    _simple(job_id, config, "pause")


@jobs_app.command("resume")
def jobs_resume(job_id: str, config: ConfigOption = None) -> None:
    """Run a job on its schedule again (times missed while paused are skipped)."""
    _simple(job_id, config, "resume")


@jobs_app.command("run")
def jobs_run(job_id: str, config: ConfigOption = None) -> None:
    """Run a job now, outside its schedule (the daemon does it, or does when it starts)."""
    _simple(job_id, config, "run")


@jobs_app.command("runs")
def jobs_runs(
    job_id: str,
    config: ConfigOption = None,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 20,
    json_: JsonOption = False,
) -> None:
    """A job's runs, newest first: execution and delivery status."""
    console = _console()

    async def work(service: JobService, store: Store) -> None:
        try:
            runs = await service.runs(job_id, limit=limit)
        except LookupError as err:
            raise _fail(str(err)) from err
        if json_:
            print_json(
                [
                    {
                        "id": r.id,
                        "scheduled_for": r.scheduled_for,
                        "trigger": str(r.trigger),
                        "status": str(r.status),
                        "error": r.error,
                        "delivery_status": (
                            None if r.delivery_status is None else str(r.delivery_status)
                        ),
                        "delivery_detail": r.delivery_detail,
                    }
                    for r in runs
                ]
            )
            return
        if not runs:
            console.print("no runs yet")
            return
        print_rows(
            console,
            [
                Column("id", Kind.NUMBER),
                Column("scheduled for (UTC)"),
                Column("trigger", Kind.ID),
                Column("status", Kind.ID),
                Column("delivery", Kind.ID),
                Column("detail"),
            ],
            [
                [
                    str(r.id),
                    f"{r.scheduled_for:%Y-%m-%d %H:%M:%S}",
                    str(r.trigger),
                    str(r.status),
                    "" if r.delivery_status is None else str(r.delivery_status),
                    r.error or r.delivery_detail or "",
                ]
                for r in runs
            ],
        )

    _with_jobs(config, work)
