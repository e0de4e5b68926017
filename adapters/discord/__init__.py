"""Discord: the gateway WebSocket in, the REST API out (discord.py)."""

from __future__ import annotations

from collections.abc import Callable

from adapters.discord.config import DiscordConfig
from gateway.contracts.adapter import Adapter, AdapterContext
from gateway.contracts.ids import Platform
from gateway.contracts.platform import PlatformSpec, SetupQuestion

PLATFORM = Platform("discord")


def _factory(section: DiscordConfig, context: AdapterContext) -> Callable[[], Adapter]:
    from adapters.discord.adapter import DiscordAdapter  # noqa: PLC0415

    return lambda: DiscordAdapter(section, context.files, context.checkpoints)


SPEC = PlatformSpec(
    name=PLATFORM,
    config=DiscordConfig,
    factory=_factory,
    example="discord:123",
    setup=(SetupQuestion("token", "Bot token (Developer Portal → Bot)", secret=True),),
    base_url_key="api_base",
)
"""Discord (`platforms.discord`)."""
