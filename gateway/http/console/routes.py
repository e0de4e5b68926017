"""Mounting the console on the app: its sections, login and logout, static files."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import resources
from typing import Final

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from gateway.http.console.auth import CSRF_COOKIE, CSRF_FIELD, SESSION_COOKIE, SESSION_TTL
from gateway.http.console.gate import ConsoleGate
from gateway.http.console.page import (
    PREFIX,
    Console,
    ConsoleDep,
    LoginNeeded,
    Posted,
    Refused,
    SecurityHeaders,
    is_https,
    on_login_needed,
    on_refused,
    read_form,
)
from gateway.http.console.section import Section
from gateway.http.deps import AppDeps
from gateway.http.local import ServerNames

logger = logging.getLogger("gateway.console")
router = APIRouter()

STATIC: Final = {"console.css": "text/css", "console.js": "text/javascript"}


def install(app: FastAPI, deps: AppDeps, sections: Sequence[Section]) -> None:
    """Serve the console's `sections` under `/console` on `app`."""
    names: ServerNames = app.state.names
    console = Console(deps, sections, names)
    app.state.console = console
    app.add_exception_handler(LoginNeeded, on_login_needed)
    app.add_exception_handler(Refused, on_refused)
    app.include_router(router, prefix=PREFIX, include_in_schema=False)
    for section in sections:
        app.include_router(section.router, prefix=PREFIX, include_in_schema=False)
    # The gate runs first (added last), inside the security headers.
    app.add_middleware(ConsoleGate, prefix=PREFIX, names=names, guard=console.guard)
    app.add_middleware(SecurityHeaders)


def _next(target: str | None) -> str:
    """Where to go after logging in: a console path, never another site."""
    if target and target.startswith(PREFIX) and not target.startswith("//"):
        return target
    return PREFIX


@router.get("/login", response_class=HTMLResponse)
async def login_form(request: Request, console: ConsoleDep) -> Response:
    """The login form (the key is posted, never put in a URL)."""
    target = _next(request.query_params.get("next"))
    if (await console.visitor(request)).allowed:
        return RedirectResponse(target, status_code=303)
    if not console.guard.has_key:
        return console.render(
            request,
            "error.html",
            status=403,
            title="Local only",
            message="The console is only reachable from this machine: set api.key to log "
            "in from elsewhere.",
        )
    return console.render(request, "login.html", title="Log in", next=target, error=None)


@router.post("/login")
async def login(request: Request, console: ConsoleDep) -> Response:
    """Check the key; on success set the session cookie (HttpOnly, SameSite=Strict)."""
    form = await read_form(request)
    visitor = await console.visitor(request)
    if not console.guard.csrf_ok(request.cookies.get(CSRF_COOKIE), form.get(CSRF_FIELD)):
        raise Refused(403, "The form's security token is missing or stale: reload the page.")
    target = _next(form.get("next"))
    wait = console.logins.wait()
    if wait > 0:
        logger.warning("console: login refused (too many failed logins) for %s", visitor.who)
        refusal = console.render(
            request,
            "login.html",
            status=429,
            title="Log in",
            next=target,
            error=f"Too many wrong keys lately: try again in {math.ceil(wait)} s.",
        )
        refusal.headers["retry-after"] = str(math.ceil(wait))
        return refusal
    if not console.guard.key_matches(form.get("key", "")):
        console.logins.failed()
        logger.warning("console: failed login by %s", visitor.who)
        return console.render(
            request,
            "login.html",
            status=401,
            title="Log in",
            next=target,
            error="That is not the API key (api.key).",
        )
    cookie = console.guard.new_session()
    session = console.guard.login(cookie)
    assert session is not None  # just made
    await console.logins_open.open(session.key, datetime.fromtimestamp(session.expires, UTC))
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        cookie,
        max_age=SESSION_TTL,
        path=PREFIX,
        httponly=True,
        samesite="strict",
        secure=is_https(request),
    )
    logger.info("console: login (session %s) by %s", session.short, visitor.who)
    return response


@router.post("/logout")
async def logout(request: Request, console: ConsoleDep, posted: Posted) -> Response:
    """End the session: its row is deleted, so its cookie is refused even when replayed."""
    session = console.guard.login(request.cookies.get(SESSION_COOKIE))
    if session is not None:
        await console.logins_open.close(session.key)
    logger.info("console: logout by %s", posted.who)
    response = RedirectResponse(f"{PREFIX}/login?done=logged-out&id=-", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path=PREFIX)
    return response


@router.get("/static/{name}")
async def static(name: str) -> Response:
    """The stylesheet and the small script of progressive enhancement."""
    media = STATIC.get(name)
    if media is None:
        return Response("not found", status_code=404, media_type="text/plain")
    body = resources.files("gateway.http.console").joinpath("static", name).read_bytes()
    return Response(body, media_type=media, headers={"cache-control": "max-age=300"})
