"""Schedules: parsing the text a user gives and computing fire times in a time zone.

Four forms: a 5-field cron expression (`0 9 * * 1-5`, day of week 0 or 7 = Sunday, as in
crontab; one that can never fire is refused), `every <n><unit>` (units s, m, h, d; at least a
minute, at most ten years), `in <n><unit>` (once, that long after creation, at most ten years;
stored as the absolute time) and an ISO 8601 timestamp (once, within ten years; without an
offset it is read in the job's time zone). Fire times come from APScheduler 3's triggers.

Daylight saving: a wall-clock time that does not exist (clocks go forward) fires at the
first instant after the gap, once; a wall-clock time that happens twice (clocks go back)
fires only at its first occurrence. Intervals are elapsed time and ignore both.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

TICK = timedelta(microseconds=1)
MIN_INTERVAL = timedelta(minutes=1)
MAX_AHEAD = timedelta(days=3650)
"""The longest interval, and the furthest ahead a one-shot may be: about ten years."""
CRON_HORIZON = timedelta(days=366 * 50)
"""A cron expression must fire within this span (February 29th on a Monday waits 28 years)."""
MAX_STEPS = 100_000
"""Fire times looked at in one enumeration at most (a long downtime of a frequent job)."""

_UNITS = {
    "s": 1,
    "sec": 1,
    "secs": 1,
    "second": 1,
    "seconds": 1,
    "m": 60,
    "min": 60,
    "mins": 60,
    "minute": 60,
    "minutes": 60,
    "h": 3600,
    "hr": 3600,
    "hrs": 3600,
    "hour": 3600,
    "hours": 3600,
    "d": 86400,
    "day": 86400,
    "days": 86400,
}
_RELATIVE = re.compile(r"^(every|in)\s+(\d+)\s*([a-z]+)$")
_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


class ScheduleError(ValueError):
    """A schedule or time zone that cannot be used; the message says why."""


class Kind(StrEnum):
    """What kind of schedule a job has."""

    CRON = "cron"
    INTERVAL = "interval"
    ONCE = "once"


def zone(name: str) -> ZoneInfo:
    """The IANA time zone `name`; ScheduleError when unknown."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as err:
        raise ScheduleError(f"unknown time zone {name!r}") from err


@dataclass(frozen=True, slots=True)
class Schedule:
    """A parsed schedule. `text` is the form stored (a one-shot `in 45m` becomes a time)."""

    text: str
    kind: Kind
    tz: ZoneInfo
    interval: timedelta | None = None
    run_at: datetime | None = None

    def _trigger(self, anchor: datetime) -> CronTrigger | IntervalTrigger | DateTrigger:
        if self.kind is Kind.CRON:
            fields = self.text.split()
            fields[4] = _crontab_days(fields[4])
            return CronTrigger.from_crontab(" ".join(fields), timezone=self.tz)
        if self.kind is Kind.INTERVAL:
            assert self.interval is not None
            return IntervalTrigger(
                seconds=int(self.interval.total_seconds()),
                start_date=anchor + self.interval,
                timezone=self.tz,
            )
        assert self.run_at is not None
        return DateTrigger(self.run_at, timezone=self.tz)

    def next_after(self, after: datetime, anchor: datetime) -> datetime | None:
        """The first fire time strictly after `after` (UTC), or None when there is none.

        `anchor` is when the schedule took effect: intervals count from it.
        """
        trigger = self._trigger(anchor)
        return self._next(trigger, after.astimezone(UTC))

    def _next(
        self, trigger: CronTrigger | IntervalTrigger | DateTrigger, after: datetime
    ) -> datetime | None:
        if self.kind is Kind.ONCE:
            assert self.run_at is not None
            return self.run_at.astimezone(UTC) if self.run_at > after else None
        candidate = after
        for _ in range(4):
            fire: datetime | None = trigger.get_next_fire_time(None, candidate + TICK)
            if fire is None:
                return None
            found = fire.astimezone(UTC)
            if not (self.kind is Kind.CRON and self._repeated(trigger, found)):
                return found
            candidate = found
        return None

    def _repeated(self, trigger: CronTrigger | IntervalTrigger | DateTrigger, at: datetime) -> bool:
        """Whether `at` is the second occurrence of a wall-clock time that also fired first."""
        local = at.astimezone(self.tz)
        if not local.fold:
            return False
        first = local.replace(fold=0).astimezone(UTC)
        if first == at:
            return False
        again = trigger.get_next_fire_time(None, first)
        return again is not None and again.astimezone(UTC) == first

    def slots(
        self, after: datetime, until: datetime, anchor: datetime, *, keep: int
    ) -> tuple[list[datetime], int]:
        """Fire times in (`after`, `until`], oldest first: at most the newest `keep`.

        Returns (those fire times, how many older ones were left out).
        """
        trigger = self._trigger(anchor)
        found: deque[datetime] = deque(maxlen=keep)
        total = 0
        cursor = after.astimezone(UTC)
        for _ in range(MAX_STEPS):
            nxt = self._next(trigger, cursor)
            if nxt is None or nxt > until:
                break
            found.append(nxt)
            total += 1
            cursor = nxt
        else:
            # Too many to walk: keep only the newest, found from just before `until`.
            newest = self._last_before(trigger, until)
            return ([newest] if newest is not None else []), total
        return list(found), total - len(found)

    def _last_before(
        self, trigger: CronTrigger | IntervalTrigger | DateTrigger, until: datetime
    ) -> datetime | None:
        span = self.interval or timedelta(days=1)
        for back in (span, span * 8, timedelta(days=400)):
            cursor = until - back
            last = None
            for _ in range(MAX_STEPS):
                nxt = self._next(trigger, cursor)
                if nxt is None or nxt > until:
                    break
                last = cursor = nxt
            if last is not None:
                return last
        return None


def parse_schedule(text: str, timezone: str, *, now: datetime) -> Schedule:  # noqa: C901 - one branch per schedule syntax
    """Parse a schedule in the time zone `timezone`. Raises ScheduleError with the reason.

    `now` resolves `in <n><unit>`; a one-shot time that is not in the future is refused.
    """
    tz = zone(timezone)
    spec = " ".join(text.strip().split())
    if not spec:
        raise ScheduleError("the schedule is empty")
    lowered = spec.lower()
    relative = _RELATIVE.match(lowered)
    if relative is not None:
        word, amount, unit = relative.groups()
        if unit not in _UNITS:
            raise ScheduleError(f"unknown unit {unit!r} in {spec!r}; use s, m, h or d")
        seconds = int(amount[:16]) * _UNITS[unit]  # 16 digits: past any limit already
        if len(amount) > 16 or seconds > MAX_AHEAD.total_seconds():
            raise ScheduleError(f"{spec!r} is too long; at most {MAX_AHEAD.days}d (ten years)")
        delta = timedelta(seconds=seconds)
        if word == "every":
            if delta < MIN_INTERVAL:
                raise ScheduleError(f"{spec!r} is too frequent; the shortest interval is 1m")
            short = {1: "s", 60: "m", 3600: "h", 86400: "d"}[_UNITS[unit]]
            return Schedule(f"every {int(amount)}{short}", Kind.INTERVAL, tz, interval=delta)
        if delta <= timedelta(0):
            raise ScheduleError(f"{spec!r} is not in the future")
        at = (now + delta).astimezone(tz).replace(microsecond=0)
        return Schedule(at.isoformat(), Kind.ONCE, tz, run_at=at)
    if lowered.startswith(("every", "in ")):
        raise ScheduleError(
            f"cannot read {spec!r}; write it like 'every 30m', 'every 2h' or 'in 45m'"
        )
    if len(spec.split()) == 5:
        try:
            schedule = Schedule(spec, Kind.CRON, tz)
            trigger = schedule._trigger(now)
        except ValueError as err:
            raise ScheduleError(f"invalid cron expression {spec!r}: {err}") from err
        # Bounded: unbounded, APScheduler walks to the year 9999 (a third of a second).
        trigger.end_date = now + CRON_HORIZON
        if trigger.get_next_fire_time(None, now) is None:
            raise ScheduleError(
                f"the cron expression {spec!r} never fires: no date in the next "
                f"{CRON_HORIZON.days // 365} years matches it (check the day of month "
                "against the month)"
            )
        return schedule
    try:
        at = datetime.fromisoformat(spec)
    except ValueError:
        raise ScheduleError(
            f"cannot read {spec!r}: use a 5-field cron expression ('0 9 * * 1-5'), "
            "'every 30m', 'in 45m' or an ISO time ('2026-12-24T18:00')"
        ) from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=tz)
    if at <= now:
        raise ScheduleError(f"{spec!r} is in the past")
    if at - now > MAX_AHEAD:
        raise ScheduleError(f"{spec!r} is too far ahead; at most {MAX_AHEAD.days} days (ten years)")
    return Schedule(at.isoformat(), Kind.ONCE, tz, run_at=at)


def stored_schedule(text: str, timezone: str) -> Schedule:
    """Parse a schedule as stored (one-shots already absolute, past ones allowed)."""
    tz = zone(timezone)
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        return parse_schedule(text, timezone, now=datetime.now(UTC))
    if at.tzinfo is None:
        at = at.replace(tzinfo=tz)
    return Schedule(text, Kind.ONCE, tz, run_at=at)


def _crontab_days(field: str) -> str:
    """A crontab day-of-week field (0 or 7 = Sunday) as APScheduler 3 reads it (names).

    APScheduler 3 numbers days from Monday = 0, so numbers are turned into day names.
    """
    if field == "*" or any(c.isalpha() for c in field):
        return field
    days: set[int] = set()
    for item in field.split(","):
        base, _, step_text = item.partition("/")
        step = int(step_text) if step_text else 1
        if step < 1:
            raise ValueError(f"bad step in day of week {item!r}")
        if base == "*":
            low, high = 0, 6
        elif "-" in base:
            a, b = base.split("-", 1)
            low, high = int(a), int(b)
        else:
            low = high = int(base)
            if step_text:
                high = 6
        if not (0 <= low <= 7 and 0 <= high <= 7) or low > high:
            raise ValueError(f"day of week {item!r} is out of range (0-7, 0 and 7 = Sunday)")
        days.update(d % 7 for d in range(low, high + 1, step))
    return ",".join(_DAY_NAMES[d] for d in sorted(days))
