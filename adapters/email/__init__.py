"""Email: IMAP IDLE in, SMTP out."""

from __future__ import annotations

from collections.abc import Callable

from adapters.email.config import EmailConfig
from gateway.contracts.adapter import Adapter, AdapterContext
from gateway.contracts.ids import Platform
from gateway.contracts.platform import ChatAddress, PlatformSpec, SetupQuestion

PLATFORM = Platform("email")


def _factory(section: EmailConfig, context: AdapterContext) -> Callable[[], Adapter]:
    from adapters.email.adapter import EmailAdapter  # noqa: PLC0415

    return lambda: EmailAdapter(section, context.files, context.checkpoints)


def _parse_target(prefix: str, rest: str) -> ChatAddress:
    """`email:<address>[:<thread>]`; the address is lower-cased."""
    addr, _, thread = rest.partition(":")
    if "@" not in addr:
        raise ValueError("email needs an address like email:ada@example.org")
    return ChatAddress(addr.lower(), thread or None)


SPEC = PlatformSpec(
    name=PLATFORM,
    config=EmailConfig,
    factory=_factory,
    example="email:ada@example.org",
    parse_target=_parse_target,
    setup=(
        SetupQuestion("address", "Herald's own email address"),
        SetupQuestion("username", "Login name on the mail servers"),
        SetupQuestion("password", "Password", secret=True),
        SetupQuestion("imap_host", "IMAP server (reading mail)"),
        SetupQuestion("imap_port", "IMAP port (TLS)", default="993"),
        SetupQuestion("smtp_host", "SMTP server (sending mail)"),
        SetupQuestion("smtp_port", "SMTP port (TLS)", default="465"),
    ),
)
"""Email (`platforms.email`)."""
