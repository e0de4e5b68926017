"""The `platforms.discord` config section."""

from __future__ import annotations

from pydantic import Field, SecretStr

from gateway.contracts.config import EditedMessages, EditRule, IdList, PlatformSection, ReactionRule
from gateway.contracts.messages import InboundMessage

PUBLIC_API_BASE = "https://discord.com/api/v10"


class DiscordConfig(PlatformSection):
    """A Discord bot: its token, who may talk to it, and where it answers without a mention."""

    token: SecretStr
    """The bot token (*Bot* page of the application); `token_file` reads it from a file."""
    allowed_roles: IdList = ()
    """Role ids whose members may talk to the agent in servers (besides `allowed_users`)."""
    channels: IdList = ()
    """Channel ids where every message is answered without a mention (and their threads)."""
    stream_edits: bool = True
    """Show the answer growing in place by editing the message."""
    min_edit_interval: float = Field(default=1.5, ge=0.1, le=60)
    """Seconds between two edits of a streamed answer."""
    min_send_interval: float = Field(default=0.5, ge=0, le=60)
    """Seconds between two messages to one channel."""
    edited_messages: EditedMessages = EditRule.ANSWER
    """An edit of a message already answered: `answer` (as a new message marked as an edit)
    or `ignore`. Edits of waiting messages and of the one being answered always count."""
    reactions: ReactionRule = ReactionRule.NOTE
    """A reaction to one of the bot's messages: `note` in the session, `turn`, or `ignore`."""
    working_reaction: str = Field(default="👀", max_length=32)
    """Put on the message being answered while the agent works (a Unicode emoji); empty: none."""
    api_base: str = Field(default=PUBLIC_API_BASE, pattern=r"^https?://\S+[^/]$")
    """REST base including the API version, without a trailing `/` (a proxy, or a test)."""
    gateway_url: str | None = Field(default=None, pattern=r"^wss?://\S+$")
    """Gateway websocket address; unset: the one `GET /gateway/bot` names."""
    heartbeat_timeout: float = Field(default=60.0, ge=1, le=600)
    """A connection that receives nothing (not even heartbeat acks) this long is replaced."""
    activity_check_interval: float = Field(default=60.0, ge=0.1, le=3600)
    """When nothing arrived for this long, channel activity is asked over REST; a channel with
    a message Herald did not receive means a silent connection, which is then replaced."""
    backfill_limit: int = Field(default=100, ge=0, le=1000)
    """At most this many missed messages per channel are fetched after a reconnect."""
    backfill_channels: int = Field(default=50, ge=0, le=500)
    """Backfill covers this many most recently active channels (plus `channels`)."""
    backlog_max_age: float = Field(default=3600.0, gt=0)
    """Messages older than this many seconds when they reach Herald are skipped, not answered."""
    attachment_max_bytes: int = Field(default=25 * 1024 * 1024, ge=0)
    """Larger attachments are not downloaded (the agent is told about them)."""
    attachment_types: tuple[str, ...] = ("*",)
    """MIME type patterns (`image/*`, `application/pdf`) of files that are downloaded."""

    @property
    def singleton(self) -> bool:
        """One gateway connection per bot across instances (Discord would deliver each event to
        every connection)."""
        return True

    def admits(self, message: InboundMessage) -> bool:
        """Listed in `allowed_users`, or a server member with one of `allowed_roles`."""
        if super().admits(message):
            return True
        if not self.allowed_roles:
            return False
        member = message.raw.get("member")
        roles = member.get("roles") if isinstance(member, dict) else None
        return isinstance(roles, list) and any(str(r) in self.allowed_roles for r in roles)
