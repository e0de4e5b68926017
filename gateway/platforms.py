"""The platform registry: the one place in `gateway/` that names platforms.

Each adapter package exports a `PlatformSpec` as `SPEC`; the built-in ones are listed here, in
the order their sections are checked and started. A platform shipped as a separate package
registers its spec under the `herald.platforms` entry-point group:

    [project.entry-points."herald.platforms"]
    myplatform = "herald_myplatform:SPEC"

Config sections, the supervisor's adapters, target addresses and `herald doctor` all read
the specs from here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from importlib.metadata import EntryPoint, entry_points

import adapters.discord
import adapters.email
import adapters.loopback
import adapters.matrix
import adapters.mattermost
import adapters.signal
import adapters.slack
import adapters.telegram
import adapters.twilio
from gateway.contracts.platform import AnySpec, PlatformSpec

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "herald.platforms"

BUILT_IN: tuple[AnySpec, ...] = (
    adapters.loopback.SPEC,
    adapters.telegram.SPEC,
    adapters.slack.SPEC,
    adapters.twilio.SPEC,
    adapters.discord.SPEC,
    adapters.email.SPEC,
    adapters.matrix.SPEC,
    adapters.mattermost.SPEC,
    adapters.signal.SPEC,
)
"""The platforms that ship with Herald."""


def load(found: Iterable[EntryPoint] | None = None) -> tuple[AnySpec, ...]:
    """The built-in specs, then those of the `herald.platforms` entry points (`found`, or
    the installed ones). An entry point that fails to load or reuses a name is logged and
    left out."""
    specs = list(BUILT_IN)
    taken = {name for spec in specs for name in (spec.name, *spec.aliases)}
    for point in entry_points(group=ENTRY_POINT_GROUP) if found is None else found:
        try:
            spec = point.load()
        except Exception as err:
            logger.warning("platform entry point %s is left out: %s", point.value, err)
            continue
        if not isinstance(spec, PlatformSpec):
            logger.warning("platform entry point %s is not a PlatformSpec; left out", point.value)
            continue
        names = (spec.name, *spec.aliases)
        if taken.intersection(names):
            logger.warning("platform %s (%s) is already registered; left out", spec.name, point)
            continue
        taken.update(names)
        specs.append(spec)
    return tuple(specs)


SPECS = load()
"""Every platform Herald knows, built-in first."""


def names() -> tuple[str, ...]:
    """The names of every platform, in registry order."""
    return tuple(spec.name for spec in SPECS)


def spec(name: str) -> AnySpec:
    """The spec of platform `name`. Raises LookupError when no platform has that name."""
    for candidate in SPECS:
        if candidate.name == name:
            return candidate
    raise LookupError(f"no platform is named {name!r} (known: {', '.join(names())})")


def by_target_prefix(prefix: str) -> AnySpec | None:
    """The platform a target prefix (its name or one of its aliases) means, or None."""
    for candidate in SPECS:
        if prefix == candidate.name or prefix in candidate.aliases:
            return candidate
    return None


def target_prefixes() -> tuple[str, ...]:
    """What may come before the colon of a target: the platform names (sorted), then every
    alias."""
    return (*sorted(names()), *(alias for spec in SPECS for alias in spec.aliases))


def example_target() -> str:
    """A target to show in messages (the first platform not for tests only)."""
    return next(spec.example for spec in SPECS if not spec.internal)
