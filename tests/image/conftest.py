"""`make image-test`: the container image built from the Containerfile and run with podman.

Left out of `make test` (collected only with HERALD_IMAGE_TEST=1): building takes minutes
from cold. Every container, volume and secret is removed at the end, even after a failure;
the local base image, the first stage and the built image stay as the next run's cache.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from tests.image import engine

if not os.environ.get("HERALD_IMAGE_TEST"):
    collect_ignore_glob = ["test_*.py"]

FIGURES: dict[str, str] = {}
"""Measurements printed at the end of the run."""


@pytest.fixture(scope="session")
def image() -> Iterator[str]:
    """The image, built (from the local Debian base) once per run; yields its tag."""
    missing = engine.available()
    if missing is not None:
        pytest.fail(missing)
    engine.clean_up()  # what an interrupted earlier run left
    began = time.monotonic()
    base = engine.base_image()
    FIGURES["base image"] = f"{time.monotonic() - began:.0f} s (0 when cached)"
    FIGURES["build"] = f"{engine.build_image(base):.0f} s"
    size = engine.image_size()
    FIGURES["image size"] = f"{size / 1e6:.0f} MB unpacked"
    try:
        yield engine.IMAGE
    finally:
        engine.clean_up()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the figures (build time, image size, stop time) measured by the run."""
    if FIGURES:
        terminalreporter.section("container image figures")
        for name, value in FIGURES.items():
            terminalreporter.write_line(f"{name}: {value}")
