"""The `platforms.mattermost` config section."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator

from gateway.contracts.config import (
    EditedMessages,
    EditRule,
    IdList,
    PlatformSection,
    ReactionRule,
    http_url,
    not_empty,
)


class MattermostConfig(PlatformSection):
    """A Mattermost bot account: its server, token, where it answers, and the integrations
    (buttons, a slash command) that reach Herald's HTTP server."""

    url: str
    """The server's base URL (`https://chat.example.com`), without `/api/v4`."""
    token: SecretStr
    """The bot account's access token (Integrations → Bot Accounts); `token_file` or
    `HERALD_PLATFORMS__MATTERMOST__TOKEN`."""
    channels: IdList = ()
    """Channel ids where every message is answered without a mention (and their threads)."""
    public_url: str | None = Field(default=None, pattern=r"^https?://[^\s?#]+$")
    """Herald's URL as the Mattermost server reaches it (without `/webhooks/…`): approval
    questions get buttons that post to `<public_url>/webhooks/mattermost/actions`. Unset: no
    buttons (the question names `/approve N` and `/deny N`)."""
    action_secret: SecretStr | None = None
    """Signs the command each button carries (HMAC-SHA256 in the action's `context`, which
    the server keeps from clients); needed for buttons. `action_secret_file` reads it."""
    command_token: SecretStr | None = None
    """The token of a slash command (Integrations → Slash Commands) whose Request URL is
    `<public_url>/webhooks/mattermost/command`; unset: slash commands are refused."""
    stream_edits: bool = True
    """Show the answer growing in place by editing the post."""
    min_edit_interval: float = Field(default=1.0, ge=0.1, le=60)
    """Seconds between two edits of a streamed answer."""
    min_send_interval: float = Field(default=0.2, ge=0, le=60)
    """Seconds between two posts to one channel."""
    edited_messages: EditedMessages = EditRule.ANSWER
    """An edit of a post already answered: `answer` (as a new message marked as an edit) or
    `ignore`. Edits of waiting messages and of the one being answered always count."""
    reactions: ReactionRule = ReactionRule.NOTE
    """A reaction to one of the bot's posts: `note` in the session, `turn`, or `ignore` (on
    an approval question :+1:/:white_check_mark: approve and :-1:/:x: deny unless `ignore`)."""
    working_reaction: str = Field(default="eyes", max_length=64, pattern=r"^[a-z0-9_+-]*$")
    """The emoji name put on the post being answered while the agent works; empty: none."""
    ping_interval: float = Field(default=30.0, ge=1, le=300)
    """Seconds between websocket pings; a ping unanswered as long again replaces the
    connection."""
    backfill_channels: int = Field(default=200, ge=0, le=5000)
    """At most this many channels (those heard from most recently) are read back after a
    reconnect."""
    backlog_max_age: float = Field(default=3600.0, gt=0)
    """Posts older than this many seconds when they reach Herald are skipped, not answered."""
    attachment_max_bytes: int = Field(default=50 * 1024 * 1024, ge=0)
    """Larger files are not downloaded (the agent is told about them)."""
    attachment_types: tuple[str, ...] = ("*",)
    """MIME type patterns (`image/*`, `application/pdf`) of files that are downloaded."""

    _secrets = field_validator("token", "action_secret", "command_token")(not_empty)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        checked = (http_url(value) or value).rstrip("/")
        if "/api/" in urlsplit(checked).path + "/":
            raise ValueError(f"{value!r} holds an API path: url is the server's base URL alone")
        return checked

    @property
    def buttons(self) -> bool:
        """Whether approval questions carry buttons (`public_url` and `action_secret` set)."""
        return self.public_url is not None and self.action_secret is not None

    @property
    def singleton(self) -> bool:
        """One websocket per bot across instances (each would get every event)."""
        return True
