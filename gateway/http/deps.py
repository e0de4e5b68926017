"""What the HTTP handlers need, handed to the app by the supervisor."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agent_core.llm import ModelHealth
from agent_core.media.images import Pictures
from agent_core.skills.service import Skills
from gateway.config import HeraldConfig
from gateway.contracts.adapter import AdapterState, WebhookAdapter
from gateway.cron.service import JobService
from gateway.media import MediaLinks, StoredFiles
from gateway.metrics import Metrics
from gateway.redact import Redactor
from gateway.sessions import SessionManager
from gateway.store import Store
from gateway.triggers.service import TriggerService

if TYPE_CHECKING:
    from agent_core.mcp.server import MCPServer  # the SDK is imported only with a server


@dataclass
class ServingState:
    """Whether the daemon is serving; set by the supervisor."""

    serving: bool = False
    draining: bool = False


@dataclass(frozen=True)
class AppDeps:
    """The daemon's parts the HTTP server uses."""

    config: HeraldConfig
    store: Store
    manager: SessionManager
    metrics: Metrics
    llm_provider: str
    llm_model: str
    adapters: Callable[[], Mapping[str, AdapterState]] = dict
    state: ServingState = field(default_factory=ServingState)
    webhooks: Callable[[str], WebhookAdapter | None] = lambda _: None
    """The connected adapter that receives `/webhooks/<platform>/…`, None when there is none."""
    jobs: JobService | None = None
    """Scheduled jobs (`/api/jobs`); None: the routes answer 503."""
    cluster: Callable[[], Mapping[str, object]] = dict
    memory: Callable[[], Mapping[str, object]] = lambda: {"provider": "none"}
    """The external memory provider: its state and its sync queue."""
    llm_health: ModelHealth = field(default_factory=ModelHealth)
    """The model endpoint's state as the turns' calls saw it."""
    profile_models: Mapping[str, tuple[str, ModelHealth]] = field(default_factory=dict)
    """(model, its state) of each profile with a model of its own (`llm_health` is the
    default profile's)."""
    mcp: Callable[[], Mapping[str, Mapping[str, object]]] = dict
    """Each MCP server's state and tool count (shown by /health and /ready, never gating)."""
    links: MediaLinks | None = None
    """Checks the signed file links of `/files/…`; None: the route answers 404."""
    files: StoredFiles | None = None
    """The blob store's files: pictures sent over the API are kept there, `/files/…` serves
    from it; None: pictures are refused (503) and `/files/…` answers 404."""
    skills: Skills | None = None
    """The skills and their write journal (the console's Skills page); None: turned off."""
    mcp_servers: Mapping[str, MCPServer] = field(default_factory=dict)
    """The MCP servers the hub runs, by name (the console's Tools page)."""
    pictures: Pictures | None = None
    """Decodes the API's pictures one at a time with the agent's (the process's one
    decoder); None: a decoder of the request's own, from the config."""
    triggers: TriggerService | None = None
    """The configured triggers (`/hooks/<name>`, `/api/triggers`); None: none here."""
    redactor: Redactor = field(default_factory=Redactor)
    """Takes the configured secrets out of every error body and `/health` (the supervisor's
    one redactor; the default knows only credential shapes)."""
    """This instance among the others: mode, leases held, sessions running here."""
