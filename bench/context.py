"""What every scenario gets: where to work, how thorough to be, which stores to run on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Context:
    """One `make bench` run's settings."""

    workdir: Path
    backends: tuple[str, ...]
    quick: bool
    """Small sizes and short runs: checks the harness, measures nothing worth quoting."""
    runs: int
    """Repetitions of each measurement; results are medians with their spread."""

    def scaled(self, full: int, quick: int) -> int:
        """`full`, or `quick` in quick mode."""
        return quick if self.quick else full

    def dir(self, *parts: str) -> Path:
        """A fresh folder under the work directory."""
        path = self.workdir.joinpath(*parts)
        path.mkdir(parents=True, exist_ok=True)
        return path
