"""Running `herald doctor` as a real subprocess against a config under tmp_path."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.daemon import HERALD

RUN_TIMEOUT = 60.0
VERDICT = re.compile(r"^(OK|WARN|FAIL)\s+([\w.]+): (.*)$")


@dataclass(frozen=True, slots=True)
class Doctor:
    """What one `herald doctor` run printed and returned."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def verdicts(self) -> dict[str, tuple[str, str]]:
        """Check name → (verdict, detail)."""
        found: dict[str, tuple[str, str]] = {}
        for line in self.stdout.splitlines():
            match = VERDICT.match(line)
            if match:
                found[match[2]] = (match[1], match[3])
        return found


async def run_doctor(
    tmp_path: Path, platforms: dict[str, Any], extra: dict[str, Any] | None = None
) -> Doctor:
    """Run `herald doctor` with these platform sections (and `extra` top-level sections),
    the state under tmp_path and the default (echo) LLM."""
    config = tmp_path / "herald.yaml"
    settings = {"state_dir": str(tmp_path / "state"), "platforms": platforms, **(extra or {})}
    config.write_text(yaml.safe_dump(settings), encoding="utf-8")
    process = await asyncio.create_subprocess_exec(
        str(HERALD),
        "doctor",
        "--config",
        str(config),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    try:
        async with asyncio.timeout(RUN_TIMEOUT):
            stdout, stderr = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return Doctor(process.returncode, stdout.decode(), stderr.decode())
