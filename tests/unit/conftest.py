"""Fixtures of the CLI tests (request them; none is automatic)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.unit.cli_harness import Herald


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No `HERALD_*` variable of the machine running the tests; a private home directory."""
    for name in list(os.environ):
        if name.upper().startswith("HERALD_"):
            monkeypatch.delenv(name)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))


@pytest.fixture
def herald(tmp_path: Path) -> Herald:
    """A minimal valid config with its state directory under tmp_path."""
    return Herald(tmp_path / "herald.yaml", tmp_path / "state").configure()
