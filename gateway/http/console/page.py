"""What every console page shares: templates, who is asking, CSRF-checked forms, the
security headers, and the refusals (login needed, bad token) rendered as pages."""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar
from urllib.parse import parse_qsl, quote

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.http.console.auth import (
    CSRF_COOKIE,
    CSRF_FIELD,
    SESSION_COOKIE,
    Guard,
    Login,
    LoginThrottle,
    Visitor,
)
from gateway.http.console.charts import ChartCache
from gateway.http.console.section import Section
from gateway.http.deps import AppDeps
from gateway.http.local import ServerNames
from gateway.store.console_sessions import ConsoleSessions

logger = logging.getLogger("gateway.console")

PREFIX = "/console"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    # Not no-referrer: under it a browser sends `Origin: null` with a form, and the console
    # checks that a form comes from one of its own pages.
    (b"referrer-policy", b"same-origin"),
)
NOTICES = {
    "retried": "Delivery {id} is queued again.",
    "discarded": "Delivery {id} is discarded.",
    "approved": "Pairing {id} is approved; its sender is told.",
    "rejected": "Pairing {id} is rejected.",
    "queued": "Job {id} is queued to run now.",
    "paused": "Job {id} is paused.",
    "resumed": "Job {id} runs on its schedule again.",
    "skill-approved": "Skill write #{id} is approved and applied.",
    "skill-rejected": "Skill write #{id} is rejected; nothing was written.",
    "skill-shared": "Skill {id} is shared with everyone.",
    "logged-out": "You are logged out.",
}
"""The fixed messages a redirect after an action may show (`?done=<name>&id=<id>`)."""
_NOTICE_ID = re.compile(r"^[\w:.@+-]{1,64}$")
VISITOR = "console_visitor"
"""The `request.state` key of the request's checked visitor."""


class LoginNeeded(Exception):
    """The request is not local and carries no valid session: log in first."""


class Refused(Exception):
    """The console refuses the request (bad CSRF token, unknown item): an error page."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


T = TypeVar("T")


async def found(action: Awaitable[T]) -> T:
    """What `action` returns; its LookupError (an unknown code, id or job) is a 404 page."""
    try:
        return await action
    except LookupError as err:
        raise Refused(404, f"{err}.") from err


@dataclass(frozen=True, slots=True)
class Action:
    """A checked form post: who sent it and its fields."""

    who: str
    form: Mapping[str, str]


class Console:
    """The console of one app: its sections, templates and guard."""

    def __init__(self, deps: AppDeps, sections: Sequence[Section], names: ServerNames) -> None:
        self.deps = deps
        self.sections = tuple(sections)
        self.guard = Guard(deps.config.api.key)
        self.names = names
        self.logins_open = ConsoleSessions(deps.store)
        self.logins = LoginThrottle()
        self.charts = ChartCache()
        self.env = Environment(
            loader=PackageLoader("gateway.http.console", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            # Every value a page shows loses the configured secrets (markup the templates
            # made themselves is left alone: its values went through here already).
            finalize=lambda value: deps.redactor(value) if type(value) is str else value,
        )
        self.env.filters["when"] = when
        self.env.filters["ago"] = ago
        self.env.filters["short"] = short

    async def visitor(self, request: Request) -> Visitor:
        """Who is asking (whether or not they may use the console); a session cookie counts
        while its login's row is open (not logged out on any instance)."""
        known: Visitor | None = getattr(request.state, VISITOR, None)
        if known is not None:
            return known
        login = self.guard.login(request.cookies.get(SESSION_COOKIE))
        if login is not None and not await self.logins_open.is_open(login.key):
            login = None
        visitor = self._visitor(request, login)
        setattr(request.state, VISITOR, visitor)
        return visitor

    def _visitor(self, request: Request, login: Login | None) -> Visitor:
        client = request.client.host if request.client else None
        local = self.names.is_local(request.scope)
        return self.guard.visitor(client, request.headers, local=local, login=login)

    def render(
        self,
        request: Request,
        template: str,
        *,
        status: int = 200,
        current: str | None = None,
        **context: Any,
    ) -> HTMLResponse:
        """A page from `template`, with the CSRF token its forms carry (and the cookie it
        belongs to, set when the browser has none yet)."""
        cookie = request.cookies.get(CSRF_COOKIE)
        fresh = cookie is None
        if cookie is None:
            cookie = self.guard.new_csrf_cookie()
        # A page's visitor was checked already; an error page without one shows no login.
        visitor = getattr(request.state, VISITOR, None) or self._visitor(request, None)
        html = self.env.get_template(template).render(
            sections=self.sections,
            current=current,
            csrf=self.guard.csrf_token(cookie),
            csrf_field=CSRF_FIELD,
            signed_in=visitor.allowed and SESSION_COOKIE in request.cookies,
            notice=_notice(request),
            **context,
        )
        response = HTMLResponse(html, status_code=status)
        if fresh:
            response.set_cookie(
                CSRF_COOKIE,
                cookie,
                path=PREFIX,
                httponly=True,
                samesite="strict",
                secure=is_https(request),
            )
        return response

    def fragment(self, template: str, **context: Any) -> str:
        """A template rendered on its own (the live overview's HTML)."""
        return self.env.get_template(template).render(**context)

    async def action(self, request: Request) -> Action:
        """Check a form post: allowed visitor, valid CSRF token. Raises LoginNeeded or
        Refused (403) and changes nothing."""
        visitor = await self.visitor(request)
        if not visitor.allowed:
            raise LoginNeeded
        form = await read_form(request)
        if not self.guard.csrf_ok(request.cookies.get(CSRF_COOKIE), form.get(CSRF_FIELD)):
            logger.warning(
                "console: refused a form without a valid CSRF token from %s", visitor.who
            )
            raise Refused(403, "The form's security token is missing or stale: reload the page.")
        return Action(visitor.who, form)


def console_of(request: Request) -> Console:
    """The app's console."""
    console: Console = request.app.state.console
    return console


async def allowed_visitor(request: Request) -> Visitor:
    """The visitor of a console page; raises LoginNeeded when they may not see it."""
    visitor = await console_of(request).visitor(request)
    if not visitor.allowed:
        raise LoginNeeded
    return visitor


async def checked_action(request: Request) -> Action:
    """A checked form post (see `Console.action`)."""
    return await console_of(request).action(request)


ConsoleDep = Annotated[Console, Depends(console_of)]
Who = Annotated[Visitor, Depends(allowed_visitor)]
Posted = Annotated[Action, Depends(checked_action)]


async def read_form(request: Request) -> dict[str, str]:
    """The fields of a url-encoded form body (the first value of each). Refused when the
    client went away before it was in (the server cut off a body that took too long)."""
    try:
        raw = await request.body()
    except ClientDisconnect as err:
        raise Refused(400, "The form did not arrive in full: send it again.") from err
    body = raw.decode("utf-8", errors="replace")
    out: dict[str, str] = {}
    for name, value in parse_qsl(body, keep_blank_values=True):
        out.setdefault(name, value)
    return out


def done(path: str, notice: str, item: object) -> RedirectResponse:
    """After an action: back to `path`, showing the fixed `notice` about `item`."""
    return RedirectResponse(f"{path}?done={notice}&id={quote(str(item), safe='')}", status_code=303)


def _notice(request: Request) -> str | None:
    template = NOTICES.get(request.query_params.get("done", ""))
    item = request.query_params.get("id", "")
    if template is None or not _NOTICE_ID.match(item or "-"):
        return None
    return template.format(id=item)


def is_https(request: Request) -> bool:
    """Whether the browser reached us over HTTPS (directly or through a proxy saying so)."""
    return request.url.scheme == "https" or request.headers.get("x-forwarded-proto") == "https"


def when(value: datetime | None) -> str:
    """A timestamp as the console shows it (UTC)."""
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def ago(value: datetime | None, now: datetime | None = None) -> str:
    """How long ago (or in how long) `value` is, in words."""
    if value is None:
        return "never"
    seconds = ((now or datetime.now(UTC)) - value).total_seconds()
    future = seconds < 0
    seconds = abs(seconds)
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size:
            amount = f"{int(seconds // size)} {unit}"
            break
    else:
        amount = f"{int(seconds)} s"
    return f"in {amount}" if future else f"{amount} ago"


def short(text: str, width: int = 120) -> str:
    """`text` on one line, cut to `width` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


async def on_login_needed(request: Request, exc: Exception) -> Response:
    """A page needs a login: a GET goes to the login form, anything else is 401."""
    if request.method == "GET" and not request.url.path.startswith(f"{PREFIX}/events"):
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"{PREFIX}/login?next={quote(target, safe='')}", status_code=303)
    return console_of(request).render(
        request,
        "error.html",
        status=401,
        title="Login needed",
        message="Log in with the API key first.",
    )


async def on_refused(request: Request, exc: Exception) -> Response:
    """A refused request as an error page."""
    assert isinstance(exc, Refused)
    return console_of(request).render(
        request, "error.html", status=exc.status, title="Refused", message=exc.message
    )


class SecurityHeaders:
    """Add the console's security headers (a strict Content-Security-Policy first) to every
    response under `/console`, error pages and redirects included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not (path == PREFIX or path.startswith(PREFIX + "/")):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", []), *SECURITY_HEADERS]
                if not any(name.lower() == b"cache-control" for name, _ in headers):
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)
