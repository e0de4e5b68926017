"""Scheduled jobs: the list, one job's runs with their output, run now, pause and resume."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from gateway.cron.service import JobService
from gateway.http.console.page import Console, ConsoleDep, Posted, Refused, Who, done, found
from gateway.http.console.section import Section
from gateway.store.jobs import Job

logger = logging.getLogger("gateway.console")
router = APIRouter(prefix="/jobs")
SECTION = Section("jobs", "Jobs", router)

RUNS = 20
"""Runs shown on a job's page (the newest)."""


def _service(console: Console) -> JobService:
    if console.deps.jobs is None:
        raise Refused(503, "Scheduled jobs are not available in this daemon.")
    return console.deps.jobs


async def _job(service: JobService, job_id: str) -> Job:
    return await found(service.get(job_id))


@router.get("", response_class=HTMLResponse)
async def jobs(request: Request, console: ConsoleDep, who: Who) -> Response:
    """Every job with its schedule and next run."""
    service = _service(console)
    found = await service.find()
    return console.render(
        request,
        "jobs.html",
        current=SECTION.slug,
        title="Jobs",
        jobs=[(job, service.next_run(job)) for job in found],
    )


@router.get("/{job_id}", response_class=HTMLResponse)
async def job(job_id: str, request: Request, console: ConsoleDep, who: Who) -> Response:
    """One job and its newest runs, each with its output."""
    service = _service(console)
    found = await _job(service, job_id)
    return console.render(
        request,
        "job.html",
        current=SECTION.slug,
        title=f"Job {found.name}",
        job=found,
        next_run=service.next_run(found),
        runs=await service.runs(job_id, limit=RUNS),
    )


@router.post("/{job_id}/run")
async def run_now(job_id: str, console: ConsoleDep, posted: Posted) -> Response:
    """Run the job now, outside its schedule."""
    service = _service(console)
    found = await _job(service, job_id)
    try:
        run = await service.run_now(job_id)
    except LookupError as err:
        raise Refused(409, f"{err}.") from err
    logger.info("console: job %s (%s) run %d queued by %s", job_id, found.name, run.id, posted.who)
    return done(f"{SECTION.path}/{job_id}", "queued", job_id)


@router.post("/{job_id}/pause")
async def pause(job_id: str, console: ConsoleDep, posted: Posted) -> Response:
    """Stop running the job until it is resumed."""
    service = _service(console)
    found = await _job(service, job_id)
    await service.pause(job_id)
    logger.info("console: job %s (%s) paused by %s", job_id, found.name, posted.who)
    return done(f"{SECTION.path}/{job_id}", "paused", job_id)


@router.post("/{job_id}/resume")
async def resume(job_id: str, console: ConsoleDep, posted: Posted) -> Response:
    """Run the job on its schedule again (times missed while paused are skipped)."""
    service = _service(console)
    found = await _job(service, job_id)
    await service.resume(job_id)
    logger.info("console: job %s (%s) resumed by %s", job_id, found.name, posted.who)
    return done(f"{SECTION.path}/{job_id}", "resumed", job_id)
