"""What a test does when a service it needs (PostgreSQL, Dovecot, …) is not there."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

REQUIRE_SERVICES_ENV = "HERALD_REQUIRE_SERVICES"


def require_service(name: str, reason: str) -> NoReturn:
    """Skip the test because `name` is unavailable, or fail it when HERALD_REQUIRE_SERVICES=1.

    `name` says what and where (e.g. "PostgreSQL on 127.0.0.1:5432"); `reason` says what went
    wrong when we tried to reach it.
    """
    if os.environ.get(REQUIRE_SERVICES_ENV) == "1":
        pytest.fail(
            f"{name} is required ({REQUIRE_SERVICES_ENV}=1) but unavailable: {reason}",
            pytrace=False,
        )
    pytest.skip(f"{name} unavailable: {reason}")
