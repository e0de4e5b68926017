"""A fake Twilio for the twilio SDK: the Messages REST API, media, and signed webhooks.

The SDK talks to it unmodified but for the REST base (`platforms.twilio.base_url`, which
Herald's HTTP client puts in place of `https://api.twilio.com`).

REST, as Twilio answers it (`/2010-04-01/Accounts/{AccountSid}…`, HTTP basic auth with the
account SID and auth token, or an API key and its secret; a form body):
- `GET  /Accounts/{sid}.json`: the account (`friendly_name`, `status`, `type`).
- `POST /Accounts/{sid}/Messages.json`: `To`, `From`, `Body`, `StatusCallback`, `MediaUrl`
  (repeatable) → the message (`sid` `SM…`, status `queued`). A body longer than 1600
  characters is error 21617. Each `MediaUrl` is fetched at once (Twilio fetches it soon
  after); one that does not answer 200 is error 11200 (HTTP retrieval failure). Each fetch
  is recorded in `media_pulls` (URL, status; 0: no answer).
- `GET  /Accounts/{sid}/Messages/{MessageSid}.json`: a message sent before.
- `GET  /media/{id}`: a medium registered with `add_media`, with basic auth (401 without).
Errors are JSON `{"code", "message", "more_info", "status"}`; 401 is code 20003.

Faults (counted ones count down): `rate_limit(count, retry_after)` (429, code 20429, with
`Retry-After` when given), `fail(count, status)` (5xx), `reject(to, code)` (every send to that
number refused with that Twilio error, e.g. 21211, 21610), `refuse_media(code)` (every send
with media refused), `undeliverable(to, code)` (accepted,
then reported `failed` with that ErrorCode).

Status callbacks: after each accepted message with a `StatusCallback`, the fake posts `sent`
and then `delivered` (or `failed` with `ErrorCode`) to it, signed like Twilio does, and records
each answer in `callbacks`.

Webhooks to Herald: `sign(url, params)` is Twilio's algorithm (HMAC-SHA1 of the URL followed by
each parameter name and value in name order, base64, under the auth token);
`post_inbound(url, From=…, Body=…)` posts a signed inbound message (`message_form` builds one;
`media=` adds MMS media served by the fake), `post_form` posts any form, signed, wrongly signed
or unsigned.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import itertools
import secrets
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes.params import read_params
from tests.fakes.serving import LocalServer, Served
from tests.fakes.waiting import Changes, Waitable

JSON = dict[str, Any]

DEFAULT_ACCOUNT_SID = "AC" + "1f" * 16
DEFAULT_AUTH_TOKEN = "0123456789abcdef0123456789abcdef"
DEFAULT_API_KEY = "SK" + "2e" * 16
DEFAULT_API_SECRET = "herald-api-secret"
HERALD_NUMBER = "+15550001111"
WHATSAPP_NUMBER = "whatsapp:+15550002222"
MAX_BODY = 1600

Signing = Literal["right", "wrong", "none"]


def sign(auth_token: str, url: str, params: Sequence[tuple[str, str]]) -> str:
    """`X-Twilio-Signature` for a form posted to `url`: HMAC-SHA1 under the auth token of the
    URL followed by every name and value, sorted by name (then value), base64."""
    data = url + "".join(name + value for name, value in sorted(params))
    digest = hmac.new(auth_token.encode(), data.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


@dataclass(frozen=True, slots=True)
class Sent:
    """A message Herald created through the REST API."""

    sid: str
    to: str
    from_: str
    body: str
    status_callback: str | None
    auth: str
    """Who called: the basic-auth user (account SID or API key)."""
    media: tuple[bytes, ...] = ()
    """What the fake fetched from each `MediaUrl` (Twilio fetches media itself)."""


@dataclass(frozen=True, slots=True)
class Refused:
    """A REST request the fake refused, and how."""

    method: str
    path: str
    status: int
    code: int
    to: str | None = None


@dataclass(frozen=True, slots=True)
class Callback:
    """A status callback the fake posted, and what Herald answered (0: no answer)."""

    sid: str
    status: str
    answer: int


@dataclass
class _Faults:
    rate_limited: list[tuple[str | None, float | None]] = field(default_factory=list)
    failing: list[int] = field(default_factory=list)
    rejected: dict[str, int] = field(default_factory=dict)
    undeliverable: dict[str, int] = field(default_factory=dict)
    media_refused: int | None = None


def _error(
    status: int, code: int, message: str, headers: Mapping[str, str] | None = None
) -> Response:
    return JSONResponse(
        {
            "code": code,
            "message": message,
            "more_info": f"https://www.twilio.com/docs/errors/{code}",
            "status": status,
        },
        status_code=status,
        headers=dict(headers or {}),
    )


class FakeTwilioServer(Served, Waitable):
    """The fake on 127.0.0.1 (see the module doc). `async with FakeTwilioServer() as twilio:`."""

    def __init__(
        self,
        *,
        account_sid: str = DEFAULT_ACCOUNT_SID,
        auth_token: str = DEFAULT_AUTH_TOKEN,
        api_key: str = DEFAULT_API_KEY,
        api_secret: str = DEFAULT_API_SECRET,
        status: str = "active",
        port: int = 0,
    ) -> None:
        self.account_sid = account_sid
        self.auth_token = auth_token
        self.api_key = api_key
        self.api_secret = api_secret
        self.account_status = status
        self.sent: list[Sent] = []
        self.refused: list[Refused] = []
        self.callbacks: list[Callback] = []
        self.media_fetches: list[str] = []
        self.media_pulls: list[tuple[str, int]] = []
        """Each `MediaUrl` of a send the fake fetched: (URL, HTTP status; 0: no answer)."""
        self.faults = _Faults()
        self._media: dict[str, tuple[bytes, str]] = {}
        self._messages: dict[str, JSON] = {}
        self._ids = itertools.count(1)
        self._changes = Changes()
        self._port = port
        self._local: LocalServer | None = None
        self._http: httpx.AsyncClient | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """The REST base to configure in place of `https://api.twilio.com`."""
        return self.url

    async def _start(self) -> None:
        self._http = httpx.AsyncClient(timeout=10.0, trust_env=False)
        self._local = LocalServer(self._app())
        await self._local.start()

    async def _stop(self) -> None:
        self._changes.stop()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            if self._local is not None:
                await self._local.stop()
        finally:
            if self._http is not None:
                await self._http.aclose()

    def _spawn(self, coroutine: Awaitable[Any]) -> None:
        async def run() -> None:
            await coroutine

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- faults and fixtures ------------------------------------------------------------------

    def rate_limit(
        self, count: int = 1, retry_after: float | None = None, *, to: str | None = None
    ) -> None:
        """The next `count` message sends (to `to`, or to anyone) answer 429 (code 20429),
        with `Retry-After` when given."""
        self.faults.rate_limited.extend([(to, retry_after)] * count)

    def fail(self, count: int = 1, status: int = 503) -> None:
        """The next `count` message sends answer `status` (a 5xx)."""
        self.faults.failing.extend([status] * count)

    def reject(self, to: str, code: int = 21211) -> None:
        """Every send to `to` is refused with Twilio error `code` (HTTP 400)."""
        self.faults.rejected[to] = code

    def refuse_media(self, code: int = 21612) -> None:
        """Every send carrying media is refused with Twilio error `code` (HTTP 400): a
        number that takes no MMS."""
        self.faults.media_refused = code

    def undeliverable(self, to: str, code: int = 30003) -> None:
        """Sends to `to` are accepted, then reported `failed` with ErrorCode `code`."""
        self.faults.undeliverable[to] = code

    def add_media(self, content: bytes, content_type: str) -> str:
        """Register a medium; returns its URL (downloads need the account's basic auth)."""
        media_id = f"ME{secrets.token_hex(16)}"
        self._media[media_id] = (content, content_type)
        return f"{self.base_url}/2010-04-01/Accounts/{self.account_sid}/Media/{media_id}"

    # -- waiting ------------------------------------------------------------------------------

    async def wait_for_sent(self, count: int, timeout: float = 10.0) -> list[Sent]:
        """Wait until `count` messages were created; all of them, in order."""
        return await self._changes.wait_for_items(self.sent, count, timeout)

    def bodies(self, to: str) -> list[str]:
        """The bodies sent to `to`, in order."""
        return [s.body for s in self.sent if s.to == to]

    # -- webhooks to Herald ---------------------------------------------------------------------

    def message_form(
        self,
        from_: str,
        body: str = "",
        *,
        to: str | None = None,
        sid: str | None = None,
        media: Sequence[tuple[bytes, str]] = (),
        profile_name: str | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> list[tuple[str, str]]:
        """An inbound message form as Twilio posts it (`media` registered and linked)."""
        whatsapp = from_.startswith("whatsapp:")
        sid = sid or f"SM{secrets.token_hex(16)}"
        form = [
            ("ToCountry", "US"),
            ("SmsMessageSid", sid),
            ("NumMedia", str(len(media))),
            ("SmsSid", sid),
            ("SmsStatus", "received"),
            ("Body", body),
            ("To", to or (WHATSAPP_NUMBER if whatsapp else HERALD_NUMBER)),
            ("NumSegments", "1"),
            ("MessageSid", sid),
            ("AccountSid", self.account_sid),
            ("From", from_),
            ("ApiVersion", "2010-04-01"),
        ]
        if whatsapp:
            form.append(("ProfileName", profile_name or "Ann"))
            form.append(("WaId", from_.removeprefix("whatsapp:+")))
        for i, (content, content_type) in enumerate(media):
            form.append((f"MediaContentType{i}", content_type))
            form.append((f"MediaUrl{i}", self.add_media(content, content_type)))
        form.extend((extra or {}).items())
        return form

    def signed_request(
        self,
        url: str,
        form: Sequence[tuple[str, str]],
        *,
        signing: Signing = "right",
        signed_url: str | None = None,
    ) -> tuple[dict[str, str], bytes]:
        """The headers and body of `form` posted to `url` as Twilio posts it: signed for
        `signed_url` (default `url`), signed with the wrong token, or unsigned."""
        headers = {
            "Content-Type": "application/x-www-form-urlencoded; charset=utf-8",
            "User-Agent": "TwilioProxy/1.1",
        }
        if signing != "none":
            token = self.auth_token if signing == "right" else "not-the-auth-token"
            headers["X-Twilio-Signature"] = sign(token, signed_url or url, form)
        return headers, urlencode(list(form)).encode()

    async def post_form(
        self,
        url: str,
        form: Sequence[tuple[str, str]],
        *,
        signing: Signing = "right",
        signed_url: str | None = None,
    ) -> httpx.Response:
        """POST `form` to Herald at `url` (see `signed_request`)."""
        assert self._http is not None
        headers, body = self.signed_request(url, form, signing=signing, signed_url=signed_url)
        return await self._http.post(url, content=body, headers=headers)

    async def post_inbound(
        self, url: str, from_: str, body: str = "", **options: Any
    ) -> httpx.Response:
        """POST a signed inbound message (see `message_form`) to Herald at `url`."""
        return await self.post_form(url, self.message_form(from_, body, **options))

    # -- REST ---------------------------------------------------------------------------------

    def _app(self) -> Starlette:
        prefix = "/2010-04-01/Accounts/{account}"
        return Starlette(
            routes=[
                Route(prefix + ".json", self._account, methods=["GET"]),
                Route(prefix + "/Messages.json", self._create, methods=["POST"]),
                Route(prefix + "/Messages/{sid}.json", self._fetch, methods=["GET"]),
                Route(prefix + "/Media/{media}", self._medium, methods=["GET"]),
            ]
        )

    def _who(self, request: Request) -> str | None:
        """The basic-auth user when the credentials are right and for this account."""
        header = request.headers.get("authorization", "")
        if not header.lower().startswith("basic "):
            return None
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except ValueError:
            return None
        known = {self.account_sid: self.auth_token, self.api_key: self.api_secret}
        if known.get(user) != password or request.path_params["account"] != self.account_sid:
            return None
        return user

    def _refuse(self, request: Request, status: int, code: int, to: str | None = None) -> None:
        self.refused.append(Refused(request.method, request.url.path, status, code, to))
        self._changes.notify()

    async def _account(self, request: Request) -> Response:
        if self._who(request) is None:
            self._refuse(request, 401, 20003)
            return _error(401, 20003, "Authenticate")
        return JSONResponse(
            {
                "sid": self.account_sid,
                "friendly_name": "Herald test account",
                "status": self.account_status,
                "type": "Full",
                "owner_account_sid": self.account_sid,
            }
        )

    async def _create(self, request: Request) -> Response:
        who = self._who(request)
        if who is None:
            self._refuse(request, 401, 20003)
            return _error(401, 20003, "Authenticate")
        values, _ = await read_params(
            request, max_part_size=1 << 20, invalid_json=ValueError, not_object=ValueError
        )
        to, sender, body = values.get("To", ""), values.get("From", ""), values.get("Body", "")
        limited = next(
            (i for i, (who, _) in enumerate(self.faults.rate_limited) if who in (None, to)), None
        )
        if limited is not None:
            _, retry_after = self.faults.rate_limited.pop(limited)
            self._refuse(request, 429, 20429, to)
            headers = {} if retry_after is None else {"Retry-After": f"{retry_after:g}"}
            return _error(429, 20429, "Too Many Requests", headers)
        if self.faults.failing:
            status = self.faults.failing.pop(0)
            self._refuse(request, status, status, to)
            return Response("upstream trouble", status_code=status, media_type="text/plain")
        if not to:
            self._refuse(request, 400, 21604, to)
            return _error(400, 21604, "A 'To' phone number is required.")
        if to in self.faults.rejected:
            code = self.faults.rejected[to]
            self._refuse(request, 400, code, to)
            return _error(400, code, f"The message to {to} was refused (error {code}).")
        if len(body) > MAX_BODY:
            self._refuse(request, 400, 21617, to)
            return _error(400, 21617, "The concatenated message body exceeds 1600 characters.")
        urls = [v for k, v in parse_qsl((await request.body()).decode()) if k == "MediaUrl"]
        if urls and self.faults.media_refused is not None:
            code = self.faults.media_refused
            self._refuse(request, 400, code, to)
            return _error(400, code, f"The message with media to {to} was refused ({code}).")
        media: list[bytes] = []
        for url in urls:
            fetched = await self._fetch_media(url)
            if fetched is None:
                self._refuse(request, 400, 11200, to)
                return _error(400, 11200, f"HTTP retrieval failure: {url}")
            media.append(fetched)
        sid = f"SM{next(self._ids):032x}"
        callback = values.get("StatusCallback") or None
        message = {
            "sid": sid,
            "account_sid": self.account_sid,
            "to": to,
            "from": sender,
            "body": body,
            "status": "queued",
            "num_segments": "1",
            "num_media": "0",
            "direction": "outbound-api",
            "api_version": "2010-04-01",
            "error_code": None,
            "error_message": None,
            "uri": f"/2010-04-01/Accounts/{self.account_sid}/Messages/{sid}.json",
        }
        self._messages[sid] = message
        message["num_media"] = str(len(media))
        self.sent.append(Sent(sid, to, sender, body, callback, who, tuple(media)))
        self._changes.notify()
        if callback:
            self._spawn(self._report(sid, callback, self.faults.undeliverable.get(to)))
        return JSONResponse(message, status_code=201)

    async def _fetch_media(self, url: str) -> bytes | None:
        """GET `url` as Twilio's media fetcher does; its body, or None when not 200."""
        try:
            async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
                answer = await client.get(url)
        except httpx.HTTPError:
            self.media_pulls.append((url, 0))
            return None
        self.media_pulls.append((url, answer.status_code))
        return answer.content if answer.status_code == 200 else None

    async def _fetch(self, request: Request) -> Response:
        if self._who(request) is None:
            return _error(401, 20003, "Authenticate")
        message = self._messages.get(request.path_params["sid"])
        if message is None:
            return _error(404, 20404, "The requested resource was not found")
        return JSONResponse(message)

    async def _medium(self, request: Request) -> Response:
        if self._who(request) is None:
            return _error(401, 20003, "Authenticate")
        found = self._media.get(request.path_params["media"])
        if found is None:
            return _error(404, 20404, "The requested resource was not found")
        self.media_fetches.append(request.path_params["media"])
        return Response(found[0], media_type=found[1])

    async def _report(self, sid: str, url: str, error_code: int | None) -> None:
        """Post `sent`, then `delivered` or `failed`, to the message's status callback."""
        final = "delivered" if error_code is None else "failed"
        for status in ("sent", final):
            message = self._messages[sid]
            message["status"] = status
            form = [
                ("MessageSid", sid),
                ("SmsSid", sid),
                ("MessageStatus", status),
                ("SmsStatus", status),
                ("AccountSid", self.account_sid),
                ("From", str(message["from"])),
                ("To", str(message["to"])),
                ("ApiVersion", "2010-04-01"),
            ]
            if status == "failed" and error_code is not None:
                message["error_code"] = error_code
                form.append(("ErrorCode", str(error_code)))
            answer = 0
            with contextlib.suppress(httpx.HTTPError):
                answer = (await self.post_form(url, form)).status_code
            self.callbacks.append(Callback(sid, status, answer))
            self._changes.notify()
