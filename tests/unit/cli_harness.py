"""Running the `herald` CLI in tests: a config under tmp_path and Typer's test runner.

The fixtures `herald` and `clean_environment` live in `tests/unit/conftest.py`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner, Result

from gateway.cli.main import app
from gateway.store import Store

INVOKE_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class Herald:
    """A config file whose state directory (and SQLite database) lives under tmp_path."""

    path: Path
    state_dir: Path

    @property
    def database_url(self) -> str:
        """The SQLite database the CLI opens with this config."""
        return f"sqlite+aiosqlite:///{self.state_dir / 'herald.db'}"

    def configure(self, **sections: Any) -> Herald:
        """Rewrite the config file: the state directory plus `sections`."""
        data = {"state_dir": str(self.state_dir), **sections}
        self.path.write_text(yaml.safe_dump(data), encoding="utf-8")
        return self

    async def create_database(self) -> None:
        """Create the (empty, migrated) database, as the daemon's first start does: read-only
        commands refuse to create one."""
        async with Store.open(self.database_url):
            pass

    async def invoke(self, *args: str) -> Result:
        """Run `herald <args> --config <file>` in a worker thread."""
        runner = CliRunner()
        async with asyncio.timeout(INVOKE_TIMEOUT):
            return await asyncio.to_thread(
                runner.invoke,
                app,
                [*args, "--config", str(self.path)],
                env={"COLUMNS": "250", "NO_COLOR": "1"},
            )
