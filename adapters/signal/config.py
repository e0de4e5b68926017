"""The `platforms.signal` config section."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, SecretStr, field_validator, model_validator

from gateway.contracts.config import (
    EditedMessages,
    EditRule,
    IdList,
    PlatformSection,
    ReactionRule,
    http_url,
    not_empty,
)

E164 = re.compile(r"^\+[1-9][0-9]{6,14}$")


def e164(value: str) -> str:
    """An E.164 number (as Twilio's section writes them), its spaces, dashes and brackets
    dropped; ValueError otherwise."""
    number = re.sub(r"[\s().-]", "", value)
    if not E164.match(number):
        raise ValueError(f"{value!r} is not an E.164 number (+ and 7 to 15 digits)")
    return number


def _unquoted(value: Any) -> Any:
    """A number YAML read as an integer (`+15551234567` unquoted): its `+` back."""
    return f"+{value}" if isinstance(value, int) and not isinstance(value, bool) else value


class SignalConfig(PlatformSection):
    """A Signal account served by a signal-cli daemon (`signal-cli -a NUMBER daemon --http
    --receive-mode=on-connection`): where the daemon listens and the account's number."""

    number: str
    """The account's registered number, E.164 (`+15551234567`)."""
    url: str = "http://127.0.0.1:8080"
    """The daemon's HTTP base (`--http=HOST:PORT`), without `/api/v1/…`."""
    auth_token: SecretStr | None = None
    """Sent as `Authorization: Bearer …` with every request, for a proxy in front of the
    daemon (signal-cli itself has no authentication); `auth_token_file` reads it from a file."""
    multi_account: bool = False
    """The daemon was started without `-a` (it serves several accounts): every request names
    `number` as its `account`."""
    groups: IdList = ()
    """Group ids (base64, as signal-cli's `listGroups` shows them) where every message is
    answered; in other groups only messages that mention the account or quote it."""
    read_receipts: bool = True
    """Send a read receipt for each message once it is stored."""
    edited_messages: EditedMessages = EditRule.ANSWER
    """An edit of a message already answered: `answer` (as a new message marked as an edit)
    or `ignore`. Edits of waiting messages and of the one being answered always count."""
    reactions: ReactionRule = ReactionRule.NOTE
    """A reaction to one of the bot's messages: `note` in the session, `turn`, or `ignore`."""
    working_reaction: str = Field(default="👀", max_length=32)
    """Put on the message being answered while the agent works (removed when the answer is
    done); empty: none."""
    backlog_max_age: float = Field(default=86400.0, gt=0)
    """Messages sent more than this many seconds before they reach Herald (kept on Signal's
    servers while Herald was away) are skipped, not answered."""
    min_send_interval: float = Field(default=0.5, ge=0, le=60)
    """Seconds between two messages to one chat."""
    attachment_max_bytes: int = Field(default=100 * 1024 * 1024, ge=0)
    """Larger files are not fetched from the daemon (the agent is told about them)."""
    attachment_types: tuple[str, ...] = ("*",)
    """MIME type patterns (`image/*`, `application/pdf`) of files that are fetched."""
    request_timeout: float = Field(default=60.0, gt=0, le=600)
    """Seconds one JSON-RPC request may take (a send with files takes a while)."""

    @field_validator("number", mode="before")
    @classmethod
    def _unquoted_number(cls, value: Any) -> Any:
        return _unquoted(value)

    @field_validator("number")
    @classmethod
    def _number(cls, value: str) -> str:
        return e164(value)

    _auth_token = field_validator("auth_token")(not_empty)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        checked = (http_url(value) or value).rstrip("/")
        if "/api/" in checked:
            base = checked.split("/api/", 1)[0]
            raise ValueError(f"{value!r} holds an API path: url is the base alone, e.g. {base!r}")
        return checked

    @model_validator(mode="before")
    @classmethod
    def _numbers(cls, data: Any) -> Any:
        """Numbers in `allowed_users` written as people write them (`+1 555 123-4567`,
        unquoted) are read as E.164; uuids and `*` stay as they are."""
        if not isinstance(data, dict) or not isinstance(data.get("allowed_users"), list):
            return data
        users = []
        for given in data["allowed_users"]:
            user = _unquoted(given)
            text = str(user)
            users.append(e164(text) if text.lstrip().startswith("+") else user)
        return {**data, "allowed_users": users}

    @property
    def identity(self) -> tuple[str, str] | None:
        """The number: two accounts with one number would be one Signal account twice."""
        return "number", self.number

    @property
    def singleton(self) -> bool:
        """One event stream per account across instances (the daemon hands each message to
        every stream: two would answer it twice)."""
        return True
