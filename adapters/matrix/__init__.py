"""Matrix: the client-server API through matrix-nio, `/sync` in and `PUT /send` out."""

from __future__ import annotations

import re
from collections.abc import Callable

from adapters.matrix.config import MatrixConfig
from gateway.contracts.adapter import Adapter, AdapterContext
from gateway.contracts.ids import Platform
from gateway.contracts.platform import ChatAddress, PlatformSpec, SetupQuestion

PLATFORM = Platform("matrix")


def _factory(section: MatrixConfig, context: AdapterContext) -> Callable[[], Adapter]:
    from adapters.matrix.adapter import MatrixAdapter  # noqa: PLC0415

    return lambda: MatrixAdapter(section, context.files, context.checkpoints)


def _parse_target(prefix: str, rest: str) -> ChatAddress:
    """`!room:server` or `!room:server:$thread-root` (room ids hold a colon themselves, except
    those of room version 12, `!<hash>`, which hold none)."""
    room, sep, last = rest.rpartition(":")
    thread = last if sep and last.startswith("$") else None
    room = room if thread else rest
    if not room.startswith("!") or len(room) < 2 or "$" in room:
        raise ValueError(
            f"a Matrix target is matrix:!room:server[:$thread] (matrix:!room in room "
            f"version 12), not {rest!r}"
        )
    return ChatAddress(room, thread)


SPEC = PlatformSpec(
    name=PLATFORM,
    config=MatrixConfig,
    factory=_factory,
    example="matrix:!room:example.org",
    parse_target=_parse_target,
    # Bearer headers and `access_token=` are masked for every platform; Synapse's tokens
    # have a shape of their own.
    secret_patterns=(re.compile(r"\b(syt_)[A-Za-z0-9_]{10,}"),),
    # nio logs request paths and whole responses (messages people wrote) at DEBUG.
    url_loggers=("nio.client.async_client", "nio.responses", "nio.http"),
    setup=(
        SetupQuestion("homeserver", "Homeserver URL (https://matrix.example.org)"),
        SetupQuestion("user_id", "The account's Matrix id (@herald:example.org)"),
        SetupQuestion(
            "access_token", "Its access token (Element: Settings → Help & About)", secret=True
        ),
    ),
    base_url_key="homeserver",
)
"""Matrix (`platforms.matrix`)."""
