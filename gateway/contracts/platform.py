"""What a platform package tells Herald about itself: one `PlatformSpec` per adapter package.

Each `adapters/<platform>/__init__.py` exports `SPEC`; `gateway/platforms.py` lists them (and
loads third-party ones from the `herald.platforms` entry-point group). The config sections,
the supervisor's adapters, target addresses and `herald doctor` all come from the specs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from gateway.contracts.adapter import Adapter, AdapterContext
from gateway.contracts.config import PlatformSection

S = TypeVar("S", bound=PlatformSection)


@dataclass(frozen=True, slots=True)
class ChatAddress:
    """The chat (and thread) a target names on one platform, before the account is known."""

    chat: str
    thread: str | None = None


@dataclass(frozen=True, slots=True)
class Host:
    """What a platform's extra validation may know about the rest of the configuration."""

    http_enabled: bool
    """Whether Herald's HTTP server runs (webhook receivers need it)."""


@dataclass(frozen=True, slots=True)
class SetupQuestion:
    """One answer `herald setup` asks for when it sets a platform up: the config key it
    fills, how it is asked, and whether it is a secret (kept in a file of its own)."""

    key: str
    prompt: str
    secret: bool = False
    default: str | None = None


AdapterFactory = Callable[[], Adapter]
"""Builds a fresh adapter; called once per (re)connection."""


@dataclass(frozen=True, slots=True)
class PlatformSpec(Generic[S]):
    """One platform: its name, config section, adapter factory and target addresses."""

    name: str
    """The key under `platforms:` and the first part of its session keys and targets."""
    config: type[S]
    """Its config section (`platforms.<name>`)."""
    factory: Callable[[S, AdapterContext], AdapterFactory]
    """Builds the adapter factory of a section; imports the platform's SDK only when called."""
    example: str
    """A target on this platform, shown in messages (`<name>:123`)."""
    aliases: tuple[str, ...] = ()
    """Further target prefixes that mean this platform (one per kind of its chats)."""
    parse_target: Callable[[str, str], ChatAddress] | None = None
    """`(prefix, rest)` of a target to its chat; raises ValueError saying what is expected.
    None: `rest` is `chat[:thread]`."""
    format_target: Callable[[str, ChatAddress], str] | None = None
    """How a target written with `prefix` is stored. None: `<name>:chat[:thread]`."""
    validate: Callable[[S, Host], None] | None = None
    """Checks that need the rest of the configuration; raises ValueError naming the key."""
    secret_patterns: tuple[re.Pattern[str], ...] = ()
    """Credentials of this platform as they show up in logs: group 1 is kept, the rest of
    the match is masked."""
    url_loggers: tuple[str, ...] = ()
    """SDK loggers that log request URLs or headers (secrets) below WARNING."""
    internal: bool = False
    """A platform for tests only: left out of suggestions for mistyped keys."""
    setup: tuple[SetupQuestion, ...] = ()
    """What `herald setup` asks, in order (credentials first). Empty: the config's required
    fields."""
    base_url_key: str | None = None
    """The config key of the platform's API base URL (`herald setup --base-url`)."""

    def build(self, section: PlatformSection, context: AdapterContext) -> AdapterFactory:
        """The adapter factory of `section`, which must be of this platform's config type."""
        if not isinstance(section, self.config):
            raise TypeError(f"platforms.{self.name} needs a {self.config.__name__} section")
        return self.factory(section, context)


AnySpec = PlatformSpec[Any]
"""A spec of some platform, as the registry holds them."""
