"""Twilio: SMS and WhatsApp by signed webhooks in, the Messages REST API out (twilio SDK)."""

from __future__ import annotations

import re
from collections.abc import Callable

from adapters.twilio.config import WHATSAPP, TwilioConfig
from gateway.contracts.adapter import Adapter, AdapterContext
from gateway.contracts.ids import Platform
from gateway.contracts.platform import ChatAddress, PlatformSpec, SetupQuestion

PLATFORM = Platform("twilio")
SMS = "sms"
"""The target prefix of an SMS number: `sms:+15551234567`."""
WHATSAPP_PREFIX = WHATSAPP.removesuffix(":")
"""The target prefix of a WhatsApp number: `whatsapp:+15551234567`."""

_PHONE = re.compile(r"^\+[1-9]\d{5,15}$")


def _factory(section: TwilioConfig, context: AdapterContext) -> Callable[[], Adapter]:
    from adapters.twilio.adapter import TwilioAdapter  # noqa: PLC0415

    return lambda: TwilioAdapter(section, context)


def _parse_target(prefix: str, rest: str) -> ChatAddress:
    """`sms:<+number>`, `whatsapp:<+number>` (chat `whatsapp:+number`), or `twilio:<chat>`."""
    if prefix == PLATFORM:
        return ChatAddress(rest)
    number = rest.replace(" ", "")
    if not _PHONE.match(number):
        raise ValueError(f"{prefix} needs an E.164 number like +15551234567")
    return ChatAddress(number if prefix == SMS else f"{WHATSAPP}{number}")


def _format_target(prefix: str, address: ChatAddress) -> str:
    """`sms:` and `whatsapp:` targets are stored as written, the number normalized."""
    if prefix == PLATFORM:
        return f"{PLATFORM}:{address.chat}"
    return f"{prefix}:{address.chat.removeprefix(WHATSAPP)}"


SPEC = PlatformSpec(
    name=PLATFORM,
    config=TwilioConfig,
    factory=_factory,
    example="sms:+15551234567",
    aliases=(SMS, WHATSAPP_PREFIX),
    parse_target=_parse_target,
    format_target=_format_target,
    # The SDK logs request headers.
    url_loggers=("twilio",),
    setup=(
        SetupQuestion("account_sid", "Account SID (AC…, Twilio Console)"),
        SetupQuestion("auth_token", "Auth Token", secret=True),
        SetupQuestion("from_number", "Your Twilio number replies come from (+15551234567)"),
        SetupQuestion("public_url", "Herald's public URL as Twilio reaches it (https://…)"),
    ),
    base_url_key="base_url",
)
"""Twilio SMS and WhatsApp (`platforms.twilio`)."""
