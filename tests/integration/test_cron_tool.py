"""The `schedule_job` tool over the real job service and store (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from agent_core.tools import ScheduleJobTool, ToolContext, ToolError
from gateway.contracts.ids import SessionKey
from gateway.cron.service import AgentJobs, JobService
from gateway.store import Store
from tests.fakes.clock import FakeClock

pytestmark = pytest.mark.timeout(60)

NOW = datetime(2026, 11, 23, 7, 0, tzinfo=UTC)


async def context(store: Store, key: str, user: str) -> ToolContext:
    user_id = await store.resolve_user("test", user)

    async def empty(*_: object) -> tuple[str, str]:
        return "", ""

    session = await store.open_session(
        SessionKey(key), platform="test", user_id=user_id, snapshot=empty
    )
    return ToolContext(session=session, user_id=user_id)


async def test_create_list_remove_for_the_asking_user(store: Store) -> None:
    service = JobService(store, configured={("test", "acct")}, clock=FakeClock(NOW))
    tool = ScheduleJobTool(AgentJobs(service))
    ada = await context(store, "test:acct:c1", "ada")
    bob = await context(store, "test:acct:c2", "bob")

    created = await tool({"action": "create", "prompt": "news digest", "schedule": "every 2h"}, ada)
    assert created.startswith("Scheduled: ")
    [job] = await service.find()
    assert job.targets == ("test:c1",)  # the asking chat by default
    assert job.user_id == ada.user_id
    assert job.created_by == ada.user_id
    assert job.id in await tool({"action": "list"}, ada)
    assert await tool({"action": "list"}, bob) == "No scheduled jobs."
    with pytest.raises(ToolError, match="no job"):
        await tool({"action": "remove", "job_id": job.id}, bob)
    with pytest.raises(ToolError, match="too frequent"):
        await tool({"action": "create", "prompt": "x", "schedule": "every 1s"}, ada)
    for schedule, reason in (("every 999999999999d", "too long"), ("0 0 31 2 *", "never fires")):
        with pytest.raises(ToolError, match=reason):
            await tool({"action": "create", "prompt": "x", "schedule": schedule}, ada)
    with pytest.raises(ToolError, match="not configured"):
        await tool(
            {"action": "create", "prompt": "x", "schedule": "in 5m", "targets": ["slack:C1"]},
            ada,
        )
    assert await tool({"action": "remove", "job_id": job.id}, ada) == f"Removed job {job.id}."
    assert await service.find() == []


async def test_only_an_operator_schedules_reports_to_other_chats(store: Store) -> None:
    """A person may schedule only for the chat they are in; home, all and other people's
    chats are the operator's to choose (a phishing job to someone else is refused)."""
    service = JobService(store, configured={("test", "acct")}, clock=FakeClock(NOW))
    tool = ScheduleJobTool(AgentJobs(service))
    bob = await context(store, "test:acct:1002", "1002")
    for targets in (["test:1001"], ["home"], ["all"], ["test:1002", "test:1001"]):
        with pytest.raises(ToolError, match="only to this chat"):
            await tool(
                {"action": "create", "prompt": "x", "schedule": "in 5m", "targets": targets}, bob
            )
    assert await service.find() == []
    mine = await tool(
        {"action": "create", "prompt": "x", "schedule": "in 5m", "targets": ["test:1002"]}, bob
    )
    assert mine.startswith("Scheduled: ")

    owner = await context(store, "test:acct:1001", "1001")
    as_operator = ToolContext(session=owner.session, user_id=owner.user_id, operator=True)
    done = await tool(
        {"action": "create", "prompt": "y", "schedule": "in 5m", "targets": ["home", "test:7"]},
        as_operator,
    )
    assert done.startswith("Scheduled: ")
    assert sorted(j.targets for j in await service.find()) == [("home", "test:7"), ("test:1002",)]


async def test_a_job_run_by_a_non_operator_cannot_schedule_more(store: Store) -> None:
    """A job's run has no chat of its own: only an operator's job may schedule from it."""
    service = JobService(store, configured={("test", "acct")}, clock=FakeClock(NOW))
    tool = ScheduleJobTool(AgentJobs(service))
    run = await context(store, "cron:job:abc", "1002")
    with pytest.raises(ToolError, match="only Herald's operator"):
        await tool({"action": "create", "prompt": "x", "schedule": "in 5m"}, run)
    assert await service.find() == []
