"""`herald jobs …` against a SQLite file under tmp_path (each command in a worker thread)."""

from __future__ import annotations

import json
import re

import pytest
from sqlalchemy import update

from gateway.contracts.messages import utcnow
from gateway.cron.service import JobService
from gateway.store import Store
from gateway.store.jobs import JobStore, RunStatus, Trigger
from gateway.store.tables import job_runs
from tests.unit.cli_harness import Herald

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("clean_environment")]


async def add(herald: Herald, *args: str) -> str:
    """Create a job with the CLI; its id."""
    result = await herald.invoke("jobs", "add", *args)
    assert result.exit_code == 0, result.output
    found = re.search(r"created job (\w+)", result.output)
    assert found is not None, result.output
    return found.group(1)


async def test_add_list_show_pause_resume_rm(herald: Herald) -> None:
    job_id = await add(
        herald,
        "--schedule",
        "0 9 * * 1-5",
        "--prompt",
        "summarise what changed",
        "--name",
        "digest",
        "--tz",
        "Europe/Berlin",
    )
    listed = await herald.invoke("jobs", "list")
    assert listed.exit_code == 0, listed.output
    [line] = [row for row in listed.output.splitlines() if job_id in row]
    assert "digest" in line
    assert "0 9 * * 1-5" in line
    assert "Europe/Berlin" in line
    assert "home" in line
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d$", line)  # active: its next run

    shown = await herald.invoke("jobs", "show", job_id)
    assert shown.exit_code == 0, shown.output
    assert "prompt: summarise what changed" in shown.output
    assert "created by: cli" in shown.output

    paused = await herald.invoke("jobs", "pause", job_id)
    assert paused.exit_code == 0
    rows = (await herald.invoke("jobs", "list")).output.splitlines()
    assert "paused" in next(r for r in rows if job_id in r)
    resumed = await herald.invoke("jobs", "resume", job_id)
    assert resumed.exit_code == 0
    assert "next run" in resumed.output

    removed = await herald.invoke("jobs", "rm", job_id)
    assert removed.exit_code == 0
    assert (await herald.invoke("jobs", "list")).output.strip() == "no jobs"


async def test_run_queues_a_run_and_runs_lists_it(herald: Herald) -> None:
    job_id = await add(herald, "--schedule", "every 2h", "--prompt", "ping")
    queued = await herald.invoke("jobs", "run", job_id)
    assert queued.exit_code == 0, queued.output
    assert "queued run" in queued.output
    async with Store.open(herald.database_url) as store:
        [run] = await JobService(store, configured=()).runs(job_id)
    assert run.status is RunStatus.QUEUED
    assert run.trigger is Trigger.MANUAL
    runs = await herald.invoke("jobs", "runs", job_id)
    assert runs.exit_code == 0, runs.output
    assert "manual" in runs.output
    assert "queued" in runs.output


async def test_bad_input_is_refused_with_the_reason(herald: Herald) -> None:
    bad = await herald.invoke("jobs", "add", "--schedule", "every 5s", "--prompt", "x")
    assert bad.exit_code == 1
    assert "too frequent" in bad.output
    for schedule, reason in (("every 999999999999d", "too long"), ("0 0 31 2 *", "never fires")):
        refused = await herald.invoke("jobs", "add", "--schedule", schedule, "--prompt", "x")
        assert refused.exit_code == 1, refused.output
        assert reason in refused.output
    zone = await herald.invoke(
        "jobs", "add", "--schedule", "0 9 * * *", "--prompt", "x", "--tz", "Nowhere/Land"
    )
    assert zone.exit_code == 1
    assert "unknown time zone" in zone.output
    target = await herald.invoke(
        "jobs", "add", "--schedule", "0 9 * * *", "--prompt", "x", "--target", "slack:C1"
    )
    assert target.exit_code == 1
    assert "platform slack is not configured" in target.output
    for command in ("show", "rm", "pause", "resume", "run", "runs"):
        missing = await herald.invoke("jobs", command, "nope")
        assert missing.exit_code == 1, command
        assert "there is no job 'nope'" in missing.output
    assert (await herald.invoke("jobs", "list")).output.strip() == "no jobs"


async def test_a_job_for_home_without_a_home_channel_is_created_with_a_warning(
    herald: Herald,
) -> None:
    result = await herald.invoke("jobs", "add", "--schedule", "every 2h", "--prompt", "ping")

    assert result.exit_code == 0, result.output
    assert "created job" in result.stdout
    assert "warning: no home channel is set, so its reports go nowhere" in result.stderr


async def test_a_job_for_home_with_a_home_channel_gets_no_warning(herald: Herald) -> None:
    herald.configure(home="telegram:123456789")

    result = await herald.invoke("jobs", "add", "--schedule", "every 2h", "--prompt", "ping")

    assert result.exit_code == 0, result.output
    assert "warning" not in result.output


async def test_run_while_no_daemon_runs_says_when_it_will_run(herald: Herald) -> None:
    job_id = await add(herald, "--schedule", "every 2h", "--prompt", "ping")

    queued = await herald.invoke("jobs", "run", job_id)

    assert queued.exit_code == 0, queued.output
    assert "no Herald daemon is running: it runs when `herald run` starts" in queued.stdout
    assert "the running daemon" not in queued.stdout


async def test_runs_show_why_a_report_was_not_delivered(herald: Herald) -> None:
    job_id = await add(herald, "--schedule", "every 2h", "--prompt", "ping")
    async with Store.open(herald.database_url) as store:
        run = await JobStore(store).queue(job_id, utcnow())
        async with store.write() as conn:
            await conn.execute(
                update(job_runs)
                .where(job_runs.c.id == run.id)
                .values(
                    status="ok",
                    output="pong",
                    finished_at=utcnow(),
                    delivery_status="failed",
                    delivery_detail="no home channel: send /sethome in a chat or set home.targets",
                )
            )

    runs = await herald.invoke("jobs", "runs", job_id)

    assert runs.exit_code == 0, runs.output
    [line] = [row for row in runs.stdout.splitlines() if f"{run.id} " in row]
    assert "ok" in line
    assert "failed" in line
    assert "no home channel" in line


async def test_list_names_each_jobs_profile(herald: Herald) -> None:
    herald.configure(profiles={"work": {"home": "telegram:2"}})
    job_id = await add(herald, "--schedule", "every 2h", "--prompt", "ping", "--profile", "work")
    listed = await herald.invoke("jobs", "list")
    [line] = [row for row in listed.output.splitlines() if job_id in row]
    assert "work" in line.split()  # `home` of this job is work's home, not the default's
    as_json = await herald.invoke("jobs", "list", "--json")
    assert json.loads(as_json.stdout)[0]["profile"] == "work"
