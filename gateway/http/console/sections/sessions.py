"""Sessions: the most recently active ones, full-text search over every transcript, and one
session's transcript with each inbound message's outcome."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response

from gateway.contracts.ids import SessionId
from gateway.http.console.page import ConsoleDep, Refused, Who
from gateway.http.console.section import Section
from gateway.store.inbox import Inbox

router = APIRouter(prefix="/sessions")
SECTION = Section("sessions", "Sessions", router)

LIMIT = 50
"""Sessions or search hits listed."""
TRANSCRIPT = 200
"""Messages of a transcript shown (the newest)."""


@router.get("", response_class=HTMLResponse)
async def sessions(
    request: Request,
    console: ConsoleDep,
    who: Who,
    q: Annotated[str, Query(max_length=200)] = "",
) -> Response:
    """Recent sessions, or the search hits of `q`."""
    store = console.deps.store
    query = q.strip()
    hits = await store.search_messages(query, user_id=None, limit=LIMIT) if query else []
    found = [] if query else await store.list_sessions(limit=LIMIT)
    return console.render(
        request,
        "sessions.html",
        current=SECTION.slug,
        title="Sessions",
        q=query,
        hits=hits,
        sessions=found,
    )


@router.get("/view", response_class=HTMLResponse)
async def session(
    request: Request,
    console: ConsoleDep,
    who: Who,
    key: Annotated[str, Query(min_length=1, max_length=1000)],
    conversation: Annotated[int | None, Query(ge=1, le=2**62)] = None,
) -> Response:
    """One session: its inbound messages with their outcomes, and its transcript (of its
    current conversation, or of the one whose session row id is `conversation`)."""
    store = console.deps.store
    if conversation is None:
        info = await store.get_session(key)
    else:
        info = await store.get_session_by_id(SessionId(conversation))
        if info is None or info.key != key:
            raise Refused(404, f"Session {key!r} has no such conversation.")
    inbound = await Inbox(store).for_session(key, limit=TRANSCRIPT)
    if info is None and not inbound:
        raise Refused(404, f"There is no session {key!r}.")
    messages = [] if info is None else await store.transcript(info.id, limit=TRANSCRIPT)
    return console.render(
        request,
        "session.html",
        current=SECTION.slug,
        title=f"Session {key}",
        key=key,
        info=info,
        inbound=inbound,
        messages=messages,
    )
