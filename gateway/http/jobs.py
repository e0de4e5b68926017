"""Scheduled jobs over HTTP: `/api/jobs` (Bearer auth like the OpenAI-compatible API).

A bad schedule, time zone or target is a 400 with the reason and changes nothing; an
unknown job id is a 404.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, HTTPException, Response
from pydantic import BaseModel, ConfigDict, Field

from gateway.contracts.ids import UserId
from gateway.cron.service import MAX_NAME, MAX_PROMPT, JobError, JobService, JobSpec
from gateway.http.api import Deps
from gateway.store.jobs import Job, Run

router = APIRouter(prefix="/api/jobs", tags=["jobs"])

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "Invalid schedule, time zone, target or body"},
    401: {"description": "Missing or wrong API key"},
    404: {"description": "No such job"},
    503: {"description": "Scheduled jobs are not available"},
}


class JobIn(BaseModel):
    """The body of `POST /api/jobs`."""

    model_config = ConfigDict(extra="forbid")
    prompt: str = Field(min_length=1, max_length=MAX_PROMPT)
    schedule: str = Field(min_length=1, max_length=200)
    name: str | None = Field(default=None, max_length=MAX_NAME)
    timezone: str | None = Field(default=None, max_length=64)
    targets: list[str] | None = Field(default=None, max_length=20)
    enabled: bool = True
    timeout: float | None = Field(default=None, gt=0, le=86_400)
    created_by: str = Field(default="api", min_length=1, max_length=200)
    profile: str = Field(default="default", min_length=1, max_length=32)
    """The profile its runs answer as (`home` is that profile's home)."""


class JobPatch(BaseModel):
    """The body of `PATCH /api/jobs/{id}`: the fields to change."""

    model_config = ConfigDict(extra="forbid")
    prompt: str | None = Field(default=None, min_length=1, max_length=MAX_PROMPT)
    schedule: str | None = Field(default=None, min_length=1, max_length=200)
    name: str | None = Field(default=None, min_length=1, max_length=MAX_NAME)
    timezone: str | None = Field(default=None, max_length=64)
    targets: list[str] | None = Field(default=None, min_length=1, max_length=20)
    enabled: bool | None = None
    timeout: float | None = Field(default=None, gt=0, le=86_400)


def _service(deps: Deps) -> JobService:
    if deps.jobs is None:
        raise HTTPException(503, "scheduled jobs are not available")
    return deps.jobs


def _when(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def job_json(job: Job, service: JobService) -> dict[str, Any]:
    """A job as the API shows it."""
    return {
        "id": job.id,
        "name": job.name,
        "prompt": job.prompt,
        "schedule": job.schedule,
        "timezone": job.timezone,
        "targets": list(job.targets),
        "enabled": job.enabled,
        "timeout": job.timeout,
        "created_by": job.created_by,
        "user_id": job.user_id,
        "profile": job.profile,
        "created_at": _when(job.created_at),
        "updated_at": _when(job.updated_at),
        "next_run_at": _when(service.next_run(job)),
        "consecutive_failures": job.consecutive_failures,
    }


def run_json(run: Run) -> dict[str, Any]:
    """A run as the API shows it."""
    return {
        "id": run.id,
        "job_id": run.job_id,
        "scheduled_for": _when(run.scheduled_for),
        "trigger": str(run.trigger),
        "status": str(run.status),
        "delivery_status": None if run.delivery_status is None else str(run.delivery_status),
        "delivery_detail": run.delivery_detail,
        "error": run.error,
        "output": run.output,
        "started_at": _when(run.started_at),
        "finished_at": _when(run.finished_at),
    }


async def _get(service: JobService, job_id: str) -> Job:
    try:
        return await service.get(job_id)
    except LookupError as err:
        raise HTTPException(404, str(err)) from err


@router.post("", status_code=201, responses=ERRORS)
async def create_job(body: JobIn, deps: Deps) -> dict[str, Any]:
    """Create a job; its runs belong to the local owner."""
    service = _service(deps)
    owner = await deps.store.resolve_user("local", "owner")
    spec = JobSpec(
        prompt=body.prompt,
        schedule=body.schedule,
        name=body.name,
        timezone=body.timezone,
        targets=body.targets,
        enabled=body.enabled,
        timeout=body.timeout,
    )
    if body.profile not in deps.config.profile_names():
        known = ", ".join(deps.config.profile_names())
        raise HTTPException(400, f"profile: no profile {body.profile!r} (profiles: {known})")
    try:
        job = await service.create(
            spec, created_by=body.created_by, user_id=UserId(owner), profile=body.profile
        )
    except JobError as err:
        raise HTTPException(400, str(err)) from err
    return job_json(job, service)


@router.get("", responses=ERRORS)
async def list_jobs(deps: Deps) -> dict[str, Any]:
    """Every job, oldest first."""
    service = _service(deps)
    return {"jobs": [job_json(j, service) for j in await service.find()]}


@router.get("/{job_id}", responses=ERRORS)
async def get_job(job_id: str, deps: Deps, runs: int = 10) -> dict[str, Any]:
    """A job and its newest runs (`runs`: how many, 0 to 100)."""
    service = _service(deps)
    job = await _get(service, job_id)
    recent = await service.runs(job_id, limit=max(0, min(100, runs))) if runs > 0 else []
    return {**job_json(job, service), "runs": [run_json(r) for r in recent]}


@router.patch("/{job_id}", responses=ERRORS)
async def update_job(job_id: str, body: JobPatch, deps: Deps) -> dict[str, Any]:
    """Change the given fields; a new schedule or time zone counts from now."""
    service = _service(deps)
    await _get(service, job_id)
    changes = body.model_dump(exclude_unset=True)
    try:
        job = await service.update(job_id, **changes)
    except JobError as err:
        raise HTTPException(400, str(err)) from err
    except LookupError as err:
        raise HTTPException(404, str(err)) from err
    return job_json(job, service)


@router.delete("/{job_id}", status_code=204, responses=ERRORS)
async def delete_job(job_id: str, deps: Deps) -> Response:
    """Delete a job and its runs."""
    service = _service(deps)
    try:
        await service.delete(job_id)
    except LookupError as err:
        raise HTTPException(404, str(err)) from err
    return Response(status_code=204)


@router.post("/{job_id}/pause", responses=ERRORS)
async def pause_job(job_id: str, deps: Deps) -> dict[str, Any]:
    """Stop running the job until resumed."""
    service = _service(deps)
    await _get(service, job_id)
    return job_json(await service.pause(job_id), service)


@router.post("/{job_id}/resume", responses=ERRORS)
async def resume_job(job_id: str, deps: Deps) -> dict[str, Any]:
    """Run the job on its schedule again; times missed while paused are skipped."""
    service = _service(deps)
    await _get(service, job_id)
    return job_json(await service.resume(job_id), service)


@router.post("/{job_id}/run", status_code=202, responses=ERRORS)
async def run_job(job_id: str, deps: Deps) -> dict[str, Any]:
    """Run the job now, outside its schedule; answers with the queued run."""
    service = _service(deps)
    await _get(service, job_id)
    try:
        run = await service.run_now(job_id)
    except LookupError as err:
        raise HTTPException(409, str(err)) from err
    return run_json(run)
