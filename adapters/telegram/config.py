"""The `platforms.telegram` config section."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field, SecretStr, field_validator, model_validator

from gateway.contracts.config import EditedMessages, EditRule, PlatformSection, ReactionRule

PUBLIC_BASE_URL = "https://api.telegram.org/bot"
PUBLIC_BASE_FILE_URL = "https://api.telegram.org/file/bot"


class TelegramMode(StrEnum):
    """How updates reach Herald."""

    POLLING = "polling"
    WEBHOOK = "webhook"


class GroupTrigger(StrEnum):
    """What makes a group message reach the agent."""

    MENTION = "mention"
    """`@botname` in the text, or a command (`/cmd` or `/cmd@botname`)."""
    REPLY = "reply"
    """A reply to one of the bot's messages."""
    ALL = "all"
    """Every message (the bot needs privacy mode off in BotFather to see them)."""


class ParseMode(StrEnum):
    """Which Telegram markup replies are written in."""

    HTML = "html"
    MARKDOWN_V2 = "markdownv2"


class TelegramConfig(PlatformSection):
    """A bot: its token, how it receives, and what it answers in groups."""

    token: SecretStr
    """From BotFather (`123456:ABC…`); `HERALD_PLATFORMS__TELEGRAM__TOKEN` or `token_file`."""
    mode: TelegramMode = TelegramMode.POLLING
    webhook_url: str | None = Field(default=None, pattern=r"^https?://\S+$")
    """The public HTTPS URL Telegram posts to; it must reach `/webhooks/telegram`."""
    webhook_secret: SecretStr | None = None
    """Sent by Telegram in `X-Telegram-Bot-Api-Secret-Token`; 1-256 of `A-Z a-z 0-9 _ -`."""
    base_url: str = Field(default=PUBLIC_BASE_URL, pattern=r"^https?://\S+$")
    """Bot API base; the token is appended (`…/bot` + token). Change for a local Bot API server."""
    base_file_url: str = Field(default=PUBLIC_BASE_FILE_URL, pattern=r"^https?://\S+$")
    group_trigger: tuple[GroupTrigger, ...] = (GroupTrigger.MENTION, GroupTrigger.REPLY)
    stream_edits: bool = True
    """Show the answer growing in place by editing a preview message."""
    min_edit_interval: float = Field(default=1.5, ge=0.1, le=60)
    """Seconds between two edits of a streamed answer."""
    min_send_interval: float = Field(default=1.0, ge=0, le=60)
    """Seconds between two messages to one chat (Telegram allows about one per second)."""
    parse_mode: ParseMode = ParseMode.HTML
    edited_messages: EditedMessages = EditRule.ANSWER
    """An edit of a message already answered: `answer` (as a new message marked as an edit)
    or `ignore`. Edits of waiting messages and of the one being answered always count."""
    reactions: ReactionRule = ReactionRule.NOTE
    """A reaction to one of the bot's messages: `note` in the session, `turn`, or `ignore`."""
    working_reaction: str = Field(default="👀", max_length=16)
    """Put on the message being answered while the agent works (one of Telegram's reaction
    emoji); empty: none."""
    process_backlog_on_start: bool = True
    """Answer messages sent while Herald was down; when off they are skipped at start."""
    backlog_max_age: float = Field(default=3600.0, gt=0)
    """Messages older than this many seconds when they reach Herald are skipped, not answered."""
    poll_timeout: float = Field(default=30.0, ge=0, le=50)
    """Seconds one `getUpdates` long poll waits on Telegram's side."""
    attachment_max_bytes: int = Field(default=20 * 1024 * 1024, ge=0, le=2_000 * 1024 * 1024)
    """Larger photos and documents are not downloaded (the public Bot API serves up to 20 MB)."""
    attachment_types: tuple[str, ...] = ("*",)
    """MIME type patterns (`image/*`, `application/pdf`) of files that are downloaded."""

    @property
    def singleton(self) -> bool:
        """Polling runs on one instance at a time (Telegram refuses two concurrent
        `getUpdates`); webhook mode runs on every instance behind the load balancer."""
        return self.mode is TelegramMode.POLLING

    @field_validator("group_trigger", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str) else value

    @field_validator("webhook_secret")
    @classmethod
    def _secret_charset(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        secret = value.get_secret_value()
        if not 1 <= len(secret) <= 256 or not all(
            c.isascii() and (c.isalnum() or c in "_-") for c in secret
        ):
            raise ValueError("must be 1-256 characters of A-Z, a-z, 0-9, _ and -")
        return value

    @model_validator(mode="after")
    def _webhook_needs_url(self) -> TelegramConfig:
        if self.mode is TelegramMode.WEBHOOK and (
            self.webhook_url is None or self.webhook_secret is None
        ):
            raise ValueError("mode webhook needs webhook_url and webhook_secret")
        return self
