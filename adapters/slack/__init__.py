"""Slack: Socket Mode or Events API in (dispatched by slack-bolt), the Web API out."""

from __future__ import annotations

import re
from collections.abc import Callable

from adapters.slack.config import SlackConfig
from gateway.contracts.adapter import Adapter, AdapterContext
from gateway.contracts.ids import Platform
from gateway.contracts.platform import PlatformSpec, SetupQuestion

PLATFORM = Platform("slack")


def _factory(section: SlackConfig, context: AdapterContext) -> Callable[[], Adapter]:
    from adapters.slack.adapter import SlackAdapter  # noqa: PLC0415

    return lambda: SlackAdapter(section, context.files)


SPEC = PlatformSpec(
    name=PLATFORM,
    config=SlackConfig,
    factory=_factory,
    example="slack:C0123",
    secret_patterns=(re.compile(r"\b((?:xox[a-z]|xapp)-)[A-Za-z0-9-]+"),),
    setup=(
        SetupQuestion("bot_token", "Bot token (xoxb-…, OAuth & Permissions)", secret=True),
        SetupQuestion("app_token", "App-level token for Socket Mode (xapp-…)", secret=True),
    ),
    base_url_key="base_url",
)
"""Slack (`platforms.slack`)."""
