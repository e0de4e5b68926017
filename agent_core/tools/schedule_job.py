"""The `schedule_job` tool: create, list and remove scheduled jobs when asked in chat."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from agent_core.tools.base import ToolContext, ToolError, str_arg


class JobControl(Protocol):
    """What the gateway offers the agent for scheduled jobs (acting for `ctx`'s user)."""

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
        """Create a job; a confirmation. Raise ToolError when refused."""
        ...

    async def listing(self, ctx: ToolContext) -> str:
        """The user's (and this chat's) jobs, as text."""
        ...

    async def remove(self, ctx: ToolContext, job_id: str) -> str:
        """Delete one of them; a confirmation. Raise ToolError when there is no such job."""
        ...


class ScheduleJobTool:
    """Schedules agent runs whose answers are delivered as reports."""

    name = "schedule_job"
    description = (
        "Manage scheduled jobs: a prompt you will answer on a schedule, the answer delivered "
        "to a chat. action=create needs prompt and schedule: a 5-field cron expression "
        "('0 9 * * 1-5' = weekdays 9:00), 'every 30m' / 'every 2h', 'in 45m' (once) or an "
        "ISO time; timezone is an IANA name like Europe/Berlin; targets default to this "
        "chat ('home' = the home channel, 'all', or platform:chat). action=list shows the "
        "jobs; action=remove needs job_id. A scheduled answer of exactly [SILENT] is not sent."
    )
    schema: dict[str, Any] = {  # noqa: RUF012 - the schema is read-only data
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["create", "list", "remove"]},
            "prompt": {"type": "string", "description": "what to do at each run"},
            "schedule": {"type": "string"},
            "name": {"type": "string"},
            "timezone": {"type": "string"},
            "targets": {"type": "array", "items": {"type": "string"}},
            "job_id": {"type": "string"},
        },
        "required": ["action"],
    }

    def __init__(self, jobs: JobControl) -> None:
        self.jobs = jobs

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments."""
        return self.schema

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> str:
        """Run the action; ToolError for a bad or refused request."""
        action = str_arg(args, "action")
        if action == "list":
            return await self.jobs.listing(ctx)
        if action == "remove":
            return await self.jobs.remove(ctx, str_arg(args, "job_id").strip())
        if action != "create":
            raise ToolError(f"unknown action {action!r}; use create, list or remove")
        targets = args.get("targets")
        if isinstance(targets, str):
            targets = [targets]
        if targets is not None and (
            not isinstance(targets, list) or not all(isinstance(t, str) for t in targets)
        ):
            raise ToolError("targets must be a list of strings")
        name = str_arg(args, "name", required=False) or None
        timezone = str_arg(args, "timezone", required=False) or None
        return await self.jobs.create(
            ctx,
            prompt=str_arg(args, "prompt"),
            schedule=str_arg(args, "schedule"),
            name=name,
            timezone=timezone,
            targets=targets or None,
        )
