"""The message path assembled for tests: real store, session manager, outbox and delivery
worker, with a recording fake adapter and a gated LLM at the seams."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_core.agent import Agent, AgentSettings
from agent_core.memory import MemoryFiles
from agent_core.tools import ToolContext, ToolRegistry
from gateway.access import Access
from gateway.channels import Channels
from gateway.cluster.node import Node
from gateway.config import AccessConfig, DeliveryConfig, SessionsConfig
from gateway.contracts.config import PlatformSection
from gateway.contracts.ids import SessionKey
from gateway.delivery import DeliveryWorker
from gateway.metrics import Metrics
from gateway.sessions import SessionManager
from gateway.store import Store
from gateway.store.inbox import Inbox, InboxRow, Outcome
from gateway.store.outbox import Outbox
from tests.fakes.platform import GatedLLM, RecordingAdapter


class GateTool:
    """A tool named `echo` that waits until the test opens `gate`; records its calls."""

    name = "echo"
    description = "Echo the arguments back, when allowed to."

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()

    @property
    def parameters(self) -> dict[str, Any]:
        """Any object."""
        return {"type": "object", "properties": {}}

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> str:
        self.entered.set()
        await self.gate.wait()
        return json.dumps(args, sort_keys=True)


@dataclass
class Rig:
    """Everything a message-path test needs, running."""

    store: Store
    llm: GatedLLM
    adapter: RecordingAdapter
    manager: SessionManager
    delivery: DeliveryWorker
    outbox: Outbox
    inbox: Inbox
    tool: GateTool

    async def rows(self, key: str) -> list[InboxRow]:
        """The inbound rows of a session key, oldest first."""
        return await self.inbox.for_session(SessionKey(key))

    async def wait_rows(
        self,
        key: str,
        predicate: Callable[[list[InboxRow]], bool],
        timeout: float = 10.0,
    ) -> list[InboxRow]:
        """Poll the inbox until `predicate(rows)` holds (the store has no change feed)."""
        async with asyncio.timeout(timeout):
            while True:
                rows = await self.rows(key)
                if predicate(rows):
                    return rows
                await asyncio.sleep(0.01)

    async def settled(self, key: str, n: int, timeout: float = 10.0) -> list[InboxRow]:
        """Wait until `n` rows of the key have an outcome."""
        return await self.wait_rows(
            key, lambda rows: sum(r.outcome is not None for r in rows) >= n, timeout
        )

    async def idle(self, timeout: float = 10.0) -> None:
        """Wait until no lane is busy."""
        async with asyncio.timeout(timeout):
            while self.manager.lanes:
                await asyncio.sleep(0.01)


def outcomes(rows: list[InboxRow]) -> list[tuple[str, Outcome | None]]:
    """(text, outcome) of each row."""
    return [(r.text, r.outcome) for r in rows]


@asynccontextmanager
async def running_rig(
    store: Store,
    tmp_path: Path,
    *,
    sessions: SessionsConfig | None = None,
    delivery: DeliveryConfig | None = None,
    access: AccessConfig | None = None,
    section: PlatformSection | None = None,
    adapter: RecordingAdapter | None = None,
    gated: bool = True,
    node: Node | None = None,
    llm: GatedLLM | None = None,
) -> AsyncIterator[Rig]:
    """A running message path on the fake platform `test`, account `acct`.

    Default access: everyone is allowed (`allowed_users: ["*"]`); pass `section` to test
    allowlists and pairing. With `node` (entered by the caller), the rig is one instance of
    a cluster: its lanes are claimed in SQL and the node's heartbeat and signals run.
    """
    llm = llm or GatedLLM(gated=gated)
    tool = GateTool()
    agent = Agent(
        llm, store, MemoryFiles(tmp_path), ToolRegistry([tool]), AgentSettings(memory_pass=False)
    )
    adapter = adapter or RecordingAdapter()
    section = section or PlatformSection(account="acct", allowed_users=("*",))
    channels = Channels()
    channels.register("test", "acct", adapter.limits, lambda: adapter)
    metrics = Metrics()
    outbox = Outbox(store)
    worker = DeliveryWorker(
        outbox,
        channels,
        delivery or DeliveryConfig(backoff_initial=0.01, backoff_max=0.05),
        metrics,
    )
    platforms = {("test", section.account): section}

    async def no_snapshot(*_: object) -> tuple[str, str]:
        return "", ""

    manager = SessionManager(
        store,
        agent,
        sessions or SessionsConfig(debounce_seconds=0, ack_interval=0, drain_timeout=0.5),
        metrics,
        no_snapshot,
        channels=channels,
        access=Access(store, platforms, access or AccessConfig()),
        platforms=platforms,
        on_outbox=worker.wake,
        lanes=None if node is None else node.lanes,
        bus=None if node is None else node.bus,
        scan_interval=0.2,
    )
    async with asyncio.TaskGroup() as tg, manager:
        tasks = [tg.create_task(worker.run())]
        try:
            yield Rig(store, llm, adapter, manager, worker, outbox, Inbox(store), tool)
        finally:
            llm.open_all()
            tool.gate.set()
            for task in tasks:
                task.cancel()
