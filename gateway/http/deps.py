"""What the HTTP handlers need, handed to the app by the supervisor."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from agent_core.llm import ModelHealth
from gateway.config import HeraldConfig
from gateway.contracts.adapter import AdapterState, WebhookAdapter
from gateway.cron.service import JobService
from gateway.metrics import Metrics
from gateway.sessions import SessionManager
from gateway.store import Store


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
    llm_health: ModelHealth = field(default_factory=ModelHealth)
    """The model endpoint's state as the turns' calls saw it."""
    """This instance among the others: mode, leases held, sessions running here."""
