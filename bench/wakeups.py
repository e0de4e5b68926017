"""Counting the loop's wake-ups: tasks created, timers armed and thread hand-offs.

`with Wakeups.on(asyncio.get_running_loop()) as counts:` wraps the running loop's
`create_task`, `call_at` (which `call_later`, `asyncio.sleep` and `asyncio.timeout` arm
through), `run_in_executor` (`asyncio.to_thread` and SQLite's connection threads go
through it) and `call_soon_threadsafe` on that loop object only, and restores them on exit.
Counts only; never a time. Works on the stdlib's loops (uvloop's methods are not Python's).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

WRAPPED = ("create_task", "call_at", "run_in_executor", "call_soon_threadsafe")
"""The loop methods counted, each under its own name."""


@dataclass
class Wakeups:
    """What the loop was asked for while counting, by method and by creator."""

    counts: Counter[str] = field(default_factory=Counter)
    tasks: Counter[str] = field(default_factory=Counter)
    """Tasks created, by the coroutine's qualified name."""
    by_caller: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(method, the calling task's coroutine's qualified name, or `-` outside a task)."""

    @property
    def created(self) -> int:
        return self.counts["create_task"]

    @property
    def timers(self) -> int:
        return self.counts["call_at"]

    @property
    def handoffs(self) -> int:
        return self.counts["run_in_executor"] + self.counts["call_soon_threadsafe"]

    @classmethod
    @contextmanager
    def on(cls, loop: asyncio.AbstractEventLoop) -> Iterator[Wakeups]:
        """Count on `loop` until the block ends."""
        found = cls()
        for name in WRAPPED:
            original = getattr(loop, name)
            setattr(loop, name, found._counting(name, original))
        try:
            yield found
        finally:
            for name in WRAPPED:
                delattr(loop, name)

    def _counting(self, name: str, original: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.counts[name] += 1
            if name != "call_soon_threadsafe":  # the others are called on the loop's thread
                self.by_caller[name, _name(asyncio.current_task())] += 1
            if name == "create_task" and args:
                self.tasks[_coro_name(args[0])] += 1
            return original(*args, **kwargs)

        return counted


def _coro_name(coro: object) -> str:
    code = getattr(coro, "cr_code", None)
    return str(getattr(code, "co_qualname", type(coro).__name__))


def _name(task: asyncio.Task[Any] | None) -> str:
    return "-" if task is None else _coro_name(task.get_coro())
