"""Triggers: each configured trigger (its path, scheme, filters, targets, tools and limits;
never its secret) and the newest runs with their outcome. Read-only: triggers are changed
in the config file (`herald triggers add|rm`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from gateway.http.console.page import ConsoleDep, Who
from gateway.http.console.section import Section
from gateway.store.triggers import TriggerRuns
from gateway.triggers.views import describe, run_view

router = APIRouter(prefix="/triggers")
SECTION = Section("triggers", "Triggers", router)
RECENT_RUNS = 50


@router.get("", response_class=HTMLResponse)
async def triggers_page(request: Request, console: ConsoleDep, who: Who) -> Response:
    """The configured triggers and their newest runs."""
    deps = console.deps
    runs = TriggerRuns(deps.store)
    waiting = await runs.waiting()
    configured = [
        describe(name, cfg, waiting.get(name, 0))
        for name, cfg in sorted(deps.config.triggers.items())
    ]
    return console.render(
        request,
        "triggers.html",
        current=SECTION.slug,
        title="Triggers",
        triggers=configured,
        runs=[run_view(r) for r in await runs.runs(limit=RECENT_RUNS)],
        webhooks=sorted(deps.config.webhooks),
    )
