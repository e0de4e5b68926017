"""Signal: a signal-cli daemon's JSON-RPC over HTTP, its event stream (server-sent events) in."""

from __future__ import annotations

import re
from collections.abc import Callable

from adapters.signal.config import SignalConfig, e164
from gateway.contracts.adapter import Adapter, AdapterContext
from gateway.contracts.ids import Platform
from gateway.contracts.platform import ChatAddress, PlatformSpec, SetupQuestion

PLATFORM = Platform("signal")

_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_GROUP = re.compile(r"^[A-Za-z0-9+/_-]{20,100}={0,2}$")


def _factory(section: SignalConfig, context: AdapterContext) -> Callable[[], Adapter]:
    from adapters.signal.adapter import SignalAdapter  # noqa: PLC0415

    return lambda: SignalAdapter(section, context.files)


def _parse_target(prefix: str, rest: str) -> ChatAddress:
    """`signal:+15551234567` (a person, E.164), `signal:<uuid>`, or `signal:<group id>`."""
    chat = rest.strip()
    if chat.startswith("+") or chat.replace(" ", "").isdigit():
        try:
            return ChatAddress(e164(chat))
        except ValueError as err:
            raise ValueError(f"signal needs an E.164 number like +15551234567: {err}") from err
    if _UUID.match(chat) or _GROUP.match(chat):
        return ChatAddress(chat)
    raise ValueError(
        f"a Signal target is signal:+15551234567, signal:<uuid> or signal:<group id>, not {rest!r}"
    )


SPEC = PlatformSpec(
    name=PLATFORM,
    config=SignalConfig,
    factory=_factory,
    example="signal:+15551234567",
    parse_target=_parse_target,
    setup=(
        SetupQuestion(
            "number", "The Signal account's number, as signal-cli registered it (+15551234567)"
        ),
        SetupQuestion(
            "url",
            "The signal-cli daemon's HTTP address (daemon --http)",
            default="http://127.0.0.1:8080",
        ),
    ),
    base_url_key="url",
)
"""Signal through signal-cli (`platforms.signal`)."""
