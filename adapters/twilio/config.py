"""The `platforms.twilio` config section."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, SecretStr, field_validator, model_validator

from gateway.contracts.config import PlatformSection

PUBLIC_BASE_URL = "https://api.twilio.com"
E164 = re.compile(r"^\+[1-9][0-9]{6,14}$")
WHATSAPP = "whatsapp:"


def _number(value: str) -> str:
    """An E.164 number, its spaces, dashes and brackets dropped; ValueError otherwise."""
    number = re.sub(r"[\s().-]", "", value)
    if not E164.match(number):
        raise ValueError(f"{value!r} is not an E.164 number (+ and 7 to 15 digits)")
    return number


def _unquoted(value: Any) -> Any:
    """A number YAML read as an integer (`+15551234567` unquoted): its `+` back."""
    return f"+{value}" if isinstance(value, int) and not isinstance(value, bool) else value


class TwilioConfig(PlatformSection):
    """A Twilio account: its credentials, its numbers, and the public URL Twilio posts to."""

    account_sid: str = Field(pattern=r"^AC[0-9a-fA-F]{32}$")
    """`AC…` from the Twilio Console."""
    auth_token: SecretStr
    """The account's Auth Token: Twilio signs every webhook with it (`X-Twilio-Signature`)."""
    api_key: str | None = Field(default=None, pattern=r"^SK[0-9a-fA-F]{32}$")
    """An API key (`SK…`) used for the REST API instead of the Auth Token."""
    api_secret: SecretStr | None = None
    """The secret of `api_key`."""
    from_number: str | None = None
    """The Twilio number SMS replies come from (E.164, `+15551234567`)."""
    whatsapp_from: str | None = None
    """The WhatsApp sender (E.164; `whatsapp:` is added); unset: no WhatsApp."""
    public_url: str = Field(pattern=r"^https?://[^\s?#]+$")
    """Herald's URL as Twilio sees it, without `/webhooks/…` (`https://herald.example.com`).

    Signatures are checked against it plus the path, so it must be exactly what is configured
    in Twilio: scheme, host, port and any prefix a proxy adds."""
    allowed_numbers: tuple[str, ...] = ()
    """E.164 numbers that may talk to the agent, by SMS and by WhatsApp."""
    pairing: bool = False
    """Off by default: a pairing code answer to an unknown number is a paid message."""
    base_url: str = Field(default=PUBLIC_BASE_URL, pattern=r"^https?://[^\s?#]+$")
    """REST API base in place of `https://api.twilio.com` (a local fake, a proxy)."""
    status_callbacks: bool = True
    """Ask Twilio to report each message's delivery to `/webhooks/twilio/status`."""
    min_send_interval: float = Field(default=1.0, ge=0, le=60)
    """Seconds between two messages to one number (a long code sends about one per second)."""
    attachment_max_bytes: int = Field(default=16 * 1024 * 1024, ge=0)
    """Larger MMS / WhatsApp media are not downloaded."""
    request_timeout: float = Field(default=20.0, gt=0, le=300)
    """Seconds one REST call may take."""

    @field_validator("from_number", "whatsapp_from", mode="before")
    @classmethod
    def _unquoted_number(cls, value: Any) -> Any:
        return _unquoted(value)

    @field_validator("from_number")
    @classmethod
    def _sms_number(cls, value: str | None) -> str | None:
        return None if value is None else _number(value)

    @field_validator("whatsapp_from")
    @classmethod
    def _whatsapp_number(cls, value: str | None) -> str | None:
        return None if value is None else WHATSAPP + _number(value.removeprefix(WHATSAPP))

    @model_validator(mode="before")
    @classmethod
    def _numbers_may_talk(cls, data: Any) -> Any:
        """Each allowed number joins `allowed_users` twice: as an SMS chat (`+1555…`) and as
        a WhatsApp chat (`whatsapp:+1555…`), the sender ids access is decided by."""
        if not isinstance(data, dict) or data.get("allowed_numbers") is None:
            return data
        given = data["allowed_numbers"]
        given = [given] if isinstance(given, str | int) else list(given)
        numbers = tuple(n if n == "*" else _number(str(_unquoted(n))) for n in given)
        users = list(data.get("allowed_users") or ())
        for n in numbers:
            users.extend(["*"] if n == "*" else [n, WHATSAPP + n])
        return {**data, "allowed_numbers": numbers, "allowed_users": tuple(dict.fromkeys(users))}

    @field_validator("public_url", "base_url")
    @classmethod
    def _no_trailing_slash(cls, value: str) -> str:
        return value.rstrip("/")

    @model_validator(mode="after")
    def _check(self) -> TwilioConfig:
        if self.from_number is None and self.whatsapp_from is None:
            raise ValueError("set from_number (SMS), whatsapp_from (WhatsApp) or both")
        if (self.api_key is None) != (self.api_secret is None):
            raise ValueError("api_key and api_secret go together")
        return self

    def webhook_url(self, path: str, name: str = "") -> str:
        """The URL Twilio signs for `/webhooks/<name>/<path>` (`name`: `twilio`, or
        `twilio:<account>` on several accounts)."""
        return f"{self.public_url}/webhooks/{name or 'twilio'}/{path}"
