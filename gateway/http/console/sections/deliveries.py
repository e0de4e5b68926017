"""Deliveries: dead letters to retry or discard, and the newest outbound chunks."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from gateway.http.console.page import ConsoleDep, Posted, Who, done, found
from gateway.http.console.section import Section
from gateway.store.outbox import Outbox, OutboxStatus

logger = logging.getLogger("gateway.console")
router = APIRouter(prefix="/deliveries")
SECTION = Section("deliveries", "Deliveries", router)

LIMIT = 50


@router.get("", response_class=HTMLResponse)
async def deliveries(request: Request, console: ConsoleDep, who: Who) -> Response:
    """Dead letters, then the newest chunks of every status."""
    outbox = Outbox(console.deps.store)
    return console.render(
        request,
        "deliveries.html",
        current=SECTION.slug,
        title="Deliveries",
        counts=await outbox.counts(),
        dead=await outbox.list(status=OutboxStatus.DEAD, limit=LIMIT),
        recent=await outbox.list(limit=LIMIT),
    )


@router.post("/{row_id}/retry")
async def retry(row_id: int, console: ConsoleDep, posted: Posted) -> Response:
    """Queue a dead letter again (the delivery worker sends it within seconds)."""
    row = await found(Outbox(console.deps.store).retry(row_id))
    logger.info(
        "console: dead letter %d to %s:%s queued again by %s",
        row.id,
        row.target.platform,
        row.target.chat_id,
        posted.who,
    )
    return done(SECTION.path, "retried", row.id)


@router.post("/{row_id}/discard")
async def discard(row_id: int, console: ConsoleDep, posted: Posted) -> Response:
    """Give up on a dead letter: it is kept as discarded and never sent."""
    row = await found(Outbox(console.deps.store).discard(row_id))
    logger.info(
        "console: dead letter %d to %s:%s discarded by %s",
        row.id,
        row.target.platform,
        row.target.chat_id,
        posted.who,
    )
    return done(SECTION.path, "discarded", row.id)
