"""Schedule parsing and fire times (pure: no clock, no store), in Europe/Berlin across both
daylight saving changes of 2026 (clocks forward on 29 March, back on 25 October)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gateway.cron.schedule import Kind, ScheduleError, parse_schedule, stored_schedule

pytestmark = pytest.mark.timeout(30)

BERLIN = "Europe/Berlin"
NOW = datetime(2026, 3, 27, 12, 0, tzinfo=UTC)


def utc(month: int, day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, month, day, hour, minute, tzinfo=UTC)


def fires(text: str, after: datetime, count: int, *, anchor: datetime | None = None) -> list[str]:
    """The next `count` fire times after `after`, as `MM-DD HH:MM` UTC."""
    schedule = parse_schedule(text, BERLIN, now=anchor or after)
    out: list[str] = []
    cursor = after
    for _ in range(count):
        nxt = schedule.next_after(cursor, anchor or after)
        assert nxt is not None
        out.append(f"{nxt:%m-%d %H:%M}")
        cursor = nxt
    return out


def test_daily_cron_follows_the_wall_clock_across_spring_forward() -> None:
    # 09:00 Berlin is 08:00 UTC in winter, 07:00 UTC in summer.
    assert fires("0 9 * * *", utc(3, 27, 12), 3) == ["03-28 08:00", "03-29 07:00", "03-30 07:00"]


def test_daily_cron_follows_the_wall_clock_across_fall_back() -> None:
    assert fires("0 9 * * *", utc(10, 24, 12), 3) == ["10-25 08:00", "10-26 08:00", "10-27 08:00"]


def test_a_time_skipped_by_spring_forward_fires_once_after_the_gap() -> None:
    # 02:30 does not exist on 29 March in Berlin: it fires at 03:30 CEST (01:30 UTC), once.
    assert fires("30 2 * * *", utc(3, 27, 12), 3) == ["03-28 01:30", "03-29 01:30", "03-30 00:30"]


def test_a_time_repeated_by_fall_back_fires_only_the_first_time() -> None:
    # 02:30 happens twice on 25 October (CEST, then CET): only the first one fires.
    assert fires("30 2 * * *", utc(10, 24, 12), 3) == ["10-25 00:30", "10-26 01:30", "10-27 01:30"]


def test_weekday_numbers_are_crontab_numbers() -> None:
    # 1-5 is Monday to Friday as in crontab (APScheduler 3 alone would read Tuesday-Saturday).
    # 2026-03-27 is a Friday.
    assert fires("0 9 * * 1-5", utc(3, 27, 12), 2) == ["03-30 07:00", "03-31 07:00"]
    assert fires("0 9 * * 0", utc(3, 27, 12), 1) == ["03-29 07:00"]
    assert fires("0 9 * * 7", utc(3, 27, 12), 1) == ["03-29 07:00"]
    assert fires("0 9 * * sat,sun", utc(3, 27, 12), 2) == ["03-28 08:00", "03-29 07:00"]


def test_an_interval_is_elapsed_time_across_the_change() -> None:
    # Every 1h from 00:15 UTC on 29 March: the local hour jumps, the interval does not.
    anchor = utc(3, 29, 0, 15)
    assert fires("every 1h", anchor, 3, anchor=anchor) == [
        "03-29 01:15",
        "03-29 02:15",
        "03-29 03:15",
    ]
    assert parse_schedule("every 30m", BERLIN, now=NOW).interval == timedelta(minutes=30)
    assert parse_schedule("every 2 hours", BERLIN, now=NOW).text == "every 2h"


def test_a_one_shot_in_local_time_keeps_its_offset_across_the_change() -> None:
    # A naive ISO time is read in the job's zone: 25 Oct 02:30 is the first (CEST) one.
    schedule = parse_schedule("2026-10-25T02:30", BERLIN, now=NOW)
    assert schedule.kind is Kind.ONCE
    assert schedule.next_after(NOW, NOW) == utc(10, 25, 0, 30)
    assert schedule.next_after(utc(10, 25, 0, 30), NOW) is None
    # 29 Mar 03:30 is summer time already: 01:30 UTC.
    spring = parse_schedule("2026-03-29T03:30:00", BERLIN, now=NOW)
    assert spring.next_after(NOW, NOW) == utc(3, 29, 1, 30)


def test_in_becomes_an_absolute_time() -> None:
    schedule = parse_schedule("in 45m", BERLIN, now=NOW)
    assert schedule.kind is Kind.ONCE
    assert schedule.text == "2026-03-27T13:45:00+01:00"
    assert stored_schedule(schedule.text, BERLIN).next_after(NOW, NOW) == utc(3, 27, 12, 45)


def test_slots_lists_the_fire_times_in_a_window_and_caps_them() -> None:
    schedule = parse_schedule("every 1h", BERLIN, now=NOW)
    slots, older = schedule.slots(NOW, NOW + timedelta(hours=5, minutes=30), NOW, keep=2)
    assert slots == [NOW + timedelta(hours=4), NOW + timedelta(hours=5)]
    assert older == 3


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        ("61 * * * *", "invalid cron expression"),
        ("* * *", "cannot read"),
        ("0 9 * * 8", "out of range"),
        ("every 10s", "too frequent"),
        ("every 3 fortnights", "unknown unit"),
        ("every day", "cannot read"),
        ("in 0m", "not in the future"),
        ("2020-01-01T00:00", "in the past"),
        ("tomorrow at noon", "cannot read"),
        ("every 999999999999d", "too long; at most 3650d"),
        ("in 999999999999d", "too long"),
        ("every " + "9" * 5000 + "d", "too long"),
        ("every 3651d", "too long"),
        ("in 87601h", "too long"),
        ("2040-01-01T00:00", "too far ahead"),
        ("0 0 31 2 *", "never fires"),
        ("0 0 30 2 *", "never fires"),
        ("0 12 31 4,6,9,11 *", "never fires"),
        ("0 0 31 2 1", "never fires"),
    ],
)
def test_bad_schedules_say_why(text: str, reason: str) -> None:
    with pytest.raises(ScheduleError, match=reason):
        parse_schedule(text, BERLIN, now=NOW)


def test_an_unknown_time_zone_is_refused() -> None:
    with pytest.raises(ScheduleError, match="unknown time zone 'Mars/Olympus'"):
        parse_schedule("0 9 * * *", "Mars/Olympus", now=NOW)


@pytest.mark.parametrize("text", ["every 3650d", "in 3650d", "0 0 29 2 *", "0 0 29 2 1"])
def test_the_longest_and_rarest_schedules_still_pass(text: str) -> None:
    schedule = parse_schedule(text, BERLIN, now=NOW)
    assert schedule.next_after(NOW, NOW) is not None
