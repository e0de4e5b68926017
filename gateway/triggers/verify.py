"""Verifying a trigger's request over its raw body, and naming its delivery. Pure functions.

Every comparison is constant-time (`hmac.compare_digest`). A request that fails raises
`Unverified` with a reason for the log (the sender is told only 401).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from gateway.triggers.config import Scheme, TriggerConfig

MAX_DELIVERY_ID = 200
_WORD = re.compile(rf"[A-Za-z0-9._:/@+=-]{{1,{MAX_DELIVERY_ID}}}")
"""What a delivery id or an event name may hold as it is (it reaches the prompt, outside the
fence): letters, digits and a few separators; anything else is hashed or dropped."""
"""Characters of a delivery id at most (a longer one is hashed)."""


class Unverified(Exception):
    """The request's signature or token is missing, wrong or stale; the message says which."""


@dataclass(frozen=True, slots=True)
class Verified:
    """A request whose signature holds: the delivery's id and its event, if named."""

    delivery_id: str
    event: str | None
    content_key: str | None = None
    """A hash of what the signature covers (None for a token, which covers nothing): the
    same signed content under another delivery id is a replay."""


def _digest(algorithm: str, key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, algorithm).digest()


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.strip().encode(), expected.encode())


def _fresh(timestamp: str, now: datetime, tolerance: float) -> None:
    try:
        at = int(timestamp)
    except ValueError:
        raise Unverified(f"the timestamp {timestamp[:40]!r} is not a Unix time") from None
    if abs(now.timestamp() - at) > tolerance:
        raise Unverified(f"the timestamp is more than {tolerance:.0f}s away from now")


def _github(key: bytes, headers: Mapping[str, str], body: bytes) -> None:
    given = headers.get("x-hub-signature-256")
    if not given:
        raise Unverified("no X-Hub-Signature-256 header")
    expected = "sha256=" + _digest("sha256", key, body).hex()
    if not _same(given, expected):
        raise Unverified("X-Hub-Signature-256 does not match the body")


def _gitlab(key: bytes, headers: Mapping[str, str]) -> None:
    given = headers.get("x-gitlab-token")
    if not given:
        raise Unverified("no X-Gitlab-Token header")
    if not hmac.compare_digest(given.encode(), key):
        raise Unverified("X-Gitlab-Token is not the secret")


def _stripe(
    cfg: TriggerConfig, key: bytes, headers: Mapping[str, str], body: bytes, now: datetime
) -> bytes:
    """Raises Unverified; what the signature covers."""
    given = headers.get("stripe-signature")
    if not given:
        raise Unverified("no Stripe-Signature header")
    timestamp, signatures = "", []
    for part in given.split(","):
        name, _, value = part.strip().partition("=")
        if name == "t":
            timestamp = value
        elif name == "v1":
            signatures.append(value)
    if not timestamp or not signatures:
        raise Unverified("Stripe-Signature has no t= or no v1=")
    expected = _digest("sha256", key, timestamp.encode() + b"." + body).hex()
    # Every v1 is compared (a secret being rolled has two); no early exit on a match.
    matched = False
    for signature in signatures:
        matched |= _same(signature, expected)
    if not matched:
        raise Unverified("no v1 signature of Stripe-Signature matches the body")
    _fresh(timestamp, now, cfg.tolerance)
    return timestamp.encode() + b"." + body


def _generic(
    cfg: TriggerConfig, key: bytes, headers: Mapping[str, str], body: bytes, now: datetime
) -> bytes:
    """Raises Unverified; what the signature covers."""
    given = headers.get(cfg.header.lower())
    if not given:
        raise Unverified(f"no {cfg.header} header")
    message = body
    timestamp = None
    if cfg.timestamp_header is not None:
        timestamp = headers.get(cfg.timestamp_header.lower())
        if not timestamp:
            raise Unverified(f"no {cfg.timestamp_header} header")
        message = timestamp.strip().encode() + b"." + body
    digest = _digest(cfg.algorithm, key, message)
    given = given.strip()
    if not given.startswith(cfg.prefix):
        raise Unverified(f"{cfg.header} does not start with {cfg.prefix!r}")
    given = given[len(cfg.prefix) :]
    if cfg.encoding == "hex":
        ok = _same(given.lower(), digest.hex())
    else:
        try:
            decoded = base64.b64decode(given, validate=True)
        except (binascii.Error, ValueError):
            decoded = b""
        ok = hmac.compare_digest(decoded, digest)
    if not ok:
        raise Unverified(f"{cfg.header} does not match the body")
    if timestamp is not None:
        _fresh(timestamp.strip(), now, cfg.tolerance)
    return message


def verify(cfg: TriggerConfig, headers: Mapping[str, str], body: bytes, now: datetime) -> Verified:
    """Check the request against the trigger's scheme; its delivery id and event. `headers`
    has lower-case names. Raises Unverified."""
    key = cfg.secret.get_secret_value().encode()
    covered: bytes | None = body
    if cfg.scheme is Scheme.GITHUB:
        _github(key, headers, body)
    elif cfg.scheme is Scheme.GITLAB:
        _gitlab(key, headers)
        covered = None
    elif cfg.scheme is Scheme.STRIPE:
        covered = _stripe(cfg, key, headers, body, now)
    else:
        covered = _generic(cfg, key, headers, body, now)
    content = None if covered is None else "sha256:" + hashlib.sha256(covered).hexdigest()
    return Verified(delivery_id(cfg, headers, body), event_of(cfg, headers, body), content)


_DELIVERY_HEADERS = {
    Scheme.GITHUB: "x-github-delivery",
    Scheme.GITLAB: "x-gitlab-event-uuid",
}
_EVENT_HEADERS = {Scheme.GITHUB: "x-github-event", Scheme.GITLAB: "x-gitlab-event"}


def _json_field(body: bytes, name: str) -> str | None:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, an integer past 4300 digits
        return None
    value = data.get(name) if isinstance(data, dict) else None
    return value if isinstance(value, str) and _WORD.fullmatch(value) else None


def delivery_id(cfg: TriggerConfig, headers: Mapping[str, str], body: bytes) -> str:
    """The id that deduplicates a delivery: the configured or the scheme's header, Stripe's
    event id, else `sha256:<hex of the body>`. One longer than `MAX_DELIVERY_ID` is hashed."""
    name = cfg.delivery_header or _DELIVERY_HEADERS.get(cfg.scheme)
    found = headers.get(name.lower()) if name else None
    if not found and cfg.scheme is Scheme.STRIPE and cfg.delivery_header is None:
        found = _json_field(body, "id")
    if found:
        found = found.strip()
    if not found:
        return "sha256:" + hashlib.sha256(body).hexdigest()
    if not _WORD.fullmatch(found):  # too long, or more than an id's characters: hashed
        return "sha256:" + hashlib.sha256(found.encode()).hexdigest()
    return found


def event_of(cfg: TriggerConfig, headers: Mapping[str, str], body: bytes) -> str | None:
    """The event the request names (a header, or Stripe's `type`), or None."""
    name = cfg.event_header or _EVENT_HEADERS.get(cfg.scheme)
    if name:
        value = headers.get(name.lower())
        return value if value and _WORD.fullmatch(value) else None
    if cfg.scheme is Scheme.STRIPE:
        return _json_field(body, "type")
    return None


def sign(cfg: TriggerConfig, body: bytes, now: datetime, delivery: str) -> dict[str, str]:
    """The headers a sender of the trigger's scheme sends with `body` (what `herald
    triggers test` sends; `verify` accepts them)."""
    key = cfg.secret.get_secret_value().encode()
    headers: dict[str, str] = {"Content-Type": "application/json"}
    timestamp = str(int(now.timestamp()))
    if cfg.scheme is Scheme.GITHUB:
        headers["X-Hub-Signature-256"] = "sha256=" + _digest("sha256", key, body).hex()
    elif cfg.scheme is Scheme.GITLAB:
        headers["X-Gitlab-Token"] = cfg.secret.get_secret_value()
    elif cfg.scheme is Scheme.STRIPE:
        mac = _digest("sha256", key, timestamp.encode() + b"." + body).hex()
        headers["Stripe-Signature"] = f"t={timestamp},v1={mac}"
    else:
        message = body
        if cfg.timestamp_header is not None:
            headers[cfg.timestamp_header] = timestamp
            message = timestamp.encode() + b"." + body
        digest = _digest(cfg.algorithm, key, message)
        encoded = digest.hex() if cfg.encoding == "hex" else base64.b64encode(digest).decode()
        headers[cfg.header] = cfg.prefix + encoded
    name = cfg.delivery_header or _DELIVERY_HEADERS.get(cfg.scheme)
    if name:
        headers[name] = delivery
    return headers
