"""Herald's configuration: one YAML file, overridden by `HERALD_<SECTION>__<KEY>` variables.

Loaded and validated once at startup into frozen models. Any secret may instead be given as
`<key>_file` (a path whose contents, without the trailing newline, become the value).
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeGuard, TypeVar, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from pydantic import (
    BaseModel,
    Field,
    SecretStr,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from agent_core.config import LLMConfig, MediaConfig, SpeechConfig
from agent_core.mcp.config import MCPConfig
from agent_core.memory_providers.config import HonchoConfig, Mem0Config
from agent_core.memory_providers.registry import NONE, available
from agent_core.skills.config import SkillsConfig
from gateway import platforms
from gateway.contracts.config import (
    BusyMode,
    IdList,
    PlatformSection,
    Section,
    VoiceReply,
    not_empty,
)
from gateway.contracts.config import read_secret_files as _read_secret_files
from gateway.contracts.errors import ConfigError
from gateway.contracts.platform import Host
from gateway.cron.targets import TargetError, normalize_targets
from gateway.profiles import (
    DEFAULT,
    OPENAI_BASE_URL,
    Binding,
    BindingConfig,
    ProfileConfig,
    check_bindings,
    check_profile_name,
    url_origin,
)
from gateway.tools.config import ToolsConfig
from gateway.triggers.config import OPERATOR_CLI, TriggerConfig, WebhookConfig, check_name

ENV_PREFIX = "HERALD_"


_AUTHORITY = re.compile(
    r"(\[[0-9a-f:.]+\]|[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?)(:(6553[0-5]|655[0-2]\d|65[0-4]\d{2}"
    r"|6[0-4]\d{3}|[1-5]\d{4}|[1-9]\d{0,3}))?"
)
"""`host[:port]` as in a `Host` header (an IPv6 address in brackets), lower case."""


class APIConfig(Section):
    """The HTTP server: OpenAI-compatible API, health, metrics, webhooks."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(default=8642, ge=0, le=65535)
    key: SecretStr | None = None
    max_body_bytes: int = Field(default=1_048_576, ge=1024)
    model_name: str = "herald"
    """The model id `GET /v1/models` lists."""
    keepalive_seconds: float = Field(default=15.0, gt=0)
    max_connections: int = Field(default=500, ge=1)
    """Open connections at most; one more is answered 503 and closed at once."""
    header_timeout: float = Field(default=10.0, gt=0)
    """Seconds a request's line and headers may take to arrive; then 408 and closed."""
    max_header_bytes: int = Field(default=32_768, ge=1024)
    """Request line and headers, in bytes, at most; larger gets 431 and closed."""
    max_headers: int = Field(default=100, ge=8)
    """Header fields per request at most; more gets 431 and closed."""
    idle_timeout: int = Field(default=5, ge=1)
    """Seconds an idle keep-alive connection stays open between requests."""
    backlog: int = Field(default=2048, ge=1)
    """Connections the kernel queues before they are accepted."""
    allow_approval_tools: bool = False
    """Let HTTP API calls run tools that need a person's approval in a chat (the API cannot
    ask; the API key holder is trusted). False: such a call is refused with a tool error."""
    body_timeout: float = Field(default=30.0, gt=0)
    """Seconds a request's body may take to arrive after its head; then 408 and closed."""
    retry_window: float = Field(default=600.0, ge=0)
    """Seconds within which a session request repeating the session's last, unanswered
    question (a client's retry after 503 or 502) continues it instead of asking it again;
    0: only `Idempotency-Key` marks a retry."""
    max_connections_per_client: int = Field(default=64, ge=1)
    """Open connections from one client address (an IPv6 /64) at most, and never more than
    half of `max_connections`; one more is answered 503 and closed at once."""
    public_names: tuple[str, ...] = ()
    """Names (`host` or `host:port`) besides localhost, 127.0.0.1 and [::1] under which the
    console and a key-less API are reached, e.g. behind a reverse proxy. A request whose
    `Host` or `Origin` names anything else is refused (a DNS-rebinding page)."""

    _key = field_validator("key")(not_empty)

    @field_validator("public_names")
    @classmethod
    def _public_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            if not _AUTHORITY.fullmatch(name.lower()):
                raise ValueError(
                    f"{name!r} is not a host name with an optional port (like "
                    "'herald.example.com' or 'herald.example.com:8443'; no scheme, no path)"
                )
            lower = name.lower()
            host = lower[: lower.find("]") + 1] if lower.startswith("[") else lower.split(":")[0]
            if host in ("localhost", "127.0.0.1", "[::1]"):
                raise ValueError(
                    f"{name!r}: localhost, 127.0.0.1 and [::1] are this server's names already "
                    "(at api.port only; as a public name they would match any port)"
                )
        return tuple(name.lower() for name in names)

    @property
    def is_loopback(self) -> bool:
        """True when the server listens on a loopback address only."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


class ConsoleConfig(Section):
    """The operator's web console at `/console` (served by the HTTP server)."""

    enabled: bool = True
    """False: no `/console` routes at all."""
    live_interval: float = Field(default=1.0, gt=0, le=60)
    """Seconds between two looks at the daemon's state for the live overview."""


class SessionsConfig(Section):
    """Turns, lanes and busy modes."""

    busy_mode: BusyMode = BusyMode.QUEUE
    debounce_seconds: float = Field(default=2.0, ge=0)
    queue_cap: int = Field(default=20, ge=1)
    max_concurrent_turns: int = Field(default=8, ge=1)
    max_waiting_turns: int = Field(default=100, ge=1)
    """HTTP API turns that may wait for a free slot or their session; the next is refused
    at once (503 with Retry-After) instead of waiting without end."""
    turn_timeout: float = Field(default=600.0, gt=0)
    drain_timeout: float = Field(default=20.0, ge=0)
    """On SIGTERM, how long running turns may finish before they are checkpointed."""
    ack_interval: float = Field(default=30.0, ge=0)
    """At most one busy-time acknowledgement per session in this many seconds."""
    model_outage_max_wait: float = Field(default=1800.0, gt=0)
    """While the model is unreachable, a message waits (retried with backoff) this many
    seconds after it arrived; then it is dropped with a notice to its sender."""
    model_retry_initial: float = Field(default=2.0, gt=0)
    """The first wait before a turn is tried again after the model was unreachable."""
    model_retry_max: float = Field(default=60.0, gt=0)
    """The longest wait between two tries while the model stays unreachable."""


class DeliveryConfig(Section):
    """The outbox's delivery worker."""

    max_attempts: int = Field(default=8, ge=1)
    """Transient failures before a chunk becomes a dead letter."""
    max_age: float = Field(default=6 * 3600.0, gt=0)
    """Seconds after which an undelivered chunk is stale: dead-lettered, never sent late."""
    backoff_initial: float = Field(default=2.0, gt=0)
    backoff_max: float = Field(default=300.0, gt=0)
    store_retry_max: float = Field(default=10.0, gt=0)
    """The longest wait between two tries while the database fails (away, restarting, full):
    once it works again, a reply waits at most this long to go out."""
    concurrency: int = Field(default=32, ge=1)
    """Chats served at once."""
    flush_timeout: float = Field(default=5.0, ge=0)
    """On SIGTERM, how long to keep delivering what is due after turns have drained."""


class AccessConfig(Section):
    """Who operates Herald, and pairing codes for unknown senders in direct messages."""

    operators: IdList = ()
    """`platform:id` of the people who operate Herald from a chat (besides the CLI and the
    API key holder): only they set home channels and send jobs or messages to other chats."""

    pairing_ttl: float = Field(default=3600.0, gt=0)
    max_pending_pairings: int = Field(default=3, ge=1)
    """Pending codes per account (of each platform); further unknown senders are told to try
    later."""
    pairing_reply_interval: float = Field(default=600.0, ge=0)
    """At most one pairing reply per unknown sender in this many seconds."""

    @field_validator("operators")
    @classmethod
    def _operators(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        out = []
        for item in value:
            platform, sep, ident = item.strip().partition(":")
            if not sep or not platform or not ident:
                raise ValueError(
                    f"{item!r} is not of the form platform:id (e.g. {platforms.example_target()})"
                )
            out.append(f"{platform.lower()}:{ident}")
        return tuple(out)


class HomeConfig(Section):
    """Where scheduled reports go: targets like `<platform>:<chat>[:<thread>]`.

    `home: <platform>:123` (one target or a list) is short for `home: {targets: [...]}`, and
    `targets` too may be one target (or several separated by commas) instead of a list.
    """

    targets: tuple[str, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, str | list | tuple):
            data = {"targets": data}
        if isinstance(data, dict) and isinstance(data.get("targets"), str):
            data = {**data, "targets": [t.strip() for t in data["targets"].split(",") if t.strip()]}
        return data

    @field_validator("targets")
    @classmethod
    def _targets(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for target in value:
            platform, sep, rest = target.partition(":")
            if not sep or not platform or not rest:
                raise ValueError(f"{target!r} is not of the form platform:chat[:thread]")
        return value


class CronConfig(Section):
    """Scheduled jobs: agent turns run on a schedule and delivered as reports."""

    enabled: bool = True
    """Whether this instance runs the scheduler (jobs can be managed either way)."""
    timezone: str = "UTC"
    """The time zone of a job created without one (an IANA name like Europe/Berlin)."""
    catchup_grace: float = Field(default=3600.0, ge=0)
    """After downtime, the newest missed slot still runs if it is at most this many seconds
    old; every other missed slot is recorded as missed."""
    run_timeout: float = Field(default=600.0, gt=0)
    """Seconds a run may take, unless the job sets its own timeout."""
    failure_notice_after: int = Field(default=3, ge=1)
    """Consecutive failed runs or deliveries after which the owner is told (once)."""
    output_retention: int = Field(default=50, ge=1)
    """Runs (output files and rows) kept per job; older ones are deleted."""
    poll_interval: float = Field(default=5.0, gt=0)
    """Seconds between looks at SQL for changes made elsewhere (CLI, other instances)."""
    max_concurrent_runs: int = Field(default=4, ge=1)
    report_heading: str = Field(default="⏰ {name}", max_length=200)
    """The line above each delivered report; `{name}` and `{id}` are the job's. Empty: the
    bare answer."""

    @field_validator("report_heading")
    @classmethod
    def _heading(cls, value: str) -> str:
        try:
            value.format(name="", id="")
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(
                f"{value!r} is not a heading template: use {{name}} and {{id}} only "
                "(double other braces)"
            ) from err
        return value

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as err:
            raise ValueError(f"unknown time zone {value!r}") from err
        return value


class ClusterConfig(Section):
    """Several instances on one PostgreSQL: leases, heartbeats and the look for orphaned work.

    Ignored on SQLite, which serves one instance only.
    """

    lease_ttl: float = Field(default=15.0, ge=1.0, le=600.0)
    """Seconds after an instance's last heartbeat before the others take over its leases
    (pollers, mailboxes, gateway connections, the scheduler), its sessions and its unfinished
    deliveries."""
    heartbeat_interval: float | None = Field(default=None, gt=0)
    """Seconds between heartbeats and lease renewals. Default: a third of `lease_ttl`."""
    scan_interval: float = Field(default=1.0, gt=0, le=60.0)
    """Seconds between looks for sessions with waiting messages and no live instance (the
    fallback if a notification is lost; takeover after a failure happens at this pace)."""
    forget_stopped_after: float = Field(default=86_400.0, ge=0)
    """Seconds the row of an instance that stopped is kept for `herald instances` (SQLite
    too: with the default id every restart leaves one)."""

    @model_validator(mode="after")
    def _heartbeat_within_ttl(self) -> ClusterConfig:
        if self.heartbeat_interval is not None and self.heartbeat_interval * 2 > self.lease_ttl:
            raise ValueError("heartbeat_interval must be at most half of lease_ttl")
        return self

    @property
    def effective_heartbeat(self) -> float:
        """The heartbeat interval in seconds."""
        return self.heartbeat_interval or self.lease_ttl / 3


class MemoryConfig(Section):
    """Size caps of the memory files the agent edits, and the external memory provider."""

    user_max_chars: int = Field(default=4_000, ge=100)
    memory_max_chars: int = Field(default=8_000, ge=100)
    group_memory: bool = True
    """Whether each group chat has memory files of its own (never shared with another
    group); false: sessions of groups have no memory at all."""
    provider: str = Field(default="none", pattern=r"^[A-Za-z0-9_.-]+$")
    """The external long-term memory: `none`, `honcho`, `mem0`, or a third-party provider's
    entry-point name (group `herald.memory_providers`). At most one runs."""
    recall_timeout: float = Field(default=2.0, gt=0, le=60)
    """Seconds a turn waits for the provider's recall before going on without it."""
    sync_max_age: float = Field(default=7 * 86_400.0, gt=0)
    """Seconds a turn waits to be synced to the provider while it is down before the sync is
    given up (kept as dead, shown by `herald memory status`)."""
    sync_timeout: float = Field(default=30.0, gt=0)
    """Seconds one sync call may take before it counts as failed (and is retried)."""
    sync_retry_initial: float = Field(default=1.0, gt=0)
    """Seconds before a failed sync is tried again, doubling each try (jittered)..."""
    sync_retry_max: float = Field(default=300.0, gt=0)
    """...up to this (a 429's `Retry-After` is honoured when longer)."""
    honcho: HonchoConfig = HonchoConfig()
    mem0: Mem0Config = Mem0Config()
    options: dict[str, Any] = Field(default_factory=dict)
    """Options handed to a third-party provider's factory."""

    @model_validator(mode="after")
    def _known_provider(self) -> MemoryConfig:
        names = available()
        if self.provider != NONE and self.provider not in names:
            raise ValueError(
                f"provider {self.provider!r} is not installed; choose one of: "
                + ", ".join([NONE, *names])
            )
        if self.provider == "mem0" and self.mem0.api_key is None:
            raise ValueError("provider mem0 needs memory.mem0.api_key (or api_key_file)")
        return self


class FileStore(StrEnum):
    """Where file bytes are kept (`files.store`)."""

    DATABASE = "database"
    S3 = "s3"


class S3Config(Section):
    """An S3-compatible bucket for file bytes (`files.store: s3`)."""

    bucket: str = Field(min_length=3, max_length=63, pattern=r"^[a-z0-9][a-z0-9.-]+[a-z0-9]$")
    prefix: str = Field(default="herald/", max_length=200, pattern=r"^[A-Za-z0-9!_.*'()/-]*$")
    """Put before each object's name (its content's SHA-256), e.g. `herald/`."""
    endpoint_url: str | None = None
    """The service's URL for S3-compatible stores (MinIO, R2, …); unset: AWS."""
    region: str = "us-east-1"
    access_key_id: SecretStr | None = None
    """Unset: the usual AWS credential chain (environment, instance profile)."""
    secret_access_key: SecretStr | None = None
    timeout: float = Field(default=30.0, gt=0)
    """Seconds to connect or to wait for the service's answer before a try fails."""

    _access_key_id = field_validator("access_key_id")(not_empty)
    _secret_access_key = field_validator("secret_access_key")(not_empty)

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value

    @model_validator(mode="after")
    def _both_keys(self) -> S3Config:
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ValueError(
                "set both access_key_id and secret_access_key (or their _file variants), "
                "or neither to use the AWS credential chain"
            )
        return self


class FilesConfig(Section):
    """Files people send and files the agent sends: their bytes in the blob store (the
    database, or an S3 bucket); `state_dir/cache` only caches them."""

    store: FileStore = FileStore.DATABASE
    """`database` (default: table `blob_chunks`) or `s3` (the bucket in `files.s3`)."""
    s3: S3Config | None = None
    max_file_bytes: int = Field(default=50 * 1024 * 1024, ge=1024)
    """The largest file kept (received or sent); a larger one is refused with a note."""
    retention_days: float = Field(default=30.0, gt=0)
    """Received and sent files older than this are deleted."""
    send_dirs: tuple[Path, ...] = ()
    """Folders `send_file` may send from, besides `state_dir/workspace` (the agent's working
    folder) and the files the person sent in the same conversation."""
    link_ttl: float = Field(default=3600.0, ge=60)
    """Seconds a signed media URL (for Twilio MMS / WhatsApp) stays valid."""
    max_upload_bytes: int = Field(default=10 * 1024 * 1024, ge=1024)
    """The largest picture one HTTP API request may carry (decoded; the whole body is also
    capped by `api.max_body_bytes`)."""

    @model_validator(mode="after")
    def _s3_section(self) -> FilesConfig:
        if self.store is FileStore.S3 and self.s3 is None:
            raise ValueError("files.store is s3: set files.s3 (bucket, and where and how)")
        return self


S = TypeVar("S", bound=PlatformSection)

SINGLE = ""
"""The key under which a platform written as one section (no `accounts:`) keeps it."""

AccountKey = tuple[str, str]
"""(platform, account): what every per-account thing is keyed by."""


class PlatformAccounts(Section):
    """A platform's accounts: `platforms.<name>` written as one section (its `account` key
    names it, default `default`), or with `accounts:` (a mapping `{<account>: {…}}`, or a
    list of sections each with `account:`), where the keys written beside `accounts:` are
    defaults every account takes unless it sets them itself."""

    accounts: Mapping[str, PlatformSection]
    """The sections by account name (`SINGLE` for the one-section form)."""

    @model_validator(mode="before")
    @classmethod
    def _forms(cls, data: Any) -> Any:
        data = _read_secret_files(data)
        if not isinstance(data, Mapping):
            return data
        if "accounts" not in data:
            return {"accounts": {SINGLE: data}}
        defaults = {k: v for k, v in data.items() if k != "accounts"}
        given = data["accounts"]
        if isinstance(given, Mapping):
            items = list(given.items())
            for name, body in items:
                if isinstance(body, Mapping) and body.get("account", name) != name:
                    raise ValueError(
                        f"accounts.{name}.account: {body['account']!r} differs from its key "
                        f"{name!r}; leave `account` out (the key names the account)"
                    )
        elif isinstance(given, list | tuple):
            items = []
            for i, body in enumerate(given):
                if not isinstance(body, Mapping) or not body.get("account"):
                    raise ValueError(
                        f"accounts[{i}]: each account of the list needs `account: <name>` "
                        "(or write accounts as a mapping `{<name>: {…}}`)"
                    )
                name = str(body["account"])
                if name in dict(items):
                    raise ValueError(
                        f"accounts[{i}].account: two accounts are named {name!r}; give each "
                        "its own name"
                    )
                items.append((name, body))
        else:
            raise ValueError(
                "accounts: a mapping {<account>: {<keys>}} or a list of sections with `account:`"
            )
        if not items:
            raise ValueError("accounts: name at least one account, or write one section")
        out: dict[str, Any] = {}
        for name, body in items:
            if not isinstance(body, Mapping):
                out[str(name)] = body  # refused by the section's own validation
                continue
            out[str(name)] = {**defaults, **_read_secret_files(body), "account": str(name)}
        return {"accounts": out}

    @property
    def sections(self) -> tuple[PlatformSection, ...]:
        """Every account's section (enabled or not), in the order written."""
        return tuple(self.accounts.values())

    @property
    def single(self) -> bool:
        """Whether the platform is written as one section (no `accounts:`)."""
        return SINGLE in self.accounts


class PlatformsConfig(Section):
    """One optional entry per registered platform; a platform runs when it is set.

    The fields come from the registry (`gateway/platforms.py`): `_Platforms` below is this
    class with a `<name>: PlatformAccounts | None` field for each platform (whose sections
    are of that platform's config type).
    """

    def accounts(self) -> dict[AccountKey, PlatformSection]:
        """The configured and enabled accounts' sections by (platform, account)."""
        out: dict[AccountKey, PlatformSection] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, PlatformAccounts):
                for section in value.sections:
                    if section.enabled:
                        out[(name, section.account)] = section
        return out

    def every_account(self) -> dict[AccountKey, PlatformSection]:
        """Every account's section by (platform, account), turned off (`enabled: false`)
        or not: what names an adapter (`gateway.supervisor.adapter_name`), so that turning
        one account off leaves the others' names and webhook paths as they were."""
        out: dict[AccountKey, PlatformSection] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, PlatformAccounts):
                for section in value.sections:
                    out[(name, section.account)] = section
        return out

    def platform_names(self) -> list[str]:
        """The platforms with at least one enabled account."""
        return sorted({platform for platform, _ in self.accounts()})

    def section(self, kind: type[S]) -> S | None:
        """The first section of config type `kind` (enabled or not), or None when it is not
        set."""
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, PlatformAccounts):
                for section in value.sections:
                    if isinstance(section, kind):
                        return section
        return None


def _accounts_model(config: type[PlatformSection]) -> type[PlatformAccounts]:
    return create_model(
        f"{config.__name__}Accounts",
        __base__=PlatformAccounts,
        __doc__=PlatformAccounts.__doc__,
        accounts=(Mapping[str, config], ...),  # type: ignore[valid-type]
    )


_FIELDS: dict[str, Any] = {
    spec.name: (_accounts_model(spec.config) | None, None) for spec in platforms.SPECS
}
_Platforms = create_model(
    "PlatformsConfig", __base__=PlatformsConfig, __doc__=PlatformsConfig.__doc__, **_FIELDS
)


class _EnvSource(EnvSettingsSource):
    """The environment, minus the variables that are not config keys.

    `HERALD_HOME` names the state directory (a default), not the `home` section, and
    `HERALD_CONFIG` names the file.
    """

    IGNORED = frozenset({"herald_home", "herald_config", "herald_require_services"})

    def _load_env_vars(self) -> Mapping[str, str | None]:
        env = super()._load_env_vars()
        return {k: v for k, v in env.items() if k.lower() not in self.IGNORED}


class HeraldConfig(BaseSettings):
    """The whole configuration, validated once at startup."""

    model_config = SettingsConfigDict(
        frozen=True,
        extra="forbid",
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        case_sensitive=False,
    )

    state_dir: Path = Field(
        default_factory=lambda: Path(
            os.environ.get("HERALD_HOME") or "~/.local/state/herald"
        ).expanduser()
    )
    database_url: str | None = None
    """Default: `sqlite+aiosqlite:///<state_dir>/herald.db`."""
    instance_id: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=r"^[\w.@-]+$"
    )
    """This process's name among the instances sharing a database. Default:
    `<hostname>-<pid>`. Give each instance its own; a fixed one (like `herald@a`) lets a
    restarted instance take its own work back at once instead of after `cluster.lease_ttl`."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    llm: LLMConfig = LLMConfig()
    api: APIConfig = APIConfig()
    console: ConsoleConfig = ConsoleConfig()
    sessions: SessionsConfig = SessionsConfig()
    home: HomeConfig = HomeConfig()
    memory: MemoryConfig = MemoryConfig()
    skills: SkillsConfig = SkillsConfig()
    # Validated as the registry's model; typed as its base (its fields are known only at run
    # time; `platforms.section(SomeConfig)` is the typed lookup).
    if TYPE_CHECKING:
        platforms: PlatformsConfig = PlatformsConfig()
    else:
        platforms: _Platforms = _Platforms()
    delivery: DeliveryConfig = DeliveryConfig()
    access: AccessConfig = AccessConfig()
    cron: CronConfig = CronConfig()
    cluster: ClusterConfig = ClusterConfig()
    mcp: MCPConfig = MCPConfig()
    tools: ToolsConfig = ToolsConfig()
    files: FilesConfig = FilesConfig()
    media: MediaConfig = MediaConfig()
    speech: SpeechConfig = SpeechConfig()
    """The text-to-speech endpoint of voice replies (`platforms.<name>.voice.reply`)."""
    triggers: Mapping[str, TriggerConfig] = {}
    """Signed webhooks that start agent runs: `POST /hooks/<name>` (see README, Triggers)."""
    webhooks: Mapping[str, WebhookConfig] = {}
    """Outbound webhooks: the target `webhook:<name>` POSTs a result there, signed."""
    profiles: Mapping[str, ProfileConfig] = {}
    """Agents besides the default one (the top-level config): see README, Profiles."""
    bindings: tuple[BindingConfig, ...] = ()
    """Which profile answers in which chats (most specific wins; none: `default`)."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The YAML file arrives as init kwargs; the environment overrides it.
        return (_EnvSource(settings_cls), init_settings)

    @model_validator(mode="before")
    @classmethod
    def _secret_files(cls, data: Any) -> Any:
        return _read_secret_files(data)

    @field_validator("state_dir")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith(("sqlite+aiosqlite://", "postgresql+asyncpg://")):
            raise ValueError("must start with sqlite+aiosqlite:// or postgresql+asyncpg://")
        return value

    @model_validator(mode="after")
    def _api_key_off_loopback(self) -> HeraldConfig:
        if self.api.enabled and not self.api.is_loopback and self.api.key is None:
            raise ValueError(
                f"api.key is required when api.host is {self.api.host!r} (not loopback)"
            )
        return self

    @model_validator(mode="after")
    def _platform_rules(self) -> HeraldConfig:
        host = Host(http_enabled=self.api.enabled)
        sections = self.platforms.accounts()
        for (name, _), section in sections.items():
            validate = platforms.spec(name).validate
            if validate is not None:
                validate(section, host)
        self._one_bot_each()
        for operator in self.access.operators:
            platform, _, rest = operator.partition(":")
            account, sep, _ = rest.partition(":")
            named = [
                s for (p, a), s in sections.items() if p == platform and (not sep or a == account)
            ]
            if any(not section.verified_senders for section in named):
                raise ValueError(
                    f"access.operators: {operator!r} is an identity its platform does not "
                    "vouch for (anyone can write a mail's From): turn on "
                    "require_authentication_results (with authserv_id) for it, or remove it"
                )
        return self

    def _one_bot_each(self) -> None:
        """Two accounts of a platform logging in with the same credential are refused."""
        for name in type(self.platforms).model_fields:
            entry = getattr(self.platforms, name)
            if not isinstance(entry, PlatformAccounts):
                continue
            seen: dict[tuple[str, str], str] = {}
            for section in entry.sections:
                identity = section.identity
                if identity is None:
                    continue
                if identity in seen:
                    raise ValueError(
                        f"platforms.{name}.accounts.{section.account}.{identity[0]}: the "
                        f"same as platforms.{name}.accounts.{seen[identity]}.{identity[0]} "
                        "(one bot twice); give each account its own"
                    )
                seen[identity] = section.account

    @model_validator(mode="after")
    def _voice_rules(self) -> HeraldConfig:
        if self.speech.enabled:
            return self
        for (name, account), section in self.platforms.accounts().items():
            if section.voice.reply is VoiceReply.ALWAYS:
                raise ValueError(
                    f"{section_key(self.platforms, name, account)}.voice.reply: 'always' needs a "
                    "speech endpoint: set speech.base_url (an OpenAI-compatible "
                    "/v1/audio/speech), or use 'when_spoken_to' or 'never'"
                )
        return self

    @model_validator(mode="after")
    def _trigger_rules(self) -> HeraldConfig:
        for name in self.webhooks:
            check_name(name, "webhooks:")
        configured = set(self.platforms.accounts())
        for name, trigger in self.triggers.items():
            check_name(name, "triggers:")
            if trigger.owner != OPERATOR_CLI and trigger.owner not in self.access.operators:
                raise ValueError(
                    f"triggers.{name}.owner: {trigger.owner!r} is not an operator; use "
                    f"{OPERATOR_CLI!r} or one of access.operators"
                )
            chats = []
            for target in trigger.targets:
                head, _, hook = target.strip().partition(":")
                if head.lower() == "webhook":
                    if hook not in self.webhooks:
                        raise ValueError(
                            f"triggers.{name}.targets: {target!r} names no outbound webhook "
                            f"(configured: {', '.join(sorted(self.webhooks)) or 'none'}); "
                            f"add webhooks.{hook or '<name>'}"
                        )
                else:
                    chats.append(target)
            if chats:
                try:
                    normalize_targets(chats, configured)
                except TargetError as err:
                    raise ValueError(f"triggers.{name}.targets: {err}") from err
        return self

    @model_validator(mode="after")
    def _profile_rules(self) -> HeraldConfig:
        for name, profile in self.profiles.items():
            if name == DEFAULT:
                raise ValueError(
                    "profiles.default: the default profile is the top-level config (llm, "
                    "home, …); give other profiles other names"
                )
            check_profile_name(name, "profiles:")
            try:
                self.profile_llm(name)
            except ValidationError as err:
                first = err.errors()[0]
                key = ".".join(str(p) for p in first["loc"])
                raise ValueError(
                    f"profiles.{name}.llm.{key}: {first['msg'].removeprefix('Value error, ')}"
                ) from err
            prefixes = {n if s.prefix is None else s.prefix for n, s in self.mcp.servers.items()}
            for tool in () if profile.tools == "all" else profile.tools:
                head, sep, _ = tool.partition("__")
                if sep and head not in prefixes:
                    raise ValueError(
                        f"profiles.{name}.tools: {tool!r} is no MCP server's tool (a server's "
                        f"tools are <prefix>__<tool>; prefixes: "
                        f"{', '.join(sorted(p for p in prefixes if p)) or 'none'})"
                    )
            if profile.mcp != "all":
                for server in profile.mcp:
                    if server not in self.mcp.servers:
                        raise ValueError(
                            f"profiles.{name}.mcp: no MCP server {server!r} (configured: "
                            f"{', '.join(sorted(self.mcp.servers)) or 'none'})"
                        )
        check_bindings(self.binding_rules(), self.profiles, "bindings")
        for name, trigger in self.triggers.items():
            if trigger.profile != DEFAULT and trigger.profile not in self.profiles:
                raise ValueError(
                    f"triggers.{name}.profile: no profile {trigger.profile!r} "
                    f"(known: {', '.join(self.profile_names())})"
                )
        return self

    def profile_names(self) -> list[str]:
        """Every profile's name, `default` first."""
        return [DEFAULT, *self.profiles]

    def profile_llm(self, name: str) -> LLMConfig:
        """The model of profile `name`: its `llm` keys over the top-level `llm`."""
        if name == DEFAULT or not self.profiles[name].llm:
            return self.llm
        own = self.profiles[name].llm
        merged = {**self.llm.model_dump(exclude_unset=True), **own}
        if "api_key" not in own and isinstance(own.get("base_url"), str):
            # The top-level model's key goes only to its own server (as speech's and
            # transcription's do): a profile's model elsewhere needs its own `api_key`.
            top = self.llm.base_url or OPENAI_BASE_URL
            if url_origin(own["base_url"]) != url_origin(top):
                merged.pop("api_key", None)
        return LLMConfig.model_validate(merged)

    def profile_home(self, name: str) -> tuple[str, ...]:
        """Where the `home` reports of profile `name` go (the top-level `home` is the default
        profile's alone)."""
        return self.home.targets if name == DEFAULT else self.profiles[name].home

    def memory_namespaces(self) -> list[str]:
        """The memory namespaces of the profiles besides the default one."""
        names = [p.namespace or n for n, p in self.profiles.items()]
        return [n for n in dict.fromkeys(names) if n != DEFAULT]

    def binding_rules(self) -> list[Binding]:
        """The configured bindings as rules."""
        return [b.rule() for b in self.bindings]

    @property
    def effective_database_url(self) -> str:
        """The configured database URL, or the embedded SQLite file under `state_dir`."""
        return self.database_url or f"sqlite+aiosqlite:///{self.state_dir / 'herald.db'}"

    @property
    def effective_instance_id(self) -> str:
        """The configured instance id, or `<hostname>-<pid>`."""
        return self.instance_id or f"{os.uname().nodename}-{os.getpid()}"


def section_key(config: PlatformsConfig, platform: str, account: str) -> str:
    """The config key of one account's section: `platforms.<name>` when the platform is
    written as one section, else `platforms.<name>.accounts.<account>`."""
    entry = getattr(config, platform, None)
    if isinstance(entry, PlatformAccounts) and entry.single:
        return f"platforms.{platform}"
    return f"platforms.{platform}.accounts.{account}"


def _plain_loc(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """An error's location as written: the one-section form's inner `accounts.""` left out."""
    out: list[int | str] = []
    skip = False
    for i, part in enumerate(loc):
        if skip:
            skip = False
            continue
        if part == "accounts" and i + 1 < len(loc) and loc[i + 1] == SINGLE and i == 2:
            skip = True
            continue
        out.append(part)
    return tuple(out)


def _format_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        e["loc"] = _plain_loc(e["loc"])
        key = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key" + _did_you_mean(e["loc"])
        lines.append(f"  {key}: {msg}" if key else f"  {msg}")
    return "invalid configuration:\n" + "\n".join(lines)


def _did_you_mean(loc: tuple[int | str, ...]) -> str:
    """`; did you mean 'x'?` when a known key of the same section is close to the unknown one."""
    model: type[BaseModel] = HeraldConfig
    parts = list(loc[:-1])
    while parts:
        if issubclass(model, PlatformAccounts):
            if parts[0] == "accounts":
                del parts[:2]  # `accounts` and the account's name
            model = _section_type(model)
            continue
        part = parts.pop(0)
        field = model.model_fields.get(str(part))
        inner = [] if field is None else [field.annotation, *get_args(field.annotation)]
        found = next((a for a in inner if _is_model(a)), None)
        if found is None:
            return ""
        model = found
    if issubclass(model, PlatformAccounts):
        model = _section_type(model)
    known = [k for k in model.model_fields if not _internal(model, k)]
    close = difflib.get_close_matches(str(loc[-1]).lower(), known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(known)})"


def _section_type(model: type[PlatformAccounts]) -> type[BaseModel]:
    """The section type of a platform's accounts model."""
    annotation = model.model_fields["accounts"].annotation
    found = next((a for a in get_args(annotation) if _is_model(a)), None)
    return found if found is not None else PlatformSection


def _internal(model: type[BaseModel], key: str) -> bool:
    """Whether `key` is a test-only platform's section (never suggested)."""
    return issubclass(model, PlatformsConfig) and platforms.spec(key).internal


def _is_model(value: Any) -> TypeGuard[type[BaseModel]]:
    return isinstance(value, type) and issubclass(value, BaseModel)


def config_path_from_env(explicit: Path | None) -> Path | None:
    """The config file to read: `--config`, else `HERALD_CONFIG`, else none."""
    if explicit is not None:
        return explicit
    env = os.environ.get("HERALD_CONFIG")
    return Path(env) if env else None


def load_config(path: Path | None = None) -> HeraldConfig:
    """Read, merge and validate the configuration. Raises ConfigError naming each bad key."""
    data: dict[str, Any] = {}
    path = config_path_from_env(path)
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as err:
            raise ConfigError(f"cannot read config file {path}: {err.strerror}") from err
        except yaml.YAMLError as err:
            raise ConfigError(f"config file {path} is not valid YAML: {err}") from err
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        data = loaded or {}
    try:
        # Files named in the YAML are read before the merge, so the environment beats them.
        data = _read_secret_files(data)
        for name, section in list(data.items()):
            data[name] = _read_secret_files(section)
    except ValueError as err:
        raise ConfigError(f"invalid configuration: {err}") from err
    # Top-level secrets from the environment as files (nested ones go through `Section`).
    for name in HeraldConfig.model_fields:
        env_file = os.environ.get(f"{ENV_PREFIX}{name.upper()}_FILE")
        if env_file:
            data[f"{name}_file"] = env_file
    try:
        return HeraldConfig(**data)
    except ValidationError as err:
        raise ConfigError(_format_error(err)) from err
    except ValueError as err:  # secrets files and the like, raised before field validation
        raise ConfigError(f"invalid configuration: {err}") from err


def masked(config: HeraldConfig) -> dict[str, Any]:
    """The effective configuration as plain data with every secret replaced by `***`."""

    def walk(value: Any) -> Any:
        if isinstance(value, PlatformAccounts):
            if value.single:
                return walk(value.accounts[SINGLE])
            return {"accounts": {k: walk(v) for k, v in value.accounts.items()}}
        if isinstance(value, SecretStr):
            return "***" if value.get_secret_value() else ""
        if isinstance(value, BaseModel):
            return {k: walk(getattr(value, k)) for k in type(value).model_fields}
        if isinstance(value, tuple | list):
            return [walk(v) for v in value]
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, Path):
            return str(value)
        if isinstance(value, StrEnum):
            return str(value)
        return value

    data: dict[str, Any] = walk(config)
    for spec in platforms.SPECS:
        if spec.internal and data["platforms"][spec.name] is None:
            del data["platforms"][spec.name]  # a test-only platform, of no concern unless used
    data["database_url"] = _mask_url(config.effective_database_url)
    data["llm"]["provider"] = config.llm.effective_provider
    data["instance_id"] = config.effective_instance_id
    return data


def _mask_url(url: str) -> str:
    url = re.sub(r"([?&]password=)[^&]*", r"\1***", url)
    scheme, sep, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if not at or ":" not in creds:
        return url
    user = creds.split(":", 1)[0]
    return f"{scheme}{sep}{user}:***@{host}"
