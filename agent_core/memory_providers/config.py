"""The config sections of the built-in providers: `memory.honcho` and `memory.mem0`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator

from gateway.contracts.config import Section, http_url, not_empty


class HonchoConfig(Section):
    """Honcho (`memory.provider: honcho`): one peer per person and one for the agent."""

    base_url: str = "https://api.honcho.dev"
    """The Honcho server (hosted, or a self-hosted one such as http://localhost:8000)."""
    api_key: SecretStr | None = None
    """Honcho's API key (or `api_key_file`); a self-hosted server without auth needs none."""
    workspace: str = Field(default="herald", min_length=1, max_length=512)
    recall: Literal["context", "dialectic"] = "context"
    """`context`: the person's representation and peer card, searched by the new message;
    `dialectic`: Honcho's `chat` answer to the new message about the person (slower)."""
    agent_peer: str = Field(default="herald", min_length=1, max_length=512)
    """The peer id of the agent itself."""
    request_timeout: float = Field(default=10.0, gt=0)
    """Seconds one sync request may take (recall is bounded by `memory.recall_timeout`)."""

    _api_key = field_validator("api_key")(not_empty)
    _base_url = field_validator("base_url")(http_url)


class Mem0Config(Section):
    """Mem0 (`memory.provider: mem0`): hosted (api.mem0.ai) or a self-hosted server."""

    base_url: str = "https://api.mem0.ai"
    api_key: SecretStr | None = None
    """Mem0's API key (or `api_key_file`); required: the client refuses to start without."""
    top_k: int = Field(default=5, ge=1, le=100)
    """How many memories a recall returns at most."""
    agent_id: str = Field(default="herald", min_length=1, max_length=512)
    """Stored in each memory's metadata (`herald_agent`), so that memories Herald added can be
    told from other applications' in the same Mem0 project."""
    request_timeout: float = Field(default=10.0, gt=0)

    _api_key = field_validator("api_key")(not_empty)
    _base_url = field_validator("base_url")(http_url)
