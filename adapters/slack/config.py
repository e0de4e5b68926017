"""The `platforms.slack` config section."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, SecretStr, model_validator

from gateway.contracts.config import EditedMessages, EditRule, IdList, PlatformSection, ReactionRule

PUBLIC_BASE_URL = "https://slack.com/api/"


class SlackMode(StrEnum):
    """How events reach Herald."""

    SOCKET = "socket"
    """Socket Mode: Herald opens a websocket to Slack; no public URL needed."""
    EVENTS = "events"
    """Events API: Slack posts to `/webhooks/slack/events` over HTTPS."""


class SlackConfig(PlatformSection):
    """A Slack app in one workspace: its tokens and where it answers."""

    bot_token: SecretStr
    """`xoxb-…` from *OAuth & Permissions*."""
    mode: SlackMode = SlackMode.SOCKET
    app_token: SecretStr | None = None
    """`xapp-…` with `connections:write` (Socket Mode)."""
    signing_secret: SecretStr | None = None
    """From *Basic Information* (Events API)."""
    base_url: str = Field(default=PUBLIC_BASE_URL, pattern=r"^https?://\S+/$")
    """Web API base, ending in `/`."""
    channels: IdList = ()
    """Channel ids where every message is answered, without a mention."""
    stream_edits: bool = True
    """Show the answer growing in place with `chat.update`."""
    min_edit_interval: float = Field(default=1.5, ge=0.1, le=60)
    min_send_interval: float = Field(default=1.0, ge=0, le=60)
    working_reaction: str = Field(default="eyes", pattern=r"^[a-z0-9_+\-']*$")
    """Reaction put on the message being answered while the agent works; empty: none."""
    edited_messages: EditedMessages = EditRule.ANSWER
    """An edit of a message already answered: `answer` (as a new message marked as an edit)
    or `ignore`. Edits of waiting messages and of the one being answered always count."""
    reactions: ReactionRule = ReactionRule.NOTE
    """A reaction to one of the bot's messages: `note` in the session, `turn`, or `ignore`."""
    backlog_max_age: float = Field(default=3600.0, gt=0)
    """Events older than this many seconds when they arrive are skipped, not answered."""
    ping_interval: float = Field(default=10.0, gt=0, le=120)
    """Socket Mode: seconds between pings; a socket without a pong for half that is replaced."""
    attachment_max_bytes: int = Field(default=20 * 1024 * 1024, ge=0)
    attachment_types: tuple[str, ...] = ("*",)

    @model_validator(mode="after")
    def _mode_needs_its_secret(self) -> SlackConfig:
        if self.mode is SlackMode.SOCKET and self.app_token is None:
            raise ValueError("mode socket needs app_token (xapp-…)")
        if self.mode is SlackMode.EVENTS and self.signing_secret is None:
            raise ValueError("mode events needs signing_secret")
        return self
