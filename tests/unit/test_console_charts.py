"""The overview's charts as numbers: buckets, percentiles, stacking, the outbox's depth."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gateway.http.console.charts import BOTTOM, WINDOWS, Chart, build, percentile, seconds
from gateway.store.activity import ActivityRows, Inbound, Queued, Sent, TurnRow

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
HOUR = WINDOWS["hour"]
DAY = WINDOWS["day"]


def ago(minutes: float) -> datetime:
    return NOW - timedelta(minutes=minutes)


def rows(
    inbound: list[Inbound] | None = None,
    sent: list[Sent] | None = None,
    turns: list[TurnRow] | None = None,
    queued: list[Queued] | None = None,
) -> ActivityRows:
    return ActivityRows(inbound or [], sent or [], turns or [], queued or [])


def chart(charts: tuple[Chart, ...], chart_id: str) -> Chart:
    [found] = [c for c in charts if c.id == chart_id]
    return found


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([], 50, None),
        ([3.0], 95, 3.0),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.0),
        ([5.0, 1.0, 4.0, 2.0, 3.0], 50, 3.0),
        ([float(i) for i in range(1, 101)], 95, 95.0),
        ([float(i) for i in range(1, 21)], 95, 19.0),
    ],
)
def test_percentile_is_nearest_rank(values: list[float], q: float, expected: float | None) -> None:
    assert percentile(values, q) == expected


def test_durations_read_at_a_glance() -> None:
    assert seconds(None) == "–"
    assert seconds(0.4212) == "0.42 s"
    assert seconds(42.4) == "42 s"
    assert seconds(210) == "3.5 min"


def test_windows_cut_into_minutes_and_quarter_hours() -> None:
    assert HOUR.buckets == 60
    assert DAY.buckets == 96


def test_an_empty_store_draws_empty_charts_that_say_so() -> None:
    drawn = build(rows(), HOUR, NOW)
    assert len(drawn.charts) == 6
    assert all(c.empty for c in drawn.charts)
    assert all(not c.bars for c in drawn.charts)
    # Only the outbox's depth is drawn, flat at zero: every other line has nothing to measure.
    [flat] = chart(drawn.charts, "chart-outbox").lines
    assert {p.split(",")[1] for p in flat.segments[0].split()} == {f"{BOTTOM:.1f}"}
    assert all(not line.segments for c in drawn.charts[:-1] for line in c.lines)
    assert chart(drawn.charts, "chart-in").summary == "0 messages in the last hour"
    assert chart(drawn.charts, "chart-reply").summary == "no answers timed in the last hour"
    assert drawn.platforms == ()


def test_messages_stack_by_platform_and_older_ones_are_left_out() -> None:
    inbound = [
        Inbound("telegram", ago(0.5), None),
        Inbound("telegram", ago(0.7), None),
        Inbound("slack", ago(0.2), None),
        Inbound("slack", ago(30), None),
        Inbound("slack", ago(61), None),  # before the window
    ]
    drawn = build(rows(inbound), HOUR, NOW)
    messages = chart(drawn.charts, "chart-in")
    assert messages.summary == "4 messages in the last hour (slack 2, telegram 2)"
    assert dict((name, series) for series, name in messages.legend) == {
        "slack": "series-0",
        "telegram": "series-1",
    }
    # The last minute: slack's bar at the bottom, telegram's on top, filling the plot (top 5).
    last = sorted((b for b in messages.bars if "11:59" in b.label), key=lambda b: b.y)
    assert [b.label for b in last] == ["telegram 11:59: 2", "slack 11:59: 1"]
    assert messages.top == "5 per minute"
    assert last[1].y + last[1].height == pytest.approx(BOTTOM)
    assert last[0].y + last[0].height == pytest.approx(last[1].y)
    assert [b.label for b in messages.bars if "11:30" in b.label] == ["slack 11:30: 1"]


def test_reply_times_are_p50_and_p95_per_bucket_and_break_where_nothing_was_answered() -> None:
    inbound = [
        Inbound("telegram", ago(10) + timedelta(seconds=i), ago(10) + timedelta(seconds=i + 1 + i))
        for i in range(20)
    ]
    inbound += [Inbound("telegram", ago(1), ago(1) + timedelta(seconds=3))]
    inbound += [Inbound("telegram", ago(5), None)]  # not answered: not timed
    drawn = build(rows(inbound), HOUR, NOW)
    reply = chart(drawn.charts, "chart-reply")
    assert reply.summary == "21 answers timed: p50 10 s, p95 19 s"
    p50, p95 = reply.lines
    # Two buckets measured, far apart: each a dot, no line between them.
    assert p50.segments == ()
    assert len(p50.dots) == 2
    assert len(p95.dots) == 2
    [line] = drawn.platforms
    assert (line.platform, line.received, line.answered) == ("telegram", 22, 21)
    assert (line.reply_p50, line.reply_p95) == ("10 s", "19 s")


def test_model_time_and_failures_come_from_turns() -> None:
    turns = [
        TurnRow("telegram", ago(3), ago(3) + timedelta(seconds=2), "completed"),
        TurnRow("telegram", ago(2), ago(2) + timedelta(seconds=4), "completed"),
        TurnRow("api", ago(2), ago(2) + timedelta(seconds=1), "failed"),
        TurnRow("telegram", ago(1), None, "running"),
    ]
    drawn = build(rows(turns=turns), HOUR, NOW)
    model = chart(drawn.charts, "chart-model")
    assert model.summary == "2 turns completed: p50 2.00 s, p95 4.00 s"
    assert len(model.lines[0].segments) == 1  # neighbouring minutes: one line
    failures = chart(drawn.charts, "chart-failures")
    assert failures.summary == "1 failed turn in the last hour (api 1) of 4 run"
    assert [b.label for b in failures.bars] == ["api 11:58: 1"]
    assert {p.platform: p.failed_turns for p in drawn.platforms} == {"api": 1, "telegram": 0}


def test_the_outbox_depth_follows_rows_in_and_out_and_dead_letters_count_when_they_died() -> None:
    queued = [
        Queued("telegram", ago(120), None, False),  # waiting since before the window
        Queued("telegram", ago(10.5), ago(5.5), False),  # waited five minutes, then sent
        Queued("slack", ago(3.5), ago(2.5), True),  # died a minute after it was queued
    ]
    drawn = build(rows(queued=queued), HOUR, NOW)
    outbox = chart(drawn.charts, "chart-outbox")
    [depth] = outbox.lines
    assert outbox.summary == "1 to send now, at most 2; 1 dead letter"
    assert len(depth.segments) == 1
    points = [tuple(map(float, p.split(","))) for p in depth.segments[0].split()]
    heights = [round(BOTTOM - y) for _, y in points]
    one = heights[0]
    assert heights.count(2 * one) == 5 + 1  # minutes 49–54 held two rows (10.5 → 5.5 ago)
    [dead] = outbox.bars
    assert dead.label == "dead letters 11:57: 1"
    assert {p.platform: p.dead_letters for p in drawn.platforms} == {"slack": 1, "telegram": 0}


def test_answers_out_and_a_days_window() -> None:
    sent = [
        Sent("api", ago(60 * 5 + 5)),
        Sent("api", ago(60 * 5 + 6)),
        Sent("telegram", ago(60 * 23)),
    ]
    drawn = build(rows(sent=sent), DAY, NOW)
    out = chart(drawn.charts, "chart-out")
    assert out.summary == "3 answers in the last day (api 2, telegram 1)"
    assert out.top == "2 per 15 min"
    assert drawn.start == NOW - timedelta(days=1)


def test_a_row_at_the_windows_end_or_a_little_past_it_counts_in_the_last_bucket() -> None:
    inbound = [
        Inbound("telegram", NOW, None),
        Inbound("telegram", NOW + timedelta(seconds=30), None),  # a peer's clock ahead
        Inbound("telegram", NOW + timedelta(minutes=5), None),  # too far: left out
        Inbound("telegram", NOW - timedelta(hours=1), None),  # the window's first moment
    ]
    messages = chart(build(rows(inbound), HOUR, NOW).charts, "chart-in")
    assert messages.summary == "3 messages in the last hour (telegram 3)"
    assert sorted(b.label for b in messages.bars) == ["telegram 11:00: 1", "telegram 11:59: 2"]


def test_charts_say_when_the_store_held_more_rows_than_one_look_reads() -> None:
    cut = NOW - timedelta(minutes=20)
    drawn = build(ActivityRows([], [], [], [], cut_at=cut), HOUR, NOW)
    assert drawn.cut_at == cut
    older = build(ActivityRows([], [], [], [], cut_at=NOW - timedelta(hours=2)), HOUR, NOW)
    assert older.cut_at is None  # cut before the window: everything in it was read
