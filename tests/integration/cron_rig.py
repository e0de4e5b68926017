"""The scheduler assembled for tests: real store, agent, outbox and delivery worker, a
recording fake platform `test` (account `acct`), a scripted LLM and a fake clock.

A test may add real adapters (entered, against their platform's fake) beside `test`, and
tools for the agent (the scripted LLM can answer with tool calls)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from agent_core.agent import Agent, AgentSettings
from agent_core.llm import Completion, TokenCallback, Usage
from agent_core.memory import MemoryFiles
from agent_core.tools import Tool, ToolRegistry
from gateway.channels import Channels
from gateway.config import CronConfig, DeliveryConfig
from gateway.contracts.adapter import Adapter
from gateway.contracts.config import PlatformSection
from gateway.contracts.errors import LLMUnavailable
from gateway.contracts.history import ChatMessage, Role
from gateway.cron.scheduler import CronScheduler
from gateway.cron.service import JobService, JobSpec
from gateway.delivery import DeliveryWorker
from gateway.metrics import Metrics
from gateway.store import Store
from gateway.store.jobs import Job, Run, RunStatus, record_report
from gateway.store.outbox import Outbox
from tests.fakes.clock import FakeClock
from tests.fakes.platform import RecordingAdapter

WAIT = 10.0


@dataclass
class ScriptLLM:
    """Answers each run `report: <job prompt>`, unless told otherwise per prompt.

    `replies[prompt]` is a list of texts, completions (tool calls) or exceptions used one per
    call; `hold` (when set) keeps every call waiting until the test sets it. `requests`
    keeps the messages of every call.
    """

    name: str = "script"
    model: str = "script"
    calls: list[str] = field(default_factory=list)
    replies: dict[str, list[str | Completion | Exception]] = field(default_factory=dict)
    requests: list[list[ChatMessage]] = field(default_factory=list)
    hold: asyncio.Event | None = None
    started: asyncio.Event = field(default_factory=asyncio.Event)

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[Mapping[str, Any]] = (),
        on_token: TokenCallback | None = None,
    ) -> Completion:
        last = next(m for m in reversed(messages) if m.role is Role.USER).content
        prompt = last.split("\n\n", 1)[-1]
        self.calls.append(prompt)
        self.requests.append(list(messages))
        self.started.set()
        if self.hold is not None:
            await self.hold.wait()
        queue = self.replies.get(prompt)
        reply: str | Completion | Exception = queue.pop(0) if queue else f"report: {prompt}"
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, Completion):
            return reply
        return Completion(reply, usage=Usage(10, 2))

    def fail(self, prompt: str, times: int) -> None:
        """The next `times` runs of `prompt` fail (the model is unavailable)."""
        self.replies.setdefault(prompt, []).extend(
            [LLMUnavailable("fake LLM: 503 overloaded")] * times
        )

    async def check(self) -> str:
        return "script"

    async def aclose(self) -> None:
        return None


def cron_config(**changes: Any) -> CronConfig:
    """A cron config for tests: quick polling, one hour of catch-up grace."""
    values: dict[str, Any] = {"poll_interval": 0.05, "catchup_grace": 3600, "run_timeout": 30}
    values.update(changes)
    return CronConfig(**values)


@dataclass
class CronRig:
    """A running scheduler and what it delivers through."""

    store: Store
    clock: FakeClock
    llm: ScriptLLM
    adapter: RecordingAdapter
    service: JobService
    scheduler: CronScheduler
    outbox: Outbox
    state_dir: Path

    async def add(self, prompt: str, schedule: str, **fields: Any) -> Job:
        """Create a job (targets default to `home`)."""
        return await self.service.create(
            JobSpec(prompt=prompt, schedule=schedule, **fields), created_by="test"
        )

    async def runs(self, job_id: str) -> list[Run]:
        """The job's runs, oldest scheduled time first."""
        return list(reversed(await self.service.jobs.runs(job_id, limit=1000)))

    async def wait_runs(
        self, job_id: str, predicate: Callable[[list[Run]], bool], timeout: float = WAIT
    ) -> list[Run]:
        """Poll the job's runs until `predicate(runs)` holds."""
        async with asyncio.timeout(timeout):
            while True:
                runs = await self.runs(job_id)
                if predicate(runs):
                    return runs
                await asyncio.sleep(0.01)

    async def settled(self, job_id: str, count: int, timeout: float = WAIT) -> list[Run]:
        """Wait until `count` runs have finished and their delivery status is decided."""

        def done(runs: list[Run]) -> bool:
            final = [
                r
                for r in runs
                if r.status not in (RunStatus.RUNNING, RunStatus.QUEUED)
                and (r.delivery_status is None or r.delivery_status != "pending")
            ]
            return len(final) >= count

        return await self.wait_runs(job_id, done, timeout)

    async def at(self, when: datetime) -> None:
        """Move the clock to `when` and wait until the scheduler has looked at the jobs."""
        seen = self.scheduler.ticks
        self.clock.set(when)
        self.scheduler.wake()
        # A look already under way may have read the old time: wait for the one after it.
        async with asyncio.timeout(WAIT):
            while self.scheduler.ticks < seen + 2:
                await asyncio.sleep(0.005)


@asynccontextmanager
async def cron_rig(
    store: Store,
    tmp_path: Path,
    clock: FakeClock,
    *,
    llm: ScriptLLM | None = None,
    adapter: RecordingAdapter | None = None,
    config: CronConfig | None = None,
    homes: Sequence[str] = ("test:home",),
    instance: str = "herald-a",
    platforms: Sequence[Adapter] = (),
    tools: Callable[[Channels, Path], Sequence[Tool]] | None = None,
) -> AsyncIterator[CronRig]:
    """A scheduler (and delivery worker) running until the block ends. `platforms`: more
    connected adapters (each its platform's section); `tools(channels, state_dir)`: the
    agent's tools."""
    llm = llm or ScriptLLM()
    adapter = adapter or RecordingAdapter()
    channels = Channels()
    channels.register("test", "acct", adapter.limits, lambda: adapter)
    sections = {("test", "acct"): PlatformSection(account="acct", allowed_users=("*",))}
    for more in platforms:
        channels.register(more.platform, more.account, more.limits, _live(more))
        sections[(more.platform, more.account)] = PlatformSection(
            account=more.account, allowed_users=("*",)
        )
    metrics = Metrics()
    outbox = Outbox(store, listeners=[record_report])
    worker = DeliveryWorker(
        outbox, channels, DeliveryConfig(backoff_initial=0.01, backoff_max=0.05), metrics
    )
    state_dir = tmp_path / "state"
    registry = ToolRegistry(tools(channels, state_dir) if tools else ())
    agent = Agent(llm, store, MemoryFiles(state_dir), registry, AgentSettings(memory_pass=False))
    service = JobService(store, configured=sections, clock=clock)

    async def no_snapshot(*_: object) -> tuple[str, str]:
        return "", ""

    scheduler = CronScheduler(
        store,
        agent,
        config or cron_config(),
        homes=homes,
        sections=sections,
        state_dir=state_dir,
        channels=channels,
        snapshot=no_snapshot,
        clock=clock,
        instance=instance,
        on_outbox=worker.wake,
    )
    service.on_change = scheduler.wake
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(worker.run()), tg.create_task(scheduler.run())]
        try:
            yield CronRig(store, clock, llm, adapter, service, scheduler, outbox, state_dir)
        finally:
            for task in tasks:
                task.cancel()


def _live(adapter: Adapter) -> Callable[[], Adapter]:
    return lambda: adapter
