"""Running a fake as its own process: serve until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Coroutine
from typing import Any


async def until_signalled() -> None:
    """Return once the process gets SIGINT or SIGTERM."""
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, done.set)
    await done.wait()


def parser(module: str, description: str | None, **options: Any) -> argparse.ArgumentParser:
    """The command line of `python -m <module>`."""
    return argparse.ArgumentParser(prog=f"python -m {module}", description=description, **options)


def run(serve: Coroutine[Any, Any, None], level: int = logging.WARNING) -> None:
    """Log at `level` to stderr and run `serve` in a fresh event loop."""
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(serve)
