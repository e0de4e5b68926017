"""Config of the test-only loopback platform (`platforms.test`)."""

from __future__ import annotations

from pydantic import Field, SecretStr

from gateway.contracts.config import PlatformSection


class LoopbackConfig(PlatformSection):
    """Where the loopback chat server listens and the bot token it expects."""

    url: str = Field(pattern=r"^https?://")
    token: SecretStr
    poll_timeout: float = Field(default=10.0, gt=0, le=60)
    """Seconds one long poll for updates may wait on the server."""
    stream_edits: bool = True
    """Stream replies by editing a preview message while the model writes."""
