"""Outbound webhooks: the target `webhook:<name>`, a POST of a result as signed JSON.

A chunk for `webhook:<name>` is an outbox row like any other (platform `webhook`, account
`default`, chat `<name>`), so the delivery worker retries it with backoff and dead-letters
it. `WebhookSender` is the "adapter" that sends it:

    POST <url>
    Content-Type: application/json
    X-Herald-Delivery: <the chunk's idempotency key: the same on every retry>
    X-Herald-Timestamp: <Unix time of this try>
    X-Herald-Signature: v1=<hex HMAC-SHA256(secret, "<timestamp>.<body>")>

2xx: delivered. 429: retried after its Retry-After. 408 and 5xx, timeouts and refused
connections: retried with backoff. Any other answer: a dead letter (the receiver refuses it).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any, Self

import httpx

from gateway.contracts.adapter import AdapterState, InboundSink
from gateway.contracts.errors import NotReady, PermanentSendError, RateLimited
from gateway.contracts.ids import AccountId, Platform
from gateway.contracts.messages import DeliveryReceipt, OutboundMessage, SendLimits
from gateway.triggers.config import WebhookConfig

PLATFORM = "webhook"
"""The outbox's platform of outbound webhooks (`webhook:<name>` targets)."""
ACCOUNT = AccountId("default")
LIMITS = SendLimits(max_chunk=1_000_000)
"""One result is one POST: never cut into chunks."""
SIGNATURE = "X-Herald-Signature"
TIMESTAMP = "X-Herald-Timestamp"
DELIVERY = "X-Herald-Delivery"


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """The `X-Herald-Signature` value of `body` sent at `timestamp`."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "v1=" + mac.hexdigest()


def body_of(message: OutboundMessage) -> bytes:
    """The JSON posted for a chunk: its text is a JSON object (a trigger's result) merged
    with `id`, `webhook` and `recovered`; other text goes as `text`."""
    try:
        data = json.loads(message.text)
    except json.JSONDecodeError:
        data = None
    fields: dict[str, Any] = data if isinstance(data, dict) else {"text": message.text}
    out = {
        "id": message.idempotency_key,
        "webhook": str(message.chat_id),
        "recovered": message.recovered,
        **fields,
    }
    return json.dumps(out, ensure_ascii=False).encode()


def _retry_after(value: str | None) -> float:
    try:
        return max(1.0, float(value)) if value else 30.0
    except ValueError:
        return 30.0


class WebhookSender:
    """Sends `webhook:<name>` chunks to the configured URLs; entered once by the supervisor."""

    platform = Platform(PLATFORM)
    account = ACCOUNT
    limits = LIMITS

    def __init__(
        self,
        webhooks: Mapping[str, WebhookConfig],
        *,
        clock: Any = time.time,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.webhooks = dict(webhooks)
        self.clock = clock
        self._client = httpx.AsyncClient(transport=transport, follow_redirects=False)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.aclose()

    async def run(self, sink: InboundSink) -> None:
        """Nothing comes in through an outbound webhook."""
        raise NotImplementedError("outbound webhooks receive nothing")

    def liveness(self) -> AdapterState:
        """Always ready to send (each POST stands alone)."""
        return AdapterState.RECEIVING

    async def send(self, message: OutboundMessage) -> DeliveryReceipt:
        """POST the chunk. Raises RateLimited, NotReady (retry) or PermanentSendError."""
        cfg = self.webhooks.get(str(message.chat_id))
        if cfg is None:
            raise PermanentSendError(
                f"no outbound webhook {message.chat_id!r} is configured (webhooks.<name>)"
            )
        body = body_of(message)
        timestamp = str(int(self.clock()))
        headers = {
            "Content-Type": "application/json",
            DELIVERY: message.idempotency_key,
            TIMESTAMP: timestamp,
            SIGNATURE: signature(cfg.secret.get_secret_value(), timestamp, body),
        }
        try:
            response = await self._client.post(
                cfg.url, content=body, headers=headers, timeout=cfg.timeout
            )
        except httpx.HTTPError as err:
            raise NotReady(f"webhook {message.chat_id}: {type(err).__name__}") from err
        status = response.status_code
        if 200 <= status < 300:
            return DeliveryReceipt(None)
        if status == 429:
            raise RateLimited(_retry_after(response.headers.get("retry-after")))
        if status == 408 or status >= 500:
            raise NotReady(f"webhook {message.chat_id}: the receiver answered {status}")
        raise PermanentSendError(f"webhook {message.chat_id}: the receiver refused it ({status})")
