"""The scheduler with a fake clock (no real waiting) on SQLite and PostgreSQL: runs delivered
to the home channel, `[SILENT]`, delivery failures, failure notices, restarts mid-run,
catch-up after downtime, and DST timing of cron, interval and one-shot schedules."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, update

from gateway.contracts.errors import LeaseLost
from gateway.contracts.history import ChatMessage, Role
from gateway.cron.scheduler import job_session_key
from gateway.cron.service import JobService, JobSpec
from gateway.store import Store
from gateway.store.instances import Membership
from gateway.store.jobs import DeliveryStatus, JobStore, RunStatus, Trigger
from gateway.store.leases import Lease, Leases
from gateway.store.tables import instances, job_runs
from gateway.supervisor import LeaseRight
from tests.fakes.clock import FakeClock
from tests.fakes.platform import Delivered, RecordingAdapter
from tests.integration.cron_rig import CronRig, ScriptLLM, cron_config, cron_rig
from tests.turns import start_turn

pytestmark = pytest.mark.timeout(60)

BERLIN = "Europe/Berlin"
START = datetime(2026, 11, 23, 7, 0, tzinfo=UTC)
"""A Monday; 09:00 in Berlin is 08:00 UTC."""
NINE = datetime(2026, 11, 23, 8, 0, tzinfo=UTC)


async def no_snapshot(*_: object) -> tuple[str, str]:
    return "", ""


def reports(rig: CronRig, chat: str = "home") -> list[Delivered]:
    """What reached `chat` as a report."""
    return [d for d in rig.adapter.delivered if d.chat_id == chat and d.key.startswith("job:")]


async def test_a_run_is_delivered_to_the_home_channel(store: Store, tmp_path: Path) -> None:
    clock = FakeClock(START)
    async with cron_rig(store, tmp_path, clock) as rig:
        job = await rig.add("summarise what changed", "0 9 * * 1-5", timezone=BERLIN)
        assert rig.service.next_run(job) == NINE
        await rig.at(NINE - timedelta(seconds=1))
        assert await rig.runs(job.id) == []
        await rig.at(NINE)
        [run] = await rig.settled(job.id, 1)
        assert run.scheduled_for == NINE
        assert run.status is RunStatus.OK
        assert run.delivery_status is DeliveryStatus.DELIVERED
        assert run.output == "report: summarise what changed"
        assert [d.text for d in reports(rig)] == [
            f"⏰ {job.name}\n\nreport: summarise what changed"
        ]
        assert not (rig.state_dir / "cron").exists(), "outputs are kept in SQL only"
        # The run is a turn of the job's own session, so the next run sees this one.
        session = await store.get_session(job_session_key(job.id))
        assert session is not None
        assert session.message_count == 2
        await rig.at(NINE + timedelta(days=1))
        await rig.settled(job.id, 2)
        history = await store.load_history(session.id, 10)
        assert [m.role for m in history.messages] == ["user", "assistant", "user", "assistant"]


async def test_silent_is_not_delivered(store: Store, tmp_path: Path) -> None:
    clock = FakeClock(START)
    llm = ScriptLLM(replies={"check the queue": ["[SILENT]"]})
    async with cron_rig(store, tmp_path, clock, llm=llm) as rig:
        job = await rig.add("check the queue", "0 9 * * *", timezone=BERLIN)
        await rig.at(NINE)
        [run] = await rig.settled(job.id, 1)
        assert run.status is RunStatus.OK
        assert run.delivery_status is DeliveryStatus.SUPPRESSED
        assert run.output == "[SILENT]"
        assert await rig.outbox.list() == []
        assert rig.adapter.delivered == []


async def test_a_delivery_failure_is_recorded_and_never_reruns(
    store: Store, tmp_path: Path
) -> None:
    clock = FakeClock(START)
    async with cron_rig(store, tmp_path, clock) as rig:
        rig.adapter.block("home")
        job = await rig.add("daily digest", "0 9 * * *", timezone=BERLIN)
        await rig.at(NINE)
        [run] = await rig.settled(job.id, 1)
        assert run.status is RunStatus.OK
        assert run.delivery_status is DeliveryStatus.FAILED
        assert "blocked" in (run.delivery_detail or "")
        for minutes in (1, 10, 60):
            await rig.at(NINE + timedelta(minutes=minutes))
        assert rig.llm.calls == ["daily digest"]
        assert len(await rig.runs(job.id)) == 1


async def test_a_target_that_cannot_be_resolved_is_a_recorded_failure(
    store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.cron.scheduler")
    clock = FakeClock(START)
    async with cron_rig(store, tmp_path, clock, homes=()) as rig:
        job = await rig.add("nowhere to go", "0 9 * * *", timezone=BERLIN)
        await rig.at(NINE)
        [run] = await rig.settled(job.id, 1)
        assert run.status is RunStatus.OK
        assert run.delivery_status is DeliveryStatus.FAILED
        assert "no home channel" in (run.delivery_detail or "")
    [record] = [r for r in caplog.records if f"job {job.id}: run for" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "cannot be delivered: no home channel" in record.getMessage()


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        pytest.param("", "report: weekly", id="bare"),
        pytest.param("[{id}] {name}", "[{id}] Weekly numbers\n\nreport: weekly", id="custom"),
    ],
)
async def test_the_report_heading_is_configurable(
    store: Store, tmp_path: Path, heading: str, expected: str
) -> None:
    clock = FakeClock(START)
    config = cron_config(report_heading=heading)
    async with cron_rig(store, tmp_path, clock, config=config) as rig:
        job = await rig.add("weekly", "0 9 * * *", timezone=BERLIN, name="Weekly numbers")
        await rig.at(NINE)
        await rig.settled(job.id, 1)
        assert [d.text for d in reports(rig)] == [expected.replace("{id}", job.id)]


async def test_the_owner_is_told_once_after_consecutive_failures(
    store: Store, tmp_path: Path
) -> None:
    clock = FakeClock(START)
    config = cron_config(failure_notice_after=3)
    async with cron_rig(store, tmp_path, clock, config=config) as rig:
        rig.llm.fail("fragile", 4)
        job = await rig.add("fragile", "every 1h", timezone=BERLIN)
        for hour in range(1, 5):
            await rig.at(START + timedelta(hours=hour))
            await rig.settled(job.id, hour)
        runs = await rig.runs(job.id)
        assert [r.status for r in runs] == [RunStatus.FAILED] * 4
        assert all(r.delivery_status is None for r in runs)
        notices = await rig.adapter.wait_for(
            lambda d: any(x.key.startswith("cron-fail:") for x in d)
        )
        [notice] = [d for d in notices if d.key.startswith("cron-fail:")]
        assert notice.chat_id == "home"
        assert "“fragile”" in notice.text
        assert "3 times in a row" in notice.text
        # The job keeps its schedule; a success resets the streak.
        await rig.at(START + timedelta(hours=5))
        runs = await rig.settled(job.id, 5)
        assert runs[-1].status is RunStatus.OK
        await rig.at(START + timedelta(hours=5, minutes=1))
        stored = await rig.service.get(job.id)
        assert stored.consecutive_failures == 0
        assert not stored.failure_notified
        assert len([d for d in rig.adapter.delivered if d.key.startswith("cron-fail:")]) == 1


async def test_a_run_cut_off_by_a_restart_is_not_run_again(store: Store, tmp_path: Path) -> None:
    clock = FakeClock(START)
    held = ScriptLLM(hold=asyncio.Event())
    async with cron_rig(store, tmp_path, clock, llm=held) as rig:
        job = await rig.add("long report", "0 9 * * *", timezone=BERLIN)
        await rig.at(NINE)
        async with asyncio.timeout(10):
            await held.started.wait()
    # Stopped mid-run: the run is recorded interrupted, never re-run, not missed either.
    after = ScriptLLM()
    async with cron_rig(store, tmp_path, clock, llm=after) as rig:
        await rig.at(NINE + timedelta(minutes=5))
        [run] = await rig.runs(job.id)
        assert run.status is RunStatus.INTERRUPTED
        assert after.calls == []
        await rig.at(NINE + timedelta(days=1))
        runs = await rig.settled(job.id, 2)
        assert [r.status for r in runs] == [RunStatus.INTERRUPTED, RunStatus.OK]
        assert after.calls == ["long report"]


async def test_a_run_left_running_by_a_killed_process_is_reaped_not_rerun(
    store: Store, tmp_path: Path
) -> None:
    clock = FakeClock(START)
    async with cron_rig(store, tmp_path, clock, config=cron_config(run_timeout=60)) as rig:
        job = await rig.add("killed", "0 9 * * *", timezone=BERLIN)
    # A process that died without a trace (another instance id) had claimed 09:00.
    assert await JobStore(store).claim(job.id, NINE, "herald-dead", NINE) is not None
    clock.set(NINE + timedelta(seconds=30))
    async with cron_rig(store, tmp_path, clock, config=cron_config(run_timeout=60)) as rig:
        await rig.at(NINE + timedelta(seconds=31))
        [run] = await rig.runs(job.id)
        assert run.status is RunStatus.RUNNING  # its owner may still be working on it
        await rig.at(NINE + timedelta(minutes=3))
        [run] = await rig.runs(job.id)
        assert run.status is RunStatus.INTERRUPTED
        assert rig.llm.calls == []


async def test_a_run_of_an_instance_known_to_be_gone_is_reaped_at_once(
    store: Store, tmp_path: Path
) -> None:
    clock = FakeClock(START)
    async with cron_rig(store, tmp_path, clock, config=cron_config(run_timeout=600)) as rig:
        job = await rig.add("killed", "0 9 * * *", timezone=BERLIN)
    # Another instance claimed 09:00 and then stopped beating (SIGKILL, machine gone).
    async with store.write() as conn:
        await conn.execute(
            insert(instances).values(
                id="herald-dead",
                host="elsewhere",
                pid=1,
                version="0",
                incarnation=1,
                started_at=NINE - timedelta(hours=1),
                heartbeat_at=NINE,
            )
        )
    claimed = await JobStore(store).claim(job.id, NINE, "herald-dead", NINE)
    assert claimed is not None
    session = await store.open_session(
        job_session_key(job.id), platform="cron", user_id=None, snapshot=no_snapshot
    )
    turn_id, _ = await start_turn(store, session.id, ChatMessage(Role.USER, "the job's prompt"))
    async with store.write() as conn:
        await conn.execute(update(job_runs).where(job_runs.c.id == claimed).values(turn_id=turn_id))
    clock.set(NINE + timedelta(seconds=30))
    async with cron_rig(store, tmp_path, clock) as rig:
        await rig.at(NINE + timedelta(seconds=31))
        [run] = await rig.runs(job.id)
        assert run.status is RunStatus.INTERRUPTED, "not after its 10 min timeout: now"
        assert "herald-dead" in (run.error or "")
        assert rig.llm.calls == []
    assert await store.turn_status(turn_id) == "interrupted", "its turn ends with it"


async def test_a_run_counted_as_cut_off_meanwhile_stores_and_delivers_nothing(
    store: Store, tmp_path: Path
) -> None:
    clock = FakeClock(START)
    held = ScriptLLM(hold=asyncio.Event())
    async with cron_rig(store, tmp_path, clock, llm=held) as rig:
        job = await rig.add("slow report", "0 9 * * *", timezone=BERLIN)
        await rig.at(NINE)
        async with asyncio.timeout(10):
            await held.started.wait()
        # This process was paused: another instance counted the run as cut off.
        [run] = await rig.runs(job.id)
        assert await JobStore(store).interrupt(run.id, NINE, "its instance stopped")
        assert held.hold is not None
        held.hold.set()
        async with asyncio.timeout(10):
            while rig.scheduler.active_runs:
                await asyncio.sleep(0.01)
        [run] = await rig.runs(job.id)
        assert run.status is RunStatus.INTERRUPTED
        assert run.output is None
        assert await rig.outbox.unsent(("test", "acct", "home")) is False
        assert rig.adapter.texts("home") == []


async def test_after_downtime_only_the_newest_missed_slot_runs(
    store: Store, tmp_path: Path
) -> None:
    clock = FakeClock(START)
    async with cron_rig(store, tmp_path, clock) as rig:
        job = await rig.add("hourly", "every 1h", timezone=BERLIN)
    # Down from 07:00 until 12:30: the 08..12 slots passed; 12:00 is within the grace.
    clock.set(START + timedelta(hours=5, minutes=30))
    async with cron_rig(store, tmp_path, clock) as rig:
        await rig.at(START + timedelta(hours=5, minutes=31))
        runs = await rig.settled(job.id, 5)
        assert [(r.scheduled_for.hour, r.status) for r in runs] == [
            (8, RunStatus.MISSED),
            (9, RunStatus.MISSED),
            (10, RunStatus.MISSED),
            (11, RunStatus.MISSED),
            (12, RunStatus.OK),
        ]
        assert rig.llm.calls == ["hourly"]
        assert len(reports(rig)) == 1
        # A restart now changes nothing: every slot is already claimed or recorded.
    async with cron_rig(store, tmp_path, clock) as rig:
        await rig.at(START + timedelta(hours=5, minutes=40))
        assert len(await rig.runs(job.id)) == 5
        assert rig.llm.calls == []


async def test_a_slot_older_than_the_grace_is_only_recorded_missed(
    store: Store, tmp_path: Path
) -> None:
    clock = FakeClock(START)
    config = cron_config(catchup_grace=600)
    async with cron_rig(store, tmp_path, clock, config=config) as rig:
        job = await rig.add("daily", "0 9 * * *", timezone=BERLIN)
    clock.set(NINE + timedelta(minutes=30))
    async with cron_rig(store, tmp_path, clock, config=config) as rig:
        await rig.at(NINE + timedelta(minutes=31))
        [run] = await rig.runs(job.id)
        assert run.status is RunStatus.MISSED
        assert rig.llm.calls == []


async def test_paused_jobs_skip_and_resume_from_now(store: Store, tmp_path: Path) -> None:
    clock = FakeClock(START)
    async with cron_rig(store, tmp_path, clock) as rig:
        job = await rig.add("hourly", "every 1h", timezone=BERLIN)
        await rig.service.pause(job.id)
        await rig.at(START + timedelta(hours=3))
        assert await rig.runs(job.id) == []
        await rig.service.resume(job.id)
        await rig.at(START + timedelta(hours=3, minutes=1))
        assert await rig.runs(job.id) == []  # nothing caught up from the pause
        await rig.at(START + timedelta(hours=4))
        [run] = await rig.settled(job.id, 1)
        assert run.scheduled_for == START + timedelta(hours=4)


async def test_run_now_is_taken_by_the_scheduler(store: Store, tmp_path: Path) -> None:
    clock = FakeClock(START)
    async with cron_rig(store, tmp_path, clock) as rig:
        job = await rig.add("on demand", "0 9 * * *", timezone=BERLIN)
        queued = await rig.service.run_now(job.id)
        assert queued.status is RunStatus.QUEUED
        [run] = await rig.settled(job.id, 1)
        assert run.trigger is Trigger.MANUAL
        assert run.delivery_status is DeliveryStatus.DELIVERED
        # A manual run does not use up the scheduled slot.
        await rig.at(NINE)
        await rig.settled(job.id, 2)


async def test_a_run_that_takes_too_long_times_out(store: Store, tmp_path: Path) -> None:
    clock = FakeClock(START)
    held = ScriptLLM(hold=asyncio.Event())
    async with cron_rig(store, tmp_path, clock, llm=held) as rig:
        job = await rig.add("slow", "0 9 * * *", timezone=BERLIN, timeout=0.2)
        await rig.at(NINE)
        [run] = await rig.settled(job.id, 1)
        assert run.status is RunStatus.TIMED_OUT
        assert run.delivery_status is None
        assert "longer than 0.2s" in (run.error or "")


async def test_retention_keeps_the_newest_outputs(store: Store, tmp_path: Path) -> None:
    clock = FakeClock(START)
    async with cron_rig(store, tmp_path, clock, config=cron_config(output_retention=2)) as rig:
        job = await rig.add("hourly", "every 1h", timezone=BERLIN)
        for hour in range(1, 5):
            await rig.at(START + timedelta(hours=hour))
            await rig.settled(job.id, min(hour, 2))
        await rig.wait_runs(
            job.id, lambda runs: len(runs) == 2 and runs[-1].scheduled_for.hour == 11
        )
        assert [r.scheduled_for.hour for r in await rig.runs(job.id)] == [10, 11]


@pytest.mark.parametrize(
    ("schedule", "start", "expected"),
    [
        # Daily 09:30 Berlin across spring forward: 08:30 UTC, then 07:30 UTC.
        (
            "30 9 * * *",
            datetime(2026, 3, 27, 12, 0, tzinfo=UTC),
            ["03-28 08:30", "03-29 07:30", "03-30 07:30"],
        ),
        # Every 90 minutes across fall back: elapsed time, whatever the wall clock does.
        (
            "every 90m",
            datetime(2026, 10, 24, 23, 0, tzinfo=UTC),
            ["10-25 00:30", "10-25 02:00", "10-25 03:30"],
        ),
        # Once at 02:30 local on the fall-back night: the first (summer time) 02:30.
        ("2026-10-25T02:30", datetime(2026, 10, 24, 12, 0, tzinfo=UTC), ["10-25 00:30"]),
    ],
)
async def test_fire_times_across_dst_with_the_fake_clock(
    store: Store, tmp_path: Path, schedule: str, start: datetime, expected: list[str]
) -> None:
    clock = FakeClock(start)
    async with cron_rig(store, tmp_path, clock) as rig:
        job = await rig.add("tick", schedule, timezone=BERLIN)
        seen: list[str] = []
        for n, text in enumerate(expected, start=1):
            when = datetime.strptime(f"2026-{text}", "%Y-%m-%d %H:%M").replace(tzinfo=UTC)
            await rig.at(when - timedelta(seconds=1))
            assert len(await rig.runs(job.id)) == n - 1, f"fired before {text}"
            await rig.at(when)
            runs = await rig.settled(job.id, n)
            seen.append(f"{runs[-1].scheduled_for:%m-%d %H:%M}")
        assert seen == expected
        assert all(r.status is RunStatus.OK for r in await rig.runs(job.id))
        await rig.at(clock.now() + timedelta(days=2))
        if schedule.startswith("2026"):
            assert len(await rig.runs(job.id)) == 1


@pytest.mark.postgres
@pytest.mark.postgres
async def test_a_scheduler_that_lost_its_lease_while_paused_claims_nothing(
    pg_url: str, tmp_path: Path
) -> None:
    """Fencing: the local view still says "held" (the process has not looked at its clock
    yet), but the `cron` lease's token in the database is another's: the claim's own
    transaction refuses it."""
    clock = FakeClock(START)
    async with Store.open(pg_url) as store, cron_rig(store, tmp_path, clock) as rig:
        job = await rig.add("daily", "0 9 * * *", timezone=BERLIN)
    ttl = 15.0
    async with Store.open(pg_url) as store:
        paused, heir = (Leases(store, name, ttl, now=clock.now) for name in ("paused", "heir"))
        for name in ("paused", "heir"):
            await Membership(store, name, ttl, now=clock.now).register()
        lease = Lease("cron", ttl)
        token = await paused.acquire("cron")
        assert token is not None
        lease.granted(token, time.monotonic())
        clock.set(START + timedelta(seconds=2 * ttl))  # paused past the expiry ...
        assert await heir.acquire("cron") == token + 1  # ... and the heir took it
        right = LeaseRight(lease, paused)
        assert await right.holds(), "the paused process has not noticed yet"
        with pytest.raises(LeaseLost):
            await JobStore(store).claim(job.id, NINE, "paused", NINE, fence=right.fence)
        assert await JobStore(store).runs(job.id) == []
        assert await JobStore(store).claim(
            job.id, NINE, "heir", NINE, fence=LeaseRight(Lease("cron", ttl), None).fence
        ), "a single instance's right needs no token"


async def test_two_schedulers_on_one_database_never_fire_a_slot_twice(
    pg_url: str, tmp_path: Path
) -> None:
    clock = FakeClock(START)
    llm = ScriptLLM()
    adapter = RecordingAdapter()
    async with (
        Store.open(pg_url) as first_store,
        Store.open(pg_url) as second_store,
        cron_rig(first_store, tmp_path / "a", clock, llm=llm, adapter=adapter) as a,
        cron_rig(
            second_store, tmp_path / "b", clock, llm=llm, adapter=adapter, instance="herald-b"
        ) as b,
    ):
        every = await a.add("every quarter hour", "every 15m", timezone=BERLIN)
        daily = await b.add("daily", "0 9 * * *", timezone=BERLIN)
        slots = [START + timedelta(minutes=15 * n) for n in range(1, 9)]
        for when in slots:
            clock.set(when)
            a.scheduler.wake()
            b.scheduler.wake()
            await a.settled(every.id, slots.index(when) + 1)
        await a.settled(daily.id, 1)
        runs = await a.runs(every.id)
        assert [r.scheduled_for for r in runs] == slots
        assert all(r.status is RunStatus.OK for r in runs)
        assert sorted(llm.calls) == ["daily"] + ["every quarter hour"] * len(slots)
        owners = {r.owner for r in runs}
        assert owners <= {"herald-a", "herald-b"}
        await adapter.wait_for(lambda d: len(d) >= len(slots) + 1)
        keys = [d.key for d in adapter.delivered]
        assert len(keys) == len(set(keys)) == len(slots) + 1
        # Downtime for both, then both start looking at once: still one catch-up run.
        clock.set(slots[-1] + timedelta(hours=3, minutes=5))
        a.scheduler.wake()
        b.scheduler.wake()
        runs = await a.settled(every.id, len(slots) + 12)
        assert [r.status for r in runs[len(slots) :]] == [RunStatus.MISSED] * 11 + [RunStatus.OK]
        assert llm.calls.count("every quarter hour") == len(slots) + 1


async def test_a_drain_lets_a_running_run_finish_and_starts_no_new_one(
    store: Store, tmp_path: Path
) -> None:
    clock = FakeClock(START)
    held = ScriptLLM(hold=asyncio.Event())
    async with cron_rig(store, tmp_path, clock, llm=held) as rig:
        job = await rig.add("report", "every 1h", timezone=BERLIN)
        await rig.at(START + timedelta(hours=1))
        async with asyncio.timeout(10):
            await held.started.wait()
        async with asyncio.TaskGroup() as tg:
            draining = tg.create_task(rig.scheduler.drain(10))
            clock.set(START + timedelta(hours=2))  # due, but draining: not started
            assert held.hold is not None
            held.hold.set()
            await draining
        [run] = await rig.settled(job.id, 1)
        assert run.status is RunStatus.OK
        assert held.calls == ["report"]


async def test_the_jobs_delivering_to_a_chat_include_those_for_its_home(store: Store) -> None:
    sections = {("test", "acct"), ("twilio", "default")}
    service = JobService(store, configured=sections)
    make = [
        ("to home", ["home"]),
        ("to all homes", ["all"]),
        ("to the chat", ["test:c1"]),
        ("by sms", ["sms:+15551234567"]),
        ("elsewhere", ["test:c2"]),
    ]
    ids = {}
    for name, targets in make:
        job = await service.create(
            JobSpec(prompt=name, schedule="every 1h", name=name, targets=targets),
            created_by="test",
        )
        ids[job.id] = name

    async def names(chat: str, **homes: Any) -> list[str]:
        return [ids[j.id] for j in await service.delivering_to(chat, **homes)]

    assert await names("test:c1") == ["to the chat"]
    assert await names("test:c1", sethome="test:c1") == ["to home", "to all homes", "to the chat"]
    assert await names("test:c1", sethome="test:c9", homes=["test:c1"]) == [
        "to all homes",
        "to the chat",
    ]
    assert await names("test:c1", homes=["test:c1", "test:c9"]) == [
        "to home",
        "to all homes",
        "to the chat",
    ]
    assert await names("twilio:+15551234567") == ["by sms"]
