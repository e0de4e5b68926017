"""Telegram: polling and webhook receivers on python-telegram-bot's `Bot`.

python-telegram-bot 22 warns on every time period it hands out as a number (`RetryAfter`
among them) unless `PTB_TIMEDELTA` opts in to `timedelta`s; the library reads the variable at
each use, so setting it here, before the first request, is enough.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from adapters.telegram.config import TelegramConfig, TelegramMode
from gateway.contracts.adapter import Adapter, AdapterContext
from gateway.contracts.ids import Platform
from gateway.contracts.platform import Host, PlatformSpec, SetupQuestion

os.environ.setdefault("PTB_TIMEDELTA", "true")

PLATFORM = Platform("telegram")


def _factory(section: TelegramConfig, context: AdapterContext) -> Callable[[], Adapter]:
    from adapters.telegram.adapter import FirstStart, TelegramAdapter  # noqa: PLC0415

    first_start = FirstStart()
    return lambda: TelegramAdapter(section, context.files, first_start, menu=context.menu)


def _validate(section: TelegramConfig, host: Host) -> None:
    if section.mode == TelegramMode.WEBHOOK and not host.http_enabled:
        raise ValueError("platforms.telegram.mode webhook needs the HTTP server (api.enabled)")


SPEC = PlatformSpec(
    name=PLATFORM,
    config=TelegramConfig,
    factory=_factory,
    example="telegram:123",
    validate=_validate,
    secret_patterns=(
        # A Bot API path: /bot<id>:<token>/method.
        re.compile(r"(/bot\d+:)[A-Za-z0-9_-]+"),
        # A token anywhere (a base_url without /bot puts it after the port).
        re.compile(r"\b(\d{5,}:)[A-Za-z0-9_-]{30,}"),
    ),
    # A Bot API URL carries the bot token in its path.
    url_loggers=("telegram.Bot", "telegram.request"),
    setup=(SetupQuestion("token", "Bot token from @BotFather (123456:ABC…)", secret=True),),
    base_url_key="base_url",
)
"""Telegram (`platforms.telegram`)."""
