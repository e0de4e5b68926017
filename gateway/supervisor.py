"""The supervisor: wires Herald's parts together and owns every long-lived task.

One `asyncio.TaskGroup` holds the HTTP server, each adapter's runner and the systemd
watchdog. SIGTERM / SIGINT / SIGHUP drain: stop accepting, give running turns
`sessions.drain_timeout` to finish (then checkpoint them as interrupted), stop the server,
exit 0. (SIGHUP does not reload the configuration: a terminal that closes, or a `kill -HUP`,
stops Herald cleanly instead of killing it mid-turn.)
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import socket
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import uvicorn
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_core.agent import Agent, AgentSettings
from agent_core.llm import LLMProvider, ModelHealth, ObservedProvider, make_provider
from agent_core.mcp.hub import MCPHub
from agent_core.mcp.tools import MCPTools
from agent_core.memory import MemoryDocs, MemoryFiles, MemoryLimits, NamespacedDocs
from agent_core.skills.bundled import InstallReport, install_bundled
from agent_core.skills.service import Skills
from agent_core.skills.store import MANIFEST, SkillStore
from agent_core.skills.tools import SkillManageTool, SkillsListTool, SkillViewTool
from agent_core.tools import (
    ChannelSender,
    MemoryTool,
    ScheduleJobTool,
    SendMessageTool,
    SessionSearchTool,
    Tool,
    ToolContext,
    ToolError,
    ToolRegistry,
    ToolSource,
)
from gateway import platforms
from gateway.access import Access
from gateway.agents import ProfileAgents
from gateway.backoff import Backoff, FailureLog
from gateway.blobs import Blobs, open_blobs
from gateway.channels import Channels
from gateway.checkpoints import StoreCheckpoints
from gateway.cluster.bus import Signal, SignalAction
from gateway.cluster.node import Node, run_under
from gateway.commands import chat_menu
from gateway.config import HeraldConfig
from gateway.contracts.adapter import (
    Adapter,
    AdapterContext,
    AdapterState,
    Checkpoints,
    FileLinks,
    InboundSink,
    WebhookAdapter,
)
from gateway.contracts.config import PlatformSection
from gateway.contracts.errors import (
    AuthError,
    ConfigError,
    LeaseLost,
    NotReady,
    SetupError,
    ShuttingDown,
)
from gateway.contracts.messages import InboundMessage, SendLimits
from gateway.cron.clock import Clock, SystemClock
from gateway.cron.scheduler import CronScheduler
from gateway.cron.service import AgentJobs, JobService
from gateway.delivery import DeliveryWorker
from gateway.files_import import import_files
from gateway.http.app import OFFLINE_WARNING, create_app
from gateway.http.deps import AppDeps, ServingState
from gateway.http.server import server_config
from gateway.media import (
    KEY_FILE,
    MediaLinks,
    StoredFiles,
    file_destination,
    media_parts,
    no_other_targets,
    pictures_of,
    prune_forever,
    synthesizer,
)
from gateway.memory_sync import ExternalMemory, MemoryWrites, open_external
from gateway.metrics import Metrics
from gateway.profiles import DEFAULT
from gateway.redact import Redactor
from gateway.sdnotify import SystemdNotifier
from gateway.sessions import SessionManager
from gateway.state import import_state
from gateway.store import Store
from gateway.store.inbox import Inbox
from gateway.store.jobs import record_report
from gateway.store.leases import Lease, Leases
from gateway.store.memory_docs import SqlMemoryDocs
from gateway.store.outbox import Outbox
from gateway.store.profiles import StoredBindings
from gateway.store.skill_files import SkillMirror
from gateway.store.skills import SkillWrites
from gateway.tools.approvals import ChatApprovals
from gateway.tools.channels import OutboxChannels
from gateway.tools.people import StorePeople
from gateway.tools.places import Places
from gateway.triggers import outbound
from gateway.triggers.outbound import WebhookSender
from gateway.triggers.service import TriggerService

logger = logging.getLogger(__name__)

EXIT_GONE = 75
"""The exit code after another live process took this instance's id (EX_TEMPFAIL): the
service manager starts it again, and it waits until the id is free."""


class LeaseRight:
    """The cron scheduler schedules while this instance holds the `cron` lease."""

    def __init__(self, lease: Lease, leases: Leases | None) -> None:
        """`leases` is None for a single instance (the lease is local and never lost)."""
        self.lease = lease
        self.leases = leases

    async def holds(self) -> bool:
        """Whether the lease is held now (the local view)."""
        return self.lease.held()

    async def fence(self, conn: AsyncConnection) -> None:
        """The lease's token in the database (raises LeaseLost when another took it)."""
        if self.leases is None:
            return
        token = self.lease.token
        if token is None or not self.lease.held():
            raise LeaseLost(f"lease {self.lease.name} is not held here")
        await self.leases.check(conn, self.lease.name, token)


class AdapterRunner:
    """Keeps one adapter running: reconnects on NotReady, stops for good on AuthError.

    Any other error is treated like NotReady (logged with its traceback). Reconnects back off
    until a connection has lasted `stable` seconds (one that fails at once, say because the
    database is full, keeps backing off); a repeated failure is logged once per interval. A
    failure of one adapter never reaches the others or the supervisor.
    """

    def __init__(
        self,
        name: str,
        factory: Callable[[], Adapter],
        sink: InboundSink,
        metrics: Metrics,
        *,
        backoff: Backoff = Backoff(),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        limits: SendLimits = SendLimits(),
        clock: Callable[[], float] = time.monotonic,
        stable: float = 30.0,
    ) -> None:
        self.name = name
        self.factory = factory
        self.sink = sink
        self.limits = limits
        self.metrics = metrics
        self.backoff = backoff
        self.sleep = sleep
        self.clock = clock
        self.stable = stable
        self.failures = FailureLog(logger, f"adapter {name}", clock=clock)
        self.key: tuple[str, str] = (name.partition(":")[0], name.partition(":")[2] or "default")
        """(platform, account) of the adapter (set by the supervisor)."""
        self.state = AdapterState.STARTING
        self.adapter: Adapter | None = None
        self.last_error: str | None = None
        self.restarts = 0

    def live(self) -> Adapter | None:
        """The adapter while it is connected, else None."""
        return self.adapter if self.state is AdapterState.RECEIVING else None

    def liveness(self) -> AdapterState:
        """The adapter's own liveness while connected, else the runner's state."""
        if self.adapter is not None and self.state is AdapterState.RECEIVING:
            return self.adapter.liveness()
        return self.state

    async def run(self) -> None:
        """Run until cancelled, or until the adapter's credentials are refused."""
        attempt = 0
        while True:
            connected_at: float | None = None
            try:
                async with self.factory() as adapter:
                    self.adapter = adapter
                    self.state = AdapterState.RECEIVING
                    connected_at = self.clock()
                    await adapter.run(self.sink)
                raise NotReady("the receive loop ended")
            except asyncio.CancelledError:
                self.state = AdapterState.STOPPED
                raise
            except AuthError as err:
                self.state, self.last_error = AdapterState.FAILED, str(err)
                logger.error("adapter %s stopped: credentials refused: %s", self.name, err)
                return
            except ExceptionGroup as group:
                auth = group.subgroup(AuthError)
                self.last_error = str(auth.exceptions[0] if auth else group)
                if auth is not None:
                    self.state = AdapterState.FAILED
                    logger.error("adapter %s stopped: credentials refused: %s", self.name, group)
                    return
                error: Exception = group
            except NotReady as err:
                self.last_error, error = str(err), err
            except Exception as err:
                self.last_error, error = f"{type(err).__name__}: {err}", err
            finally:
                self.adapter = None
            if connected_at is not None and self.clock() - connected_at >= self.stable:
                attempt = 0  # it received for a while: a new run of failures starts
                self.failures.recovered()
            self.failures.failed(error, expected=isinstance(error, NotReady))
            self.state = AdapterState.RECONNECTING
            self.restarts += 1
            self.metrics.adapter_restarts.labels(adapter=self.name).inc()
            await self.sleep(self.backoff.delay(attempt))
            attempt += 1


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the supervisor owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class _NoSink:
    """The sink of a runner before the session manager exists (never used while running)."""

    async def accept(self, message: InboundMessage) -> None:
        raise ShuttingDown("Herald is starting; the platform will redeliver")


def adapter_name(
    platform: str, account: str, sections: Mapping[tuple[str, str], PlatformSection]
) -> str:
    """How an account's adapter is named in `/health`, `/ready`, the console, logs, metrics
    and its webhook path (`/webhooks/<name>`): the platform's name when it is the platform's
    only account, else `platform:account`. `sections` are every configured account, turned
    off or not (`PlatformsConfig.every_account`): turning one off renames no other."""
    if sum(1 for p, _ in sections if p == platform) == 1:
        return platform
    return f"{platform}:{account}"


def adapter_context(
    name: str,
    section: PlatformSection,
    state_dir: Path,
    checkpoints: Checkpoints,
    links: FileLinks | None = None,
    *,
    menu: Callable[[], Sequence[tuple[str, str]]] | None = None,
    webhook: str = "",
) -> AdapterContext:
    """What an adapter gets besides its section: received files go under
    `state_dir/files/<platform>/<account>/`; `links` signs media URLs of files it sends;
    `menu`: the commands for a command menu; `webhook`: its name under `/webhooks/` when
    not the platform's."""
    return AdapterContext(
        state_dir / "files" / name / section.account, checkpoints, links, menu, webhook
    )


def adapter_factory(
    name: str, section: PlatformSection, context: AdapterContext
) -> Callable[[], Adapter]:
    """How to build the adapter of a configured platform section (one per (re)connection)."""
    try:
        spec = platforms.spec(name)
    except LookupError as err:
        raise ConfigError(
            f"platforms.{name}: no adapter is available for this platform yet"
        ) from err
    # The spec imports the platform's SDK only now: each costs start-up time and memory.
    return spec.build(section, context)


class _NoChannels:
    """The send_message targets until a platform adapter is running."""

    def targets(self) -> list[str]:
        return []

    async def send(self, target: str, text: str, ctx: ToolContext) -> str:
        raise ToolError("no messaging platform is connected, so there is nowhere to send")


def build_agent(
    config: HeraldConfig,
    provider: LLMProvider,
    store: Store,
    jobs: JobService | None = None,
    external: ExternalMemory | None = None,
    *,
    channels: Channels | None = None,
    sender: ChannelSender | None = None,
    sources: Sequence[ToolSource] = (),
    places: Places | None = None,
    redact: Callable[[str], str] = lambda text: text,
    blobs: Blobs | None = None,
    profile: str = DEFAULT,
) -> tuple[Agent, MemoryFiles]:
    """The agent of `profile` with its tools, from config (`schedule_job` when `jobs` is
    given; the external memory provider's recall, tools and edit mirroring when `external`
    is; the media tools send files through `channels`, to the chats `places` allows;
    `send_message` sends through `sender`; `sources`: MCP servers' tools; every tool result
    passes `redact`). `provider` is the profile's model. Close `agent.transcriber` when there
    is one."""
    llm = config.profile_llm(profile)
    chosen = None if profile == DEFAULT else config.profiles[profile]
    namespace = None if chosen is None else chosen.namespace or profile
    namespace = None if namespace == DEFAULT else namespace
    docs: MemoryDocs = SqlMemoryDocs(store)
    if chosen is not None:
        docs = NamespacedDocs(docs, namespace, chosen.soul)
    memory = MemoryFiles(
        docs,
        MemoryLimits(config.memory.user_max_chars, config.memory.memory_max_chars),
        group_memory=config.memory.group_memory,
        # An external provider keeps one memory per person: only the default namespace
        # mirrors to it (README, Profiles).
        on_edit=None if external is None or namespace else MemoryWrites(store, external.queue),
        namespace=namespace,
    )
    tools: list[Tool] = [
        MemoryTool(memory),
        SessionSearchTool(store),
        SendMessageTool(sender or _NoChannels()),
    ]
    if jobs is not None:
        tools.append(ScheduleJobTool(AgentJobs(jobs, profile)))
    if external is not None and namespace is None:
        tools.extend(external.provider.tools())
    resolve = no_other_targets if places is None else file_destination(places)
    media = media_parts(config, store, channels or Channels(), resolve, blobs, llm=llm)
    tools.extend(media.tools)
    skills = build_skills(config, store, profile)
    if skills is not None:
        tools += [
            SkillsListTool(skills, memory.skill_owner),
            SkillViewTool(skills, memory.skill_owner),
            SkillManageTool(skills, memory.skill_owner),
        ]
    settings = AgentSettings(
        history_window=llm.history_window,
        context_window=llm.context_window,
        compression_threshold=llm.compression_threshold,
        max_tool_iterations=llm.max_tool_iterations,
        memory_pass=llm.memory_pass,
    )
    recall = None if external is None or namespace is not None else external.recall
    agent = Agent(
        provider,
        store,
        memory,
        ToolRegistry(tools, sources, redact=redact),
        settings,
        recall=recall,
        vision=media.vision,
        transcriber=media.transcriber,
        skills=skills,
        allowed=None if chosen is None or chosen.tools == "all" else frozenset(chosen.tools),
        profile=profile,
    )
    return agent, memory


def build_skills(
    config: HeraldConfig, store: Store | None, profile: str = DEFAULT
) -> Skills | None:
    """The skills of this Herald as `profile` sees them (None when `skills.enabled` is
    false): the shared ones (unless the profile turns them off) and its own folders; their
    writes are recorded in `store`."""
    if not config.skills.enabled:
        return None
    journal = None if store is None else SkillWrites(store)
    sync = None if store is None else SkillMirror(store, config.state_dir)
    dirs = [Path(d).expanduser() for d in config.skills.dirs]
    if profile != DEFAULT:
        own = config.profiles[profile].skills
        dirs = [*(dirs if own.shared else []), *(Path(d).expanduser() for d in own.dirs)]
    return Skills(SkillStore(config.state_dir, dirs), journal, config.skills.settings(), sync)


async def _import_state(cfg: HeraldConfig, store: Store, blobs: Blobs) -> None:
    """Move what an older version kept in `state_dir` into the database and the blob store
    (cheap when there is nothing left); a failure is logged (`herald state import` tries
    again), never fatal."""
    try:
        files = await import_files(cfg.state_dir, store, blobs)
    except Exception as err:
        logger.error("received and sent files not imported (run `herald state import`): %s", err)
    else:
        if files:
            logger.info("moved into the blob store: %s", ", ".join(files))
    try:
        done = await import_state(cfg.state_dir, store, skills=cfg.skills.enabled)
    except Exception as err:
        logger.error("state directory not imported (run `herald state import`): %s", err)
        return
    if done.moved:
        logger.info("moved into the database: %s", ", ".join(done.moved))
    for line in done.kept:
        logger.warning("not moved: %s", line)


async def _bundled(state_dir: Path, store: Store) -> None:
    """Install or upgrade the bundled skills and store what changed; a failure is logged
    (the next start tries again), never fatal."""
    root = state_dir / "skills"
    done: list[Path] = []
    try:
        async with SkillMirror(store, state_dir).writing(lambda: done):
            report = _install_bundled(root)
            names = [] if report is None else report.installed + report.updated
            if names:
                done += [root / n for n in names] + [root / MANIFEST]
    except Exception as err:
        logger.warning("bundled skills not stored in the database: %s", err)


def _install_bundled(root: Path) -> InstallReport | None:
    """Install or upgrade the bundled skills; a failure is logged, never fatal."""
    try:
        return install_bundled(root)
    except OSError as err:
        logger.warning("bundled skills not installed in %s: %s", root, err)
        return None


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""Each starts the drain."""


@dataclass(frozen=True, slots=True)
class _Core:
    """What the agent phase of `Supervisor.run` made, for the phases after it."""

    store: Store
    sections: dict[tuple[str, str], PlatformSection]
    """The enabled accounts' sections by (platform, account)."""
    provider: LLMProvider
    health: ModelHealth
    jobs: JobService
    channels: Channels
    approvals: ChatApprovals
    hub: MCPHub
    sender: OutboxChannels
    agent: Agent
    files: StoredFiles
    """Received and sent files, their bytes in the blob store."""
    profiles: ProfileAgents
    """The agent of every profile (`agent` is the default one's) and the bindings."""
    profile_models: dict[str, tuple[str, ModelHealth]]
    """(model, its health) of each profile with a model of its own."""


class Supervisor:
    """Runs the daemon until SIGTERM / SIGINT / SIGHUP (or `stop()`), then drains and returns."""

    def __init__(
        self,
        config: HeraldConfig,
        *,
        environ: Mapping[str, str] | None = None,
        cron_clock: Clock | None = None,
        redactor: Redactor | None = None,
    ) -> None:
        self.config = config
        self.redactor = redactor or Redactor.of(config)
        """Takes the configured secrets out of every string that leaves Herald."""
        self.cron_clock: Clock = cron_clock or SystemClock()
        self.notifier = SystemdNotifier(os.environ if environ is None else environ)
        self.metrics = Metrics()
        self.state = ServingState()
        self.runners: dict[str, AdapterRunner] = {}
        """By adapter name (`adapter_name`: `platform`, or `platform:account` on a platform
        with several accounts)."""
        self.receiver_leases: dict[tuple[str, str], Lease] = {}
        """By (platform, account): the leases of the accounts whose receiver runs on one
        instance at a time (`adapter:<platform>:<account>`), each failing over alone."""
        self.exit_code = 0
        self.memory: ExternalMemory | None = None
        """The external memory provider, while running with one."""
        self.links: MediaLinks | None = None
        """Signs the media URLs of files sent by URL (Twilio); None without HTTP."""
        self._stop = asyncio.Event()
        self._sock: socket.socket | None = None
        """The HTTP port, bound first thing in `run`."""
        self._starting: asyncio.Task[int] | None = None
        """`run`'s task until Herald serves: a stop signal cancels it."""
        self._stopped_starting = False
        self._menu: Callable[[], Sequence[tuple[str, str]]] | None = None
        self._access: Access
        """Who may do what, made by the sessions phase."""

    def stop(self) -> None:
        """Begin the drain (what SIGTERM does)."""
        self._stop.set()

    def _webhook_adapter(self, name: str) -> WebhookAdapter | None:
        runner = self.runners.get(name)
        adapter = None if runner is None else runner.live()
        return adapter if isinstance(adapter, WebhookAdapter) else None

    def adapter_states(self) -> dict[str, AdapterState]:
        """Each enabled adapter's liveness."""
        return {name: r.liveness() for name, r in self.runners.items()}

    async def run(self) -> int:
        """Serve until asked to stop; return the process exit code.

        Raises SetupError (a state directory it cannot make, a port in use, a database it
        cannot open or that a newer Herald migrated) and ConfigError before serving.

        The daemon is built in phases, each handing the next what it made: the store and the
        node, the agent, the channels, delivery, the sessions, cron, then HTTP (`_serve`).
        Every resource a phase opens is entered on the one exit stack, so it is closed in
        reverse order however far the start got.
        """
        loop = self._begin()
        try:
            async with AsyncExitStack() as stack:
                store, node = await self._store_and_node(stack)
                core = await self._agent(stack, store)
                self._channels(core, node)
                delivery, on_outbox = self._delivery(core, node)
                manager = await self._sessions(stack, core, node, on_outbox)
                scheduler = self._cron(core, node, manager, on_outbox)
                triggers = await self._triggers(stack, core, node, on_outbox)
                deps = self._http(core, node, manager, triggers)
                await self._serve(deps, manager, delivery, scheduler, node, triggers=triggers)
        except asyncio.CancelledError:
            if not self._stopped_while_starting():
                raise
        finally:
            self._end(loop)
        logger.info("stopped")
        return self.exit_code

    # The phases of `run` ---------------------------------------------------------------------

    async def _store_and_node(self, stack: AsyncExitStack) -> tuple[Store, Node]:
        """The store (migrated) and this instance's node: leases, lanes and the signal bus."""
        cfg = self.config
        store = await stack.enter_async_context(Store.open(cfg.effective_database_url))
        self.metrics.watch_store(store.stats)
        node = await stack.enter_async_context(
            Node(store, cfg.effective_instance_id, cfg.cluster, cfg.effective_database_url)
        )
        return store, node

    async def _agent(self, stack: AsyncExitStack, store: Store) -> _Core:
        """The model, jobs, external memory, skills, approvals, MCP servers and the agent."""
        cfg = self.config
        blobs = await open_blobs(cfg, store, stack)
        files = StoredFiles(Inbox(store), blobs)
        if cfg.api.enabled:
            self.links = await MediaLinks.open(store, cfg.files.link_ttl, cfg.state_dir / KEY_FILE)
        health = ModelHealth()
        failed_calls = self.metrics.model_calls_failed
        provider: LLMProvider = ObservedProvider(
            make_provider(cfg.llm),
            health,
            lambda kind: failed_calls.labels(kind=kind).inc(),
            redact=self.redactor,
        )
        stack.push_async_callback(provider.aclose)
        if provider.name == "echo":
            logger.warning("*** %s ***", OFFLINE_WARNING.upper())
        sections = cfg.platforms.accounts()
        jobs = JobService(
            store, configured=sections, default_timezone=cfg.cron.timezone, clock=self.cron_clock
        )
        self.memory = await open_external(
            cfg.memory, cfg.state_dir, store, self.metrics, stack, redact=self.redactor
        )
        await _import_state(cfg, store, blobs)
        if cfg.skills.enabled and cfg.skills.bundled:
            await _bundled(cfg.state_dir, store)
        channels = Channels()
        approvals = ChatApprovals(
            store,
            sections,
            allow_api=cfg.api.allow_approval_tools,
            redact=self.redactor.secrets,
            limits=channels.limits,
        )
        hub = await stack.enter_async_context(MCPHub(cfg.mcp, redact=self.redactor))
        mcp_tools = MCPTools(
            list(hub.servers.values()),
            StorePeople(store),
            approvals,
            approval_timeout=cfg.mcp.approval_timeout,
        )
        places = Places(
            store, sections, homes=cfg.home.targets, allowed=cfg.tools.send_message.targets
        )
        sender = OutboxChannels(store, places, channels)
        agents: dict[str, Agent] = {}
        profile_models: dict[str, tuple[str, ModelHealth]] = {}
        for name in cfg.profile_names():
            chosen = None if name == DEFAULT else cfg.profiles[name]
            model = provider
            if chosen is not None and chosen.llm:  # a model of its own, its own health
                own_health = ModelHealth()
                model = ObservedProvider(
                    make_provider(cfg.profile_llm(name)),
                    own_health,
                    lambda kind: failed_calls.labels(kind=kind).inc(),
                    redact=self.redactor,
                )
                stack.push_async_callback(model.aclose)
                profile_models[name] = (model.model, own_health)
            tools = mcp_tools
            if chosen is not None and chosen.mcp != "all":  # only the servers it names
                tools = MCPTools(
                    [s for n, s in hub.servers.items() if n in chosen.mcp],
                    StorePeople(store),
                    approvals,
                    approval_timeout=cfg.mcp.approval_timeout,
                )
            agents[name], _memory = build_agent(
                cfg,
                model,
                store,
                jobs,
                self.memory,
                channels=channels,
                sender=sender,
                sources=[tools],
                places=places,
                redact=self.redactor,
                blobs=blobs,
                profile=name,
            )
            transcriber = agents[name].transcriber
            if transcriber is not None:
                stack.push_async_callback(transcriber.aclose)
        agent = agents[DEFAULT]
        profiles = ProfileAgents(agents, cfg.binding_rules(), StoredBindings(store))
        skills = agent.skills
        self._menu = lambda: chat_menu(skills)
        return _Core(
            store,
            sections,
            provider,
            health,
            jobs,
            channels,
            approvals,
            hub,
            sender,
            agent,
            files,
            profiles,
            profile_models,
        )

    def _channels(self, core: _Core, node: Node) -> None:
        """A runner per configured account, registered with the channels (and leased when
        its receiver runs on one instance at a time)."""
        for (name, account), section in core.sections.items():
            runner = self._runner(
                name,
                section,
                StoreCheckpoints(core.store, name, account),
                self.config.platforms.every_account(),
            )
            core.channels.register(name, account, runner.limits, runner.live)
            if section.singleton:
                self.receiver_leases[(name, account)] = node.lease(f"adapter:{name}:{account}")

    def _delivery(self, core: _Core, node: Node) -> tuple[DeliveryWorker, Callable[[], None]]:
        """The delivery worker, and `on_outbox`: what everything that queues a chunk calls
        (it wakes delivery here and tells the other instances)."""
        delivery = DeliveryWorker(
            Outbox(core.store, listeners=[record_report]),
            core.channels,
            self.config.delivery,
            self.metrics,
            owner=node.id,
            lease_ttl=None if node.solo else self.config.cluster.lease_ttl,
            redactor=self.redactor,
            files=core.files,
        )

        def on_outbox() -> None:
            delivery.wake()
            node.announce_outbox()

        def on_signal(signal: Signal) -> None:
            if signal.action in (SignalAction.OUTBOX, SignalAction.RESYNC):
                delivery.wake()

        core.approvals.on_outbox = core.sender.on_outbox = on_outbox
        node.bus.subscribe(on_signal)
        return delivery, on_outbox

    async def _sessions(
        self, stack: AsyncExitStack, core: _Core, node: Node, on_outbox: Callable[[], None]
    ) -> SessionManager:
        """The session manager (access, lanes, turns), made every runner's sink."""
        cfg = self.config
        self._access = Access(core.store, core.sections, cfg.access)
        speech = synthesizer(cfg)
        if speech is not None:
            stack.push_async_callback(speech.aclose)
        manager = await stack.enter_async_context(
            SessionManager(
                core.store,
                core.agent,
                cfg.sessions,
                self.metrics,
                core.agent.snapshot,
                channels=core.channels,
                access=self._access,
                platforms=core.sections,
                on_outbox=on_outbox,
                lanes=node.lanes,
                bus=node.bus,
                scan_interval=cfg.cluster.scan_interval,
                approvals=core.approvals,
                memory_sync=None if self.memory is None else self.memory.queue,
                files=core.files,
                speech=speech,
                homes=cfg.home.targets,
                redact=self.redactor.secrets,
                profiles=core.profiles,
                profile_homes={name: cfg.profile_home(name) for name in cfg.profiles},
            )
        )
        for runner in self.runners.values():
            runner.sink = manager
        return manager

    def _cron(
        self, core: _Core, node: Node, manager: SessionManager, on_outbox: Callable[[], None]
    ) -> CronScheduler:
        """The scheduler (leased in a cluster), woken when a job changes."""
        cfg = self.config
        scheduler = CronScheduler(
            core.store,
            core.agent,
            cfg.cron,
            homes=cfg.home.targets,
            sections=core.sections,
            state_dir=cfg.state_dir,
            channels=core.channels,
            snapshot=core.agent.snapshot,
            clock=self.cron_clock,
            instance=cfg.effective_instance_id,
            on_outbox=on_outbox,
            right=LeaseRight(node.lease("cron"), None if node.solo else node.leases)
            if cfg.cron.enabled
            else None,
            lease_ttl=cfg.cluster.lease_ttl,
            operator=self._access.job_operator,
            profiles=core.profiles,
            profile_homes={name: cfg.profile_home(name) for name in cfg.profiles},
        )
        core.jobs.on_change = scheduler.wake
        return scheduler

    async def _triggers(
        self, stack: AsyncExitStack, core: _Core, node: Node, on_outbox: Callable[[], None]
    ) -> TriggerService:
        """The triggers (`/hooks/<name>`) and the outbound webhooks their results go to (a
        channel of their own, so the outbox retries and dead-letters their POSTs)."""
        cfg = self.config
        if cfg.webhooks:
            sender = await stack.enter_async_context(WebhookSender(cfg.webhooks))
            core.channels.register(
                outbound.PLATFORM, outbound.ACCOUNT, outbound.LIMITS, lambda: sender
            )
        return TriggerService(
            core.store,
            core.agent,
            cfg.triggers,
            webhooks=list(cfg.webhooks),
            homes=cfg.home.targets,
            sections=core.sections,
            channels=core.channels,
            snapshot=core.agent.snapshot,
            instance=node.id,
            run_timeout=cfg.cron.run_timeout,
            max_concurrent=cfg.cron.max_concurrent_runs,
            poll_interval=cfg.cron.poll_interval,
            lease_ttl=cfg.cluster.lease_ttl,
            metrics=self.metrics,
            redactor=self.redactor,
            on_outbox=on_outbox,
            profiles=core.profiles,
            profile_homes={name: cfg.profile_home(name) for name in cfg.profiles},
        )

    def _http(
        self,
        core: _Core,
        node: Node,
        manager: SessionManager,
        triggers: TriggerService | None = None,
    ) -> AppDeps:
        """What the HTTP app reads: the API, health, console, webhooks and triggers."""
        hub = core.hub
        return AppDeps(
            config=self.config,
            store=core.store,
            manager=manager,
            metrics=self.metrics,
            llm_provider=core.provider.name,
            llm_model=core.provider.model,
            adapters=self.adapter_states,
            state=self.state,
            webhooks=self._webhook_adapter,
            jobs=core.jobs,
            llm_health=core.health,
            profile_models=core.profile_models,
            mcp=lambda: {n: st.as_dict() for n, st in hub.status().items()},
            links=self.links,
            files=core.files,
            skills=core.agent.skills,
            mcp_servers=hub.servers,
            cluster=lambda: {
                "mode": "single" if node.solo else "cluster",
                "holds": node.holds(),
                "sessions_here": manager.lanes,
                "signals": "connected" if node.bus.connected else "reconnecting",
            },
            memory=self._memory_health,
            pictures=pictures_of(core.agent.vision),
            triggers=triggers,
            redactor=self.redactor,
        )

    def _begin(self) -> asyncio.AbstractEventLoop:
        """Make the state directory, take the HTTP port, and catch the stop signals; the loop."""
        cfg = self.config
        try:
            cfg.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as err:
            raise SetupError(
                f"cannot create the state directory {cfg.state_dir}: {err.strerror}; "
                "create it writable for this user, or set state_dir (HERALD_HOME) elsewhere"
            ) from err
        try:  # on PostgreSQL nothing else would notice before a file, skill or workspace write
            with tempfile.TemporaryFile(dir=cfg.state_dir):
                pass
        except OSError as err:
            raise SetupError(
                f"the state directory {cfg.state_dir} is not writable: {err.strerror}; make "
                f"it writable for this user (uid {os.getuid()}; in a container: chown it to "
                "that uid), or set state_dir (HERALD_HOME) elsewhere"
            ) from err
        loop = asyncio.get_running_loop()
        # The port is taken before anything starts (tool servers above all): a port in use
        # is one clear error at once, with nothing started that must be stopped.
        self._sock = _bind(cfg.api.host, cfg.api.port) if cfg.api.enabled else None
        self._starting = asyncio.current_task()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self._on_signal, sig)
        return loop

    def _end(self, loop: asyncio.AbstractEventLoop) -> None:
        self._starting = None
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _stopped_while_starting(self) -> bool:
        """Whether the cancellation being handled is a stop signal's during the start (then
        it is taken back: `run` returns as after a drain)."""
        task = asyncio.current_task()
        if not self._stopped_starting or task is None or task.uncancel() > 0:
            return False
        logger.info("stopped before Herald was ready")
        return True

    def _on_signal(self, sig: signal.Signals) -> None:
        if self._stop.is_set():
            logger.warning("%s again: already draining", sig.name)
            return
        if sig is signal.SIGHUP:
            logger.info("SIGHUP received: draining and stopping (SIGHUP does not reload)")
        else:
            logger.info("%s received: draining", sig.name)
        self._stop.set()
        if self._starting is not None:
            # Still starting (a database, a memory provider, tool servers): stop that now
            # rather than after it, which may never come.
            self._stopped_starting = True
            self._starting.cancel()

    def _runner(
        self,
        name: str,
        section: PlatformSection,
        checkpoints: Checkpoints,
        sections: Mapping[tuple[str, str], PlatformSection],
    ) -> AdapterRunner:
        label = adapter_name(name, section.account, sections)
        context = adapter_context(
            name,
            section,
            self.config.state_dir,
            checkpoints,
            self.links,
            menu=self._menu,
            webhook="" if label == name else label,
        )
        factory = adapter_factory(name, section, context)
        runner = AdapterRunner(label, factory, _NoSink(), self.metrics, limits=factory().limits)
        runner.key = (name, section.account)
        self.runners[label] = runner
        return runner

    async def _serve(
        self,
        deps: AppDeps,
        manager: SessionManager,
        delivery: DeliveryWorker,
        scheduler: CronScheduler,
        node: Node,
        *,
        triggers: TriggerService,
    ) -> None:
        cfg = self.config
        files = deps.files
        assert files is not None  # set by `_http`
        server: _Server | None = None
        sock = self._sock
        if sock is not None:  # before the task group: one error, not an ExceptionGroup
            _listen(sock, cfg.api.host, cfg.api.port)
        async with asyncio.TaskGroup() as tg:
            background: list[asyncio.Task[None]] = []
            if cfg.api.enabled:
                app = create_app(deps)
                graceful = int(cfg.sessions.drain_timeout) + 5
                server = _Server(server_config(app.state.asgi, cfg.api, graceful_timeout=graceful))
                assert sock is not None
                server_task = tg.create_task(server.serve(sockets=[sock]), name="http")
                while not server.started:
                    if server_task.done():
                        raise RuntimeError("the HTTP server failed to start")
                    await asyncio.sleep(0.01)
                host, port = sock.getsockname()[:2]
                logger.info("HTTP API listening on http://%s:%d", host, port)
            background.append(tg.create_task(self._member(node), name="cluster"))
            for name, runner in self.runners.items():
                lease = self.receiver_leases.get(runner.key)
                work = runner.run() if lease is None else self._leased(node, runner, lease)
                background.append(tg.create_task(work, name=f"adapter {name}"))
            sender = tg.create_task(delivery.run(), name="delivery")
            if self.memory is not None:
                # One sender in a cluster (the lease), so each person's syncs stay in order.
                syncs = run_under(node.lease("memory-sync"), self.memory.sender.run)
                background.append(tg.create_task(syncs, name="memory sync"))
            if cfg.cron.enabled:
                background.append(tg.create_task(scheduler.run(), name="cron"))
                if not node.solo:
                    background.append(
                        tg.create_task(_wake_when_held(node.lease("cron"), scheduler.wake))
                    )
            background.append(tg.create_task(triggers.run(), name="triggers"))
            background.append(
                tg.create_task(self.notifier.run_watchdog(self._healthy), name="watchdog")
            )
            background.append(
                tg.create_task(
                    prune_forever(
                        files.blobs,
                        [cfg.state_dir / "files", cfg.state_dir / "cache" / "files"],
                        cfg.files.retention_days,
                    ),
                    name="files",
                )
            )
            self._starting = None  # from here a stop signal drains
            self.state.serving = True
            self.notifier.ready()
            logger.info("Herald is ready (instance %s)", cfg.effective_instance_id)

            await self._stop.wait()

            self.state.draining = True
            self.notifier.stopping()
            if not node.solo:
                # Hand singleton work over now, not after the drain: another instance can
                # receive and schedule while this one finishes its turns.
                handed = [*self.receiver_leases.values(), node.lease("cron")]
                if self.memory is not None:
                    handed.append(node.lease("memory-sync"))
                for lease in handed:
                    await node.forget(lease.name)
            await asyncio.gather(
                manager.drain(cfg.sessions.drain_timeout),
                scheduler.drain(cfg.sessions.drain_timeout),
                triggers.drain(cfg.sessions.drain_timeout),
            )
            if not await delivery.flush(cfg.delivery.flush_timeout):
                logger.warning("stopping with chunks still to deliver; they go out after a restart")
            for task in background:
                task.cancel()
            sender.cancel()
            if server is not None:
                server.should_exit = True

    async def _member(self, node: Node) -> None:
        await node.gone.wait()
        self.exit_code = EXIT_GONE
        self._stop.set()

    @staticmethod
    async def _leased(node: Node, runner: AdapterRunner, lease: Lease) -> None:
        """Run the receiver while this instance holds its lease; stand by otherwise. A
        receiver that gives up for good (bad credentials) lets the lease go to the others."""

        async def receive() -> None:
            try:
                await runner.run()
            finally:
                if runner.state is not AdapterState.FAILED:
                    runner.state = AdapterState.STANDBY

        await lease.tried.wait()  # starting, until the first try for the lease is decided
        if not lease.held():
            runner.state = AdapterState.STANDBY
        await run_under(lease, receive)
        await node.forget(lease.name)

    def _memory_health(self) -> dict[str, object]:
        if self.memory is None:
            return {"provider": "none"}
        return self.memory.describe()

    def _healthy(self) -> bool:
        return self.state.serving and not self._stop.is_set()


async def _wake_when_held(lease: Lease, wake: Callable[[], None]) -> None:
    """Call `wake` each time this instance comes to hold `lease` (the scheduler looks at
    its jobs at once after a takeover, not at its next poll)."""
    while True:
        await lease.wait_held()
        wake()
        await lease.wait_lost()


def _bind(host: str, port: int) -> socket.socket:
    """A socket bound to the HTTP address, not listening yet (connections are refused, not
    left waiting, while Herald starts). Raises SetupError when the address is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio only disables Nagle on sockets that say they are TCP.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise _unusable(host, port, err) from err
    sock.setblocking(False)
    return sock


def _listen(sock: socket.socket, host: str, port: int) -> None:
    """Start listening on the socket `_bind` made; SetupError when another process took
    the port meanwhile (both bound it before either listened)."""
    try:
        sock.listen(2048)
    except OSError as err:
        raise _unusable(host, port, err) from err


def _unusable(host: str, port: int, err: OSError) -> SetupError:
    fix = (
        "stop what uses it (another Herald?) or set api.port"
        if err.errno == errno.EADDRINUSE
        else "set api.host / api.port to an address of this machine"
    )
    return SetupError(f"cannot listen on {host}:{port}: {err.strerror}; {fix}")
