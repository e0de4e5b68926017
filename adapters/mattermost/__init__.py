"""Mattermost: the REST API v4 out and its websocket event stream in, with a bot's token."""

from __future__ import annotations

import re
from collections.abc import Callable

from adapters.mattermost.config import MattermostConfig
from gateway.contracts.adapter import Adapter, AdapterContext
from gateway.contracts.ids import Platform
from gateway.contracts.platform import ChatAddress, Host, PlatformSpec, SetupQuestion

PLATFORM = Platform("mattermost")

_ID = re.compile(r"^[a-z0-9]{26}$")


def _factory(section: MattermostConfig, context: AdapterContext) -> Callable[[], Adapter]:
    from adapters.mattermost.adapter import MattermostAdapter  # noqa: PLC0415

    return lambda: MattermostAdapter(
        section, context.files, context.checkpoints, webhook=context.webhook
    )


def _parse_target(prefix: str, rest: str) -> ChatAddress:
    """`<channel id>` or `<channel id>:<root post id>` (ids are 26 lowercase letters and
    digits)."""
    channel, _, root = rest.partition(":")
    if not _ID.match(channel) or (root and not _ID.match(root)):
        raise ValueError(
            f"a Mattermost target is mattermost:<channel id>[:<root post id>] (26 letters "
            f"and digits each), not {rest!r}"
        )
    return ChatAddress(channel, root or None)


def _validate(section: MattermostConfig, host: Host) -> None:
    needs_http = section.public_url is not None or section.command_token is not None
    if needs_http and not host.http_enabled:
        raise ValueError(
            "platforms.mattermost.public_url and command_token need Herald's HTTP server "
            "(api.enabled): buttons and slash commands post to it"
        )
    if section.action_secret is not None and section.public_url is None:
        raise ValueError("platforms.mattermost.action_secret needs public_url (for buttons)")


SPEC = PlatformSpec(
    name=PLATFORM,
    config=MattermostConfig,
    factory=_factory,
    example="mattermost:4xp9fdt7pbgium38k5k6w95oaa",
    parse_target=_parse_target,
    validate=_validate,
    # Bearer headers and `access_token=` are masked for every platform; a token posted in
    # the websocket's authentication challenge is masked here.
    secret_patterns=(re.compile(r"(\"token\"\s*:\s*\")[a-z0-9]{26}"),),
    setup=(
        SetupQuestion("url", "Mattermost server URL (https://chat.example.com)"),
        SetupQuestion(
            "token", "The bot account's access token (Integrations → Bot Accounts)", secret=True
        ),
    ),
    base_url_key="url",
)
"""Mattermost (`platforms.mattermost`)."""
