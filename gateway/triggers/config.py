"""The `triggers` and `webhooks` config sections: signed requests that start agent runs, and
the URLs results are posted to."""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from gateway.contracts.config import Section
from gateway.triggers.prompt import TemplateError, compile_template

NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
"""A trigger's or an outbound webhook's name: the `/hooks/<name>` path, `webhook:<name>`."""
OPERATOR_CLI = "cli"
"""The owner of a trigger the operator at the command line made."""


class Scheme(StrEnum):
    """How a trigger's requests are verified."""

    GITHUB = "github"
    """`X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`."""
    GITLAB = "gitlab"
    """`X-Gitlab-Token: <the secret>`."""
    STRIPE = "stripe"
    """`Stripe-Signature: t=<unix time>,v1=<hex HMAC-SHA256 of "<t>.<body>">`."""
    HMAC = "hmac"
    """A configured header carrying an HMAC of the body (or of `"<timestamp>.<body>"`)."""


DEFAULT_TOOLS = ("session_search", "skills_list", "skill_view")
"""What a trigger's run may use unless its definition says otherwise: tools that read only.
None of them sends anywhere, nor changes skills, memory or jobs; the run's answer goes to
the trigger's own targets."""


def check_name(value: str, what: str) -> str:
    """`value` if it is a usable name; ValueError saying what one looks like otherwise."""
    if not NAME.fullmatch(value) or value.endswith("_file"):
        raise ValueError(
            f"{what} {value!r}: use lower-case letters, digits, '-' and '_' "
            "(at most 64, starting with a letter or digit, not ending in _file)"
        )
    return value


class TriggerFilter(Section):
    """Which deliveries run: every listed header and field must have one of its values
    (case-sensitive; a field is a dotted path into the JSON payload, like
    `pull_request.base.ref`). Empty: every delivery runs."""

    headers: Mapping[str, tuple[str, ...]] = {}
    fields: Mapping[str, tuple[str, ...]] = {}

    @field_validator("headers")
    @classmethod
    def _lower(cls, value: Mapping[str, tuple[str, ...]]) -> Mapping[str, tuple[str, ...]]:
        return {k.lower(): v for k, v in value.items()}


class TriggerConfig(Section):
    """One trigger: `POST /hooks/<name>`, its verification, filters, prompt and rights."""

    enabled: bool = True
    scheme: Scheme
    secret: SecretStr
    """The shared secret (GitHub, Stripe and generic: the HMAC key; GitLab: the token)."""
    owner: str = OPERATOR_CLI
    """The operator it belongs to: `cli`, or one of `access.operators` (`platform:id`)."""
    prompt: str = Field(min_length=1, max_length=20_000)
    """A template (Jinja syntax, sandboxed: field access only) rendered with `payload` (the
    JSON body), `headers` (lower-case names), `event` and `trigger`."""
    filter: TriggerFilter = TriggerFilter()
    targets: tuple[str, ...] = ("home",)
    """Where the result goes: `home`, `all`, `<platform>:<chat>[:<thread>]`, `webhook:<name>`."""
    tools: tuple[str, ...] = DEFAULT_TOOLS
    """The tools its runs may use (names; MCP tools as `<server>__<tool>`). Nothing else is
    offered, whatever the payload asks."""
    profile: str = "default"
    """The profile its runs answer as (its persona, model, tools; `home` is its home)."""
    payload_budget: int = Field(default=8000, ge=0, le=200_000)
    """Characters of the payload shown to the model (fenced as data), at most."""
    max_body_bytes: int = Field(default=262_144, ge=256)
    """Larger requests are answered 413 and stored nowhere."""
    rate_limit: int = Field(default=60, ge=1)
    """Requests taken per `rate_window` seconds; more are answered 429 with Retry-After."""
    rate_window: float = Field(default=60.0, gt=0)
    max_queued: int = Field(default=20, ge=1)
    """Runs waiting or running at most; a delivery beyond is answered 429, not stored."""
    timeout: float | None = Field(default=None, gt=0)
    """Seconds a run may take; None: `cron.run_timeout`."""
    # The generic scheme (and a GitHub/GitLab/Stripe trigger's overrides):
    header: str = "X-Signature"
    """hmac: the header carrying the signature."""
    algorithm: Literal["sha256", "sha1", "sha512"] = "sha256"
    encoding: Literal["hex", "base64"] = "hex"
    prefix: str = ""
    """hmac: text before the signature in its header (like `sha256=`)."""
    timestamp_header: str | None = None
    """hmac: a header with the request's Unix time; then `"<timestamp>.<body>"` is signed
    and a request older or newer than `tolerance` is refused."""
    tolerance: float = Field(default=300.0, gt=0)
    """Stripe and hmac with a timestamp: seconds a signature stays valid."""
    delivery_header: str | None = None
    """The header naming the delivery (its id deduplicates). Defaults: GitHub
    `X-GitHub-Delivery`, GitLab `X-Gitlab-Event-UUID`, Stripe the event's `id`; otherwise,
    or when missing, a SHA-256 of the body."""
    event_header: str | None = None
    """The header naming the event. Defaults: GitHub `X-GitHub-Event`, GitLab
    `X-Gitlab-Event`; Stripe reads the payload's `type`."""

    @field_validator("secret")
    @classmethod
    def _secret(cls, value: SecretStr) -> SecretStr:
        if len(value.get_secret_value()) < 16:
            raise ValueError("must be at least 16 characters (use a random one)")
        return value

    @field_validator("targets")
    @classmethod
    def _targets(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("at least one target is needed (home, a chat or webhook:<name>)")
        return value

    @model_validator(mode="after")
    def _prompt_compiles(self) -> TriggerConfig:
        try:
            compile_template(self.prompt)
        except TemplateError as err:
            raise ValueError(f"prompt: {err}") from err
        return self


class WebhookConfig(Section):
    """An outbound webhook, the target `webhook:<name>`: results are POSTed as JSON."""

    url: str = Field(pattern=r"^https?://\S+$")
    secret: SecretStr
    """The HMAC-SHA256 key of `X-Herald-Signature`; the receiver checks with it."""
    timeout: float = Field(default=10.0, gt=0)

    @field_validator("secret")
    @classmethod
    def _secret(cls, value: SecretStr) -> SecretStr:
        if len(value.get_secret_value()) < 16:
            raise ValueError("must be at least 16 characters (use a random one)")
        return value
