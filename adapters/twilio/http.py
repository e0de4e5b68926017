"""The twilio SDK's async HTTP client, pointed at `base_url`, with Herald's errors.

The SDK builds every REST URL from its domains' fixed `https://api.twilio.com`; it has no
option for another base. An `HttpClient` is the SDK's documented extension point and sees every
absolute URL just before it is requested, so the one rewrite lives here (`rest_url`).
"""

from __future__ import annotations

import base64
import logging
from typing import Any

import aiohttp
from twilio.http.async_http_client import AsyncTwilioHttpClient
from twilio.http.response import Response

from adapters.twilio.config import PUBLIC_BASE_URL
from gateway.contracts.errors import NotReady, RateLimited

logger = logging.getLogger(__name__)

DEFAULT_RETRY_AFTER = 1.0
"""Seconds to wait after a 429 that says nothing (Twilio's usually do not)."""


def rest_url(url: str, base_url: str) -> str:
    """`url` with the public REST base replaced by `base_url` (other URLs unchanged)."""
    if base_url != PUBLIC_BASE_URL and (
        url == PUBLIC_BASE_URL or url.startswith(PUBLIC_BASE_URL + "/")
    ):
        return base_url + url[len(PUBLIC_BASE_URL) :]
    return url


def basic_auth(user: str, password: str) -> str:
    """An `Authorization` header value for HTTP basic auth."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def retry_after(headers: Any) -> float:
    """Seconds from a `Retry-After` header (a number), else `DEFAULT_RETRY_AFTER`."""
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else DEFAULT_RETRY_AFTER
    except ValueError:
        return DEFAULT_RETRY_AFTER


class TwilioHttp(AsyncTwilioHttpClient):  # type: ignore[misc]
    """`AsyncTwilioHttpClient` (aiohttp, one pooled session) that requests `base_url` instead
    of `https://api.twilio.com`, bounds each request by `timeout`, never retries, and raises
    RateLimited on 429 and NotReady when the server cannot be reached.

    Create it inside the running event loop (it opens its aiohttp session); `close` it.
    """

    def __init__(self, base_url: str, timeout: float) -> None:
        super().__init__(pool_connections=True, timeout=timeout)
        self.base_url = base_url.rstrip("/")

    # The SDK's HttpClient signature, positional parameters and `timeout` included.
    async def request(  # noqa: PLR0917
        self,
        method: str,
        url: str,
        params: dict[str, object] | None = None,
        data: dict[str, object] | None = None,
        headers: dict[str, str] | None = None,
        auth: tuple[str, str] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
        allow_redirects: bool = False,
    ) -> Response:
        """One REST request; 429 → RateLimited, unreachable or too slow → NotReady."""
        target = rest_url(url, self.base_url)
        if auth is not None:
            # As a header: aiohttp deprecates the `BasicAuth` the SDK would build from it.
            headers = {**(headers or {}), "Authorization": basic_auth(*auth)}
        try:
            response: Response = await super().request(
                method,
                target,
                params=params,
                data=data,
                headers=headers,
                auth=None,
                timeout=timeout or self.timeout,
                allow_redirects=allow_redirects,
            )
        except (aiohttp.ClientError, TimeoutError) as err:
            raise NotReady(f"twilio: {method} {target}: {type(err).__name__}: {err}") from err
        if response.status_code == 429:
            raise RateLimited(retry_after(response.headers), f"twilio: {method} {target}: 429")
        return response
