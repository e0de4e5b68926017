"""The `llm` config section: which model the agent talks to, and how."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator

from gateway.contracts.config import Section, not_empty


class LLMConfig(Section):
    """The language model. With neither `base_url` nor `api_key`, the offline echo provider."""

    provider: Literal["auto", "openai", "echo"] = "auto"
    base_url: str | None = None
    api_key: SecretStr | None = None
    model: str = "gpt-4o-mini"
    context_window: int = Field(default=128_000, ge=1_000)
    compression_threshold: float = Field(default=0.5, gt=0.0, lt=1.0)
    history_window: int = Field(default=40, ge=2, le=10_000)
    """How many recent messages (after the latest summary) are loaded for a turn."""
    connect_timeout: float = Field(default=10.0, gt=0)
    request_timeout: float = Field(default=120.0, gt=0)
    max_retries: int = Field(default=2, ge=0, le=10)
    max_tool_iterations: int = Field(default=8, ge=1, le=100)
    memory_pass: bool = True
    """After each turn, ask the model whether anything is worth remembering."""
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)

    _api_key = field_validator("api_key")(not_empty)

    @property
    def effective_provider(self) -> Literal["openai", "echo"]:
        """`openai` when an endpoint or key is configured, else `echo`."""
        if self.provider != "auto":
            return self.provider
        return "openai" if (self.base_url or self.api_key) else "echo"
