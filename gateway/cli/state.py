"""`herald state`: what lives where, and moving an older install's state directory into the
database."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from gateway.cli.base import load
from gateway.cli.help import HeraldTyper
from gateway.store import Store

state_app = HeraldTyper(
    help="Move an older install's state directory into the database.", no_args_is_help=True
)

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML config file (default: $HERALD_CONFIG)."),
]


@state_app.command("import")
def state_import(config: ConfigOption = None) -> None:
    """Move the memory files (SOUL.md, USER.md, MEMORY.md) and skills that earlier versions
    kept in state_dir into the database, the files received and sent (and the media-link
    key) into the blob store (files.store), and list what was moved. Safe to run again, and
    to run again after it was stopped halfway: each file is moved once, and deleted (memory
    files, received and sent files) only after it was read back. `herald run` does this at
    start."""
    # Imported here: the files' import reaches the model client (media), which every other
    # command would pay for at start.
    from gateway.blobs import open_blobs  # noqa: PLC0415
    from gateway.files_import import import_files  # noqa: PLC0415
    from gateway.state import import_state  # noqa: PLC0415

    cfg = load(config)
    console = Console(highlight=False)

    async def go() -> None:
        async with (
            Store.open(cfg.effective_database_url, create=True) as store,
            contextlib.AsyncExitStack() as stack,
        ):
            blobs = await open_blobs(cfg, store, stack)
            files = await import_files(cfg.state_dir, store, blobs)
            done = await import_state(cfg.state_dir, store, skills=cfg.skills.enabled)
        done.moved[:0] = files
        for line in done.moved:
            console.print(f"moved {escape(line)}")
        for line in done.kept:
            console.print(f"[yellow]kept[/] {escape(line)}")
        if not done.moved and not done.kept:
            console.print(f"nothing to move in {escape(str(cfg.state_dir))}")

    asyncio.run(go())
