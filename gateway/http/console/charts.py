"""The overview's charts: the last hour or day of what the store records, as geometry for
server-rendered SVG (`_charts.html`). Pure: rows and a moment in, numbers out.

Every chart is a row of buckets (a minute over the last hour, 15 minutes over the last
day). Counts are stacked bars, one colour per platform; times are lines (p50 and p95,
nearest-rank), broken where a bucket has nothing to measure.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from gateway.store.activity import ActivityRows

WIDTH = 320
"""The SVG's user units across; it scales to its box (phones included)."""
HEIGHT = 112
LEFT = 4
"""Plot area inside the SVG."""
TOP = 6
BOTTOM = 96
SERIES = 8
SKEW = timedelta(seconds=60)
"""How far past the window's end a row still counts in its last bucket."""
"""Colour classes (`series-0`…`series-7`), reused in order past eight platforms."""


@dataclass(frozen=True, slots=True)
class Window:
    """A span of time cut into equal buckets."""

    name: str
    title: str
    span: timedelta
    step: timedelta
    per: str
    """How a count is read: `per minute`, `per 15 min`."""

    @property
    def buckets(self) -> int:
        return int(self.span / self.step)


WINDOWS = {
    "hour": Window("hour", "Last hour", timedelta(hours=1), timedelta(minutes=1), "per minute"),
    "day": Window("day", "Last day", timedelta(days=1), timedelta(minutes=15), "per 15 min"),
}
"""The windows a visitor can choose (`/console?window=day`)."""


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    series: str
    """CSS class of its colour."""
    label: str
    """Its hover text: platform, bucket, value."""


@dataclass(frozen=True, slots=True)
class Line:
    segments: tuple[str, ...]
    """SVG `points` of each unbroken run."""
    series: str
    name: str
    dots: tuple[tuple[float, float], ...]
    """Buckets measured alone (no neighbour to draw a line to)."""


@dataclass(frozen=True, slots=True)
class Chart:
    """One SVG chart, with a sentence saying what it shows for those who do not see it."""

    id: str
    title: str
    top: str
    """The value of the top of the plot, with its unit."""
    bars: tuple[Bar, ...]
    lines: tuple[Line, ...]
    legend: tuple[tuple[str, str], ...]
    """(series class, name) of each colour drawn."""
    summary: str
    empty: bool


@dataclass(frozen=True, slots=True)
class PlatformLine:
    """One platform's totals over the window."""

    platform: str
    received: int
    answered: int
    reply_p50: str
    reply_p95: str
    failed_turns: int
    dead_letters: int


@dataclass(frozen=True, slots=True)
class Charts:
    """Everything the overview draws for one window."""

    window: Window
    start: datetime
    end: datetime
    charts: tuple[Chart, ...]
    platforms: tuple[PlatformLine, ...]
    cut_at: datetime | None = None
    """Before this moment not every row was read (more than the store's read limit)."""


CHARTS_EVERY = 10.0
"""Seconds a window's charts are kept for every page and live overview open at once (the
rest of the overview is read every `console.live_interval`)."""


class ChartCache:
    """The charts of each window, read at most once per `CHARTS_EVERY` seconds however many
    overviews are open; one read at a time per window."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[float, Charts]] = {}
        self._locks = {name: asyncio.Lock() for name in WINDOWS}

    async def get(
        self, window: Window, read: Callable[[], Awaitable[Charts]], *, fresh: bool = False
    ) -> Charts:
        """The charts of `window`, `read()` when older than `CHARTS_EVERY` (or `fresh`)."""
        async with self._locks[window.name]:
            kept = self._kept.get(window.name)
            if kept is not None and not fresh and time.monotonic() - kept[0] < CHARTS_EVERY:
                return kept[1]
            charts = await read()
            self._kept[window.name] = (time.monotonic(), charts)
            return charts


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank `q`-th percentile (0 < q ≤ 100) of `values`; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def seconds(value: float | None) -> str:
    """A duration to read at a glance: `0.42 s`, `12 s`, `3.5 min`; `–` for none."""
    if value is None:
        return "–"
    if value < 10:
        return f"{value:.2f} s"
    if value < 120:
        return f"{value:.0f} s"
    return f"{value / 60:.1f} min"


class _Buckets:
    def __init__(self, window: Window, end: datetime) -> None:
        self.window = window
        self.count = window.buckets
        self.end = end
        self.start = end - window.span
        self.slot = (WIDTH - LEFT) / self.count

    def index(self, at: datetime) -> int | None:
        """The bucket of `at`; the last one for `at` at the window's end or up to `SKEW`
        past it (written as the window was read, or by a peer whose clock runs ahead)."""
        i = math.floor((at - self.start) / self.window.step)
        if i >= self.count and at <= self.end + SKEW:
            return self.count - 1
        return i if 0 <= i < self.count else None

    def floor(self, at: datetime) -> int:
        """The bucket `at` falls in, clamped to 0…count."""
        return min(max(math.floor((at - self.start) / self.window.step), 0), self.count)

    def moment(self, i: int) -> datetime:
        return self.start + self.window.step * i

    def label(self, i: int) -> str:
        return self.moment(i).strftime("%H:%M")

    def x(self, i: int) -> float:
        return LEFT + i * self.slot


def _scale(top: float) -> float:
    """A round top for the plot at or above `top` (1, 2 or 5 times a power of ten)."""
    if top <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(top))
    for step in (1, 2, 5, 10):
        if step * power >= top:
            return float(step * power)
    return float(10 * power)


def _y(value: float, top: float) -> float:
    return BOTTOM - (BOTTOM - TOP) * min(value, top) / top


def _stacked(
    chart_id: str,
    title: str,
    buckets: _Buckets,
    points: Iterable[tuple[str, datetime]],
    colours: dict[str, str],
    *,
    unit: str,
    extra: str = "",
) -> Chart:
    counts: dict[str, list[int]] = {}
    for platform, at in points:
        i = buckets.index(at)
        if i is not None:
            counts.setdefault(platform, [0] * buckets.count)[i] += 1
    totals = [sum(c[i] for c in counts.values()) for i in range(buckets.count)]
    top = _scale(max(totals, default=0))
    bars: list[Bar] = []
    base = [0] * buckets.count
    for platform in sorted(counts):
        row = counts[platform]
        for i, n in enumerate(row):
            if not n:
                continue
            y0, y1 = _y(base[i], top), _y(base[i] + n, top)
            bars.append(
                Bar(
                    buckets.x(i) + 0.5,
                    y1,
                    max(buckets.slot - 1, 0.5),
                    max(y0 - y1, 0.5),
                    colours[platform],
                    f"{platform} {buckets.label(i)}: {n}",
                )
            )
            base[i] += n
    total = sum(totals)
    by = ", ".join(f"{p} {sum(counts[p])}" for p in sorted(counts))
    noun = unit if total != 1 else unit.removesuffix("s")
    summary = f"{total} {noun} in the {buckets.window.title.lower()}" + (f" ({by})" if by else "")
    return Chart(
        chart_id,
        title,
        f"{top:g} {buckets.window.per}",
        tuple(bars),
        (),
        tuple((colours[p], p) for p in sorted(counts)),
        summary + extra,
        total == 0,
    )


def _line(
    buckets: _Buckets, values: Sequence[float | None], top: float, series: str, name: str
) -> Line:
    segments: list[str] = []
    dots: list[tuple[float, float]] = []
    run: list[tuple[float, float]] = []

    def close() -> None:
        if len(run) > 1:
            segments.append(" ".join(f"{x:.1f},{y:.1f}" for x, y in run))
        elif run:
            dots.append(run[0])
        run.clear()

    for i, v in enumerate(values):
        if v is None:
            close()
            continue
        run.append((buckets.x(i) + buckets.slot / 2, _y(v, top)))
    close()
    return Line(tuple(segments), series, name, tuple(dots))


def _times(
    chart_id: str,
    title: str,
    buckets: _Buckets,
    samples: Iterable[tuple[datetime, float]],
    what: str,
) -> Chart:
    per: list[list[float]] = [[] for _ in range(buckets.count)]
    every: list[float] = []
    for at, value in samples:
        i = buckets.index(at)
        if i is not None:
            per[i].append(value)
            every.append(value)
    p50 = [percentile(v, 50) for v in per]
    p95 = [percentile(v, 95) for v in per]
    top = _scale(max((v for v in p95 if v is not None), default=0.0))
    lines = (
        _line(buckets, p50, top, "series-p50", "p50"),
        _line(buckets, p95, top, "series-p95", "p95"),
    )
    if every:
        summary = (
            f"{len(every)} {what}: p50 {seconds(percentile(every, 50))}, "
            f"p95 {seconds(percentile(every, 95))}"
        )
    else:
        summary = f"no {what} in the {buckets.window.title.lower()}"
    return Chart(
        chart_id,
        title,
        seconds(top),
        (),
        lines,
        (("series-p50", "p50"), ("series-p95", "p95")),
        summary,
        not every,
    )


def _outbox(buckets: _Buckets, rows: ActivityRows) -> Chart:
    """Depth at the end of each bucket (a line) and dead letters by when they died (bars)."""
    count = buckets.count
    # A row waits at the end of bucket i when it was created before that end and had not
    # left by it: buckets [floor(created), floor(left)) — a difference array, not a scan.
    change = [0] * (count + 1)
    dead = [0] * count
    for q in rows.queued:
        first = buckets.floor(q.created_at)
        after = count if q.left_at is None else buckets.floor(q.left_at)
        if first < after:
            change[first] += 1
            change[after] -= 1
        if q.dead and q.left_at is not None:
            i = buckets.index(q.left_at)
            if i is not None:
                dead[i] += 1
    depth: list[int] = []
    running = 0
    for i in range(count):
        running += change[i]
        depth.append(running)
    top = _scale(max([*depth, *dead], default=0))
    bars = tuple(
        Bar(
            buckets.x(i) + 0.5,
            _y(n, top),
            max(buckets.slot - 1, 0.5),
            max(BOTTOM - _y(n, top), 0.5),
            "series-dead",
            f"dead letters {buckets.label(i)}: {n}",
        )
        for i, n in enumerate(dead)
        if n
    )
    line = _line(buckets, [float(d) for d in depth], top, "series-depth", "to send")
    letters = "dead letter" if sum(dead) == 1 else "dead letters"
    summary = f"{depth[-1]} to send now, at most {max(depth, default=0)}; {sum(dead)} {letters}"
    return Chart(
        "chart-outbox",
        "Outbox: depth and dead letters",
        f"{top:g}",
        bars,
        (line,),
        (("series-depth", "to send"), ("series-dead", "dead letters")),
        summary,
        not any(depth) and not any(dead),
    )


def build(rows: ActivityRows, window: Window, now: datetime) -> Charts:
    """The overview's charts of `window` ending at `now`."""
    buckets = _Buckets(window, now)
    platforms = sorted(
        {r.platform for r in rows.inbound}
        | {s.platform for s in rows.sent}
        | {q.platform for q in rows.queued}
        | {t.platform for t in rows.turns}
    )
    colours = {p: f"series-{i % SERIES}" for i, p in enumerate(platforms)}
    replies = [
        (r.received_at, (r.answered_at - r.received_at).total_seconds())
        for r in rows.inbound
        if r.answered_at is not None
    ]
    model = [
        (t.started_at, (t.finished_at - t.started_at).total_seconds())
        for t in rows.turns
        if t.status == "completed" and t.finished_at is not None
    ]
    failed = [(t.platform, t.started_at) for t in rows.turns if t.status == "failed"]
    turns_run = sum(1 for t in rows.turns if buckets.index(t.started_at) is not None)
    charts = (
        _stacked(
            "chart-in",
            "Messages in",
            buckets,
            ((r.platform, r.received_at) for r in rows.inbound),
            colours,
            unit="messages",
        ),
        _stacked(
            "chart-out",
            "Answers out",
            buckets,
            ((s.platform, s.sent_at) for s in rows.sent),
            colours,
            unit="answers",
        ),
        _times("chart-reply", "Reply time", buckets, replies, "answers timed"),
        _times("chart-model", "Model: time per turn", buckets, model, "turns completed"),
        _stacked(
            "chart-failures",
            "Model: failed turns",
            buckets,
            failed,
            colours,
            unit="failed turns",
            extra=f" of {turns_run} run",
        ),
        _outbox(buckets, rows),
    )
    cut = rows.cut_at if rows.cut_at is not None and rows.cut_at > buckets.start else None
    return Charts(window, buckets.start, now, charts, _per_platform(buckets, rows, platforms), cut)


def _per_platform(
    buckets: _Buckets, rows: ActivityRows, platforms: list[str]
) -> tuple[PlatformLine, ...]:
    lines: list[PlatformLine] = []
    failed: dict[str, int] = {}
    for t in rows.turns:
        if t.status == "failed" and buckets.index(t.started_at) is not None:
            failed[t.platform] = failed.get(t.platform, 0) + 1
    for platform in sorted(set(platforms) | set(failed)):
        inbound = [
            r
            for r in rows.inbound
            if r.platform == platform and buckets.index(r.received_at) is not None
        ]
        times = [
            (r.answered_at - r.received_at).total_seconds()
            for r in inbound
            if r.answered_at is not None
        ]
        dead = sum(
            1
            for q in rows.queued
            if q.platform == platform
            and q.dead
            and q.left_at is not None
            and buckets.index(q.left_at) is not None
        )
        lines.append(
            PlatformLine(
                platform,
                len(inbound),
                len(times),
                seconds(percentile(times, 50)),
                seconds(percentile(times, 95)),
                failed.get(platform, 0),
                dead,
            )
        )
    return tuple(lines)
