"""The overview: adapters, turns, outbox, cron and the model at a glance, kept live over
server-sent events (`/console/events`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response, StreamingResponse

from gateway.http.console import charts as drawn
from gateway.http.console.page import Console, ConsoleDep, Refused, Who
from gateway.http.console.section import Section
from gateway.http.deps import AppDeps
from gateway.store.activity import Activity
from gateway.store.inbox import ApiMessage, Inbox, InboxRow
from gateway.store.outbox import Outbox

logger = logging.getLogger("gateway.console")
router = APIRouter()
SECTION = Section("overview", "Overview", router)

RECENT = 10
"""Inbound messages the overview lists."""
NEXT_RUNS = 5
"""Scheduled jobs the overview lists, soonest first."""
KEEPALIVE = 15.0
"""Seconds of an unchanged overview after which an SSE comment keeps proxies from
timing the stream out."""


@dataclass(frozen=True, slots=True)
class AdapterLine:
    """One adapter's row."""

    name: str
    state: str
    last_inbound: datetime | None


@dataclass(frozen=True, slots=True)
class RecentLine:
    """One of the latest messages, from a platform (the inbox) or the API and terminal."""

    received_at: datetime
    platform: str
    session_key: str
    sender: str
    text: str
    outcome: str


API_OUTCOMES = {"completed": "answered", None: "pending"}
"""An API question's outcome, read from its turn's status (else the status itself)."""


def _recent(inbound: list[InboxRow], api: list[ApiMessage]) -> list[RecentLine]:
    """The newest RECENT messages of both sources, newest first."""
    lines = [
        RecentLine(
            r.received_at,
            r.platform,
            r.session_key,
            r.sender_name or r.sender_id,
            r.text,
            str(r.outcome or r.status),
        )
        for r in inbound
    ] + [
        RecentLine(
            m.received_at,
            "api",
            m.session_key,
            m.session_key.split(":", 2)[-1],
            m.text,
            API_OUTCOMES.get(m.turn_status, m.turn_status or "pending"),
        )
        for m in api
    ]
    lines.sort(key=lambda line: line.received_at, reverse=True)
    return lines[:RECENT]


@dataclass(frozen=True, slots=True)
class JobLine:
    """One scheduled job's row."""

    id: str
    name: str
    next_run: datetime | None
    enabled: bool


def window_of(request: Request) -> drawn.Window:
    """The charts' window a visitor asked for (`?window=hour|day`, hour by default).
    Raises Refused (400) naming the choices for any other."""
    name = request.query_params.get("window", "hour")
    window = drawn.WINDOWS.get(name)
    if window is None:
        raise Refused(
            400, f"Unknown chart window {name[:40]!r}: choose one of {', '.join(drawn.WINDOWS)}."
        )
    return window


async def read_charts(deps: AppDeps, window: drawn.Window) -> drawn.Charts:
    """The charts of `window`, ending now, from what the store recorded; drawn in a worker
    thread (a day of rows is some work) so the loop stays free."""
    start = datetime.now(UTC) - window.span
    queued_since = start - timedelta(seconds=deps.config.delivery.max_age)
    rows = await Activity(deps.store).since(start, queued_since=queued_since)
    now = datetime.now(UTC)  # after the read: what it found is inside the window
    return await asyncio.to_thread(drawn.build, rows, window, now)


CHART_GEOMETRY = {
    "width": drawn.WIDTH,
    "height": drawn.HEIGHT,
    "left": drawn.LEFT,
    "top": drawn.TOP,
    "bottom": drawn.BOTTOM,
    "windows": list(drawn.WINDOWS.values()),
}


async def gather(deps: AppDeps, charts: drawn.Charts) -> dict[str, Any]:
    """What the overview shows, read from the daemon and its database now (`charts` are
    read apart, less often)."""
    inbox = Inbox(deps.store)
    last = await inbox.last_received()
    adapters = [
        AdapterLine(name, str(state), last.get(name))
        for name, state in sorted(deps.adapters().items())
    ]
    counts = await inbox.counts()
    outbox = await Outbox(deps.store).counts()
    jobs: list[JobLine] = []
    if deps.jobs is not None:
        for job in await deps.jobs.find():
            jobs.append(JobLine(job.id, job.name, deps.jobs.next_run(job), job.enabled))
        far = datetime.max.replace(tzinfo=UTC)
        jobs.sort(key=lambda j: (j.next_run is None, j.next_run or far))
    recent = _recent(await inbox.recent(limit=RECENT), await inbox.recent_api(limit=RECENT))
    health = deps.llm_health
    return {
        "status": "draining" if deps.state.draining else "serving",
        "store": deps.store.health.describe(),
        "store_ok": deps.store.health.degraded is None,
        "adapters": adapters,
        "turns_running": deps.manager.active_turns,
        "messages_waiting": counts.get("pending", 0),
        "api_waiting": deps.manager.api.waiting,
        "outbox_pending": outbox.get("pending", 0) + outbox.get("sending", 0),
        "dead_letters": outbox.get("dead", 0),
        "jobs": jobs[:NEXT_RUNS],
        "job_count": len(jobs),
        "llm": {
            "provider": deps.llm_provider,
            "model": deps.llm_model,
            "state": str(health.state),
            "detail": health.describe(),
            "since": health.since,
            "error": health.error,
        },
        "memory": dict(deps.memory()),
        "recent": recent,
        "now": datetime.now(UTC),
        "charts": charts,
        **CHART_GEOMETRY,
    }


@router.get("", response_class=HTMLResponse)
async def overview(request: Request, console: ConsoleDep, who: Who) -> Response:
    """The overview page; its live part is refreshed through `/console/events`."""
    window = window_of(request)
    charts = await console.charts.get(window, lambda: read_charts(console.deps, window), fresh=True)
    data = await gather(console.deps, charts)
    live = console.fragment("_overview.html", **data)
    return console.render(
        request,
        "overview.html",
        current=SECTION.slug,
        title="Overview",
        live=live,
        events=f"/console/events?window={window.name}",
    )


@router.get("/events")
async def events(request: Request, console: ConsoleDep, who: Who) -> Response:
    """Server-sent events: `overview` with the live part's HTML whenever it changes. The
    stream ends as soon as the daemon starts draining (then 503: a reload finds the next)."""
    window = window_of(request)
    if console.deps.state.draining:
        return Response("draining", status_code=503, media_type="text/plain")
    return StreamingResponse(
        _stream(request, console.deps, console, window),
        media_type="text/event-stream",
        headers={"x-accel-buffering": "no"},
    )


async def _stream(
    request: Request, deps: AppDeps, console: Console, window: drawn.Window
) -> AsyncIterator[str]:
    interval = deps.config.console.live_interval
    last = ""
    quiet = 0.0
    yield "retry: 3000\n\n"
    while not deps.state.draining:
        if await request.is_disconnected():
            return
        try:
            charts = await console.charts.get(window, lambda: read_charts(deps, window))
            html = console.fragment("_overview.html", **await gather(deps, charts))
        except Exception:  # a database that refuses reads now; the next look may work
            logger.warning("console: the live overview could not be read", exc_info=True)
            html = last
        if html != last:
            last, quiet = html, 0.0
            yield "event: overview\n" + "".join(f"data: {line}\n" for line in html.split("\n"))
            yield "\n"
        elif quiet >= KEEPALIVE:
            quiet = 0.0
            yield ": still here\n\n"
        await asyncio.sleep(interval)
        quiet += interval
