"""The `platforms.matrix` config section."""

from __future__ import annotations

from enum import StrEnum
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator

from gateway.contracts.config import (
    EditedMessages,
    EditRule,
    IdList,
    PlatformSection,
    ReactionRule,
    http_url,
)


class Invites(StrEnum):
    """What an invitation to a room does."""

    ALLOWED = "allowed"
    """Join when the inviter may talk to the agent; decline everyone else's."""
    PENDING = "pending"
    """Join allowed inviters; leave the others pending (joined once the inviter is paired,
    while Herald runs: inviting again changes nothing on the homeserver)."""


class MatrixConfig(PlatformSection):
    """A Matrix account: its homeserver, user id and access token, and where it answers."""

    homeserver: str
    """The client-server API base (`https://matrix.example.org`)."""
    user_id: str = Field(pattern=r"^@[^:\s]+:\S+$")
    """The account's Matrix id (`@herald:example.org`)."""
    access_token: SecretStr
    """The account's access token (Element: Settings → Help & About → Access token);
    `HERALD_PLATFORMS__MATRIX__ACCESS_TOKEN` or `access_token_file`."""
    rooms: IdList = ()
    """Room ids where every message is answered without a mention (and their threads)."""
    invites: Invites = Invites.ALLOWED
    stream_edits: bool = True
    """Show the answer growing in place by editing the message (`m.replace`)."""
    min_edit_interval: float = Field(default=1.0, ge=0.1, le=60)
    """Seconds between two edits of a streamed answer."""
    min_send_interval: float = Field(default=0.2, ge=0, le=60)
    """Seconds between two messages to one room."""
    edited_messages: EditedMessages = EditRule.ANSWER
    """An edit (`m.replace`) of a message already answered: `answer` (as a new message marked
    as an edit) or `ignore`. Edits of waiting messages and of the one being answered always
    count."""
    reactions: ReactionRule = ReactionRule.NOTE
    """A reaction to one of the bot's messages: `note` in the session, `turn`, or `ignore`
    (on an approval question 👍/✅ approve and 👎/❌ deny unless `ignore`)."""
    working_reaction: str = Field(default="👀", max_length=32)
    """Put on the message being answered while the agent works (an `m.reaction`, redacted
    when the answer is done); empty: none."""
    sync_timeout: float = Field(default=30.0, ge=0, le=120)
    """Seconds one `/sync` long poll waits on the homeserver's side."""
    backlog_max_age: float = Field(default=3600.0, gt=0)
    """Messages older than this many seconds when they reach Herald are skipped, not answered."""
    attachment_max_bytes: int = Field(default=20 * 1024 * 1024, ge=0)
    """Larger files are not downloaded (the agent is told about them)."""
    attachment_types: tuple[str, ...] = ("*",)
    """MIME type patterns (`image/*`, `application/pdf`) of files that are downloaded."""

    @field_validator("homeserver")
    @classmethod
    def _homeserver(cls, value: str) -> str:
        checked = http_url(value) or value
        if "/_matrix" in urlsplit(checked).path:
            base = checked.split("/_matrix", 1)[0]
            raise ValueError(
                f"{value!r} holds an API path: homeserver is the base URL alone, e.g. {base!r}"
            )
        return checked

    @property
    def singleton(self) -> bool:
        """One `/sync` loop per account across instances (its `since` token is one value)."""
        return True

    @property
    def identity(self) -> tuple[str, str] | None:
        """The user the account is (a second access token of it is the same bot twice: two
        `/sync` loops, every message answered twice)."""
        return "user_id", self.user_id
