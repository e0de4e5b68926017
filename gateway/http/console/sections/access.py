"""Access: pending pairing codes to approve or reject, operators, and linked identities."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from gateway.access import Pairings
from gateway.http.console.page import ConsoleDep, Posted, Who, done, found
from gateway.http.console.section import Section

logger = logging.getLogger("gateway.console")
router = APIRouter(prefix="/access")
SECTION = Section("access", "Access", router)


@router.get("", response_class=HTMLResponse)
async def access(request: Request, console: ConsoleDep, who: Who) -> Response:
    """Pending pairings, the operators, and every user with their identities."""
    store = console.deps.store
    return console.render(
        request,
        "access.html",
        current=SECTION.slug,
        title="Access",
        pairings=await Pairings(store).list(),
        operators=console.deps.config.access.operators,
        users=await store.list_users(),
    )


@router.post("/pairings/{code}/approve")
async def approve(code: str, console: ConsoleDep, posted: Posted) -> Response:
    """Let the code's sender talk to the agent; they are told."""
    pairing = await found(Pairings(console.deps.store).approve_and_tell(code))
    logger.info(
        "console: pairing %s of %s:%s approved by %s",
        pairing.code,
        pairing.platform,
        pairing.external_id,
        posted.who,
    )
    return done(SECTION.path, "approved", pairing.code)


@router.post("/pairings/{code}/reject")
async def reject(code: str, console: ConsoleDep, posted: Posted) -> Response:
    """Refuse the code: its sender gets no access."""
    pairing = await found(Pairings(console.deps.store).reject(code))
    logger.info(
        "console: pairing %s of %s:%s rejected by %s",
        pairing.code,
        pairing.platform,
        pairing.external_id,
        posted.who,
    )
    return done(SECTION.path, "rejected", pairing.code)
