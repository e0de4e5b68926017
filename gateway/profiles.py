"""Profiles and bindings: which agent answers where.

A profile is a persona (SOUL), a memory namespace, a model (`llm` keys over the top-level
`llm`), the tools and MCP servers it may offer, its own skills folders and its home. The
profile `default` is the top-level config itself: a config without `profiles` means what it
always meant. Bindings choose the profile of a chat by platform, account, chat and thread;
the most specific binding that matches wins (thread > chat > account > platform; among equals
a binding stored by `herald profiles bind` beats a config one, then the first written).
Bindings and profiles never grant rights: a profile's tool list only narrows what a turn may
use.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from gateway.contracts.config import Section, read_secret_files

DEFAULT = "default"
"""The profile of the top-level config; it always exists."""
MODEL_PREFIX = "herald:"
"""`model: "herald:<profile>"` in an API request picks the profile."""
PROFILE_HEADER = "X-Herald-Profile"
"""The HTTP header that picks an API request's profile."""
NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
"""A profile's name: lower-case letters, digits, '-' and '_' (at most 32)."""


def check_profile_name(value: str, what: str = "profile") -> str:
    """`value` when it can name a profile; ValueError saying what a name looks like."""
    if not NAME.fullmatch(value):
        raise ValueError(
            f"{what} {value!r}: use lower-case letters, digits, '-' and '_' "
            "(at most 32, starting with a letter or digit)"
        )
    return value


class ProfileMemory(Section):
    """Where a profile's memory files live."""

    namespace: str | None = None
    """Default: the profile's own name. `default` shares the default profile's memory (the
    operator links the two); any other name may be shared by several profiles."""

    _namespace = field_validator("namespace")(
        lambda v: v if v is None else check_profile_name(v, "memory namespace")
    )


class ProfileSkills(Section):
    """A profile's skills: the shared ones (bundled, installed, `skills.dirs`) and its own."""

    dirs: tuple[Path, ...] = ()
    """Folders of skills only this profile sees."""
    shared: bool = True
    """Whether the folders of `skills.dirs` are offered too (the bundled and installed
    skills always are)."""


class ProfileConfig(Section):
    """One profile (`profiles.<name>`)."""

    soul: str | None = None
    """The persona (SOUL.md) as text; `soul_file: <path>` reads it from a file. Unset: the
    SOUL.md of the profile's memory namespace (edited by `herald memory`), else the built-in
    persona."""
    llm: Mapping[str, Any] = {}
    """Any `llm` keys, merged over the top-level `llm` (`model`, `base_url`, `api_key`, …)."""
    memory: ProfileMemory = ProfileMemory()
    skills: ProfileSkills = ProfileSkills()
    tools: tuple[str, ...] | Literal["all"] = "all"
    """The tools this profile may offer (built-in names and MCP tools `<prefix>__<tool>`, of
    a configured server: checked at start); `all`: every tool the person may use. Never
    more than the person may use."""
    mcp: tuple[str, ...] | Literal["all"] = "all"
    """The MCP servers (`mcp.servers` names) whose tools this profile offers."""
    home: tuple[str, ...] = ()
    """Where this profile's scheduled reports go (`home` jobs): `<platform>:<chat>[:<thread>]`."""

    @field_validator("llm", mode="before")
    @classmethod
    def _llm_secrets(cls, value: Any) -> Any:
        """`<key>_file` read as in any section; `api_key`s kept as secrets (masked in
        `herald config`, redacted everywhere)."""
        return _secrets(value)

    @field_validator("home", mode="before")
    @classmethod
    def _home(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(t.strip() for t in value.split(",") if t.strip())
        if isinstance(value, Mapping):  # `home: {targets: [...]}` as the top-level `home`
            return _home_targets(value)
        return value

    @field_validator("home")
    @classmethod
    def _targets(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for target in value:
            platform, sep, rest = target.partition(":")
            if not sep or not platform or not rest:
                raise ValueError(f"{target!r} is not of the form platform:chat[:thread]")
        return value

    @property
    def namespace(self) -> str | None:
        """The memory namespace set in config (None: the profile's name)."""
        return self.memory.namespace


def _secrets(value: Any) -> Any:
    if not isinstance(value, Mapping):
        return value
    out = dict(read_secret_files(value))
    for key, item in out.items():
        if key == "api_key" and isinstance(item, str):
            out[key] = SecretStr(item)
        elif isinstance(item, Mapping):
            out[key] = _secrets(item)
    return out


def _home_targets(value: Mapping[str, Any]) -> Any:
    targets = value.get("targets", ())
    return tuple(t.strip() for t in targets.split(",")) if isinstance(targets, str) else targets


class BindingConfig(Section):
    """One binding: the chats of `profile`. Each key left out matches anything."""

    profile: str = Field(min_length=1)
    platform: str | None = None
    account: str | None = None
    chat: str | None = None
    thread: str | None = None

    @field_validator("platform", "account", "chat", "thread", mode="before")
    @classmethod
    def _text(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)  # chat ids written as YAML numbers
        if isinstance(value, str) and not value.strip():
            raise ValueError("leave the key out to match anything (an empty value matches nothing)")
        return value

    @model_validator(mode="after")
    def _narrowing(self) -> BindingConfig:
        if self.thread is not None and self.chat is None:
            raise ValueError("a binding with a thread names its chat too")
        if self.chat is not None and self.platform is None:
            raise ValueError("a binding with a chat names its platform too")
        if self.account is not None and self.platform is None:
            raise ValueError("a binding with an account names its platform too")
        return self

    def rule(self, source: str = "config") -> Binding:
        """This binding as a rule to match (`source`: `config` or `cli`)."""
        return Binding(
            self.profile, self.platform, self.account, self.chat, self.thread, source=source
        )


@dataclass(frozen=True, slots=True)
class Binding:
    """A binding rule: `None` matches any value. `source`: `config` or `cli` (stored)."""

    profile: str
    platform: str | None = None
    account: str | None = None
    chat: str | None = None
    thread: str | None = None
    source: str = "config"

    @property
    def where(self) -> tuple[str | None, str | None, str | None, str | None]:
        """What it matches: (platform, account, chat, thread)."""
        return self.platform, self.account, self.chat, self.thread

    def matches(self, platform: str, account: str, chat: str, thread: str | None) -> bool:
        """Whether a chat of (platform, account, chat, thread) is bound by this rule."""
        return all(
            want is None or want == have
            for want, have in zip(self.where, (platform, account, chat, thread), strict=True)
        )

    @property
    def specificity(self) -> tuple[bool, bool, bool, bool]:
        """Greater is more specific: thread, then chat, then account, then platform."""
        return (
            self.thread is not None,
            self.chat is not None,
            self.account is not None,
            self.platform is not None,
        )

    def describe(self) -> str:
        """`platform=telegram account=work` (or `everywhere`)."""
        keys = ("platform", "account", "chat", "thread")
        parts = [f"{k}={v}" for k, v in zip(keys, self.where, strict=True) if v is not None]
        return " ".join(parts) or "everywhere"


def choose(
    rules: Sequence[Binding], platform: str, account: str, chat: str, thread: str | None
) -> str:
    """The profile that answers in this chat: the most specific matching rule's; among
    equally specific ones a CLI rule before a config one, then the first; `default` when none
    matches."""
    best: tuple[tuple[bool, ...], bool, int] | None = None
    chosen = DEFAULT
    for index, rule in enumerate(rules):
        if not rule.matches(platform, account, chat, thread):
            continue
        rank = (rule.specificity, rule.source == "cli", -index)
        if best is None or rank > best:
            best, chosen = rank, rule.profile
    return chosen


def check_bindings(rules: Iterable[Binding], profiles: Iterable[str], what: str) -> None:
    """ValueError naming the binding when it names no profile or repeats another."""
    known = {DEFAULT, *profiles}
    seen: set[tuple[str | None, ...]] = set()
    for index, rule in enumerate(rules):
        if rule.profile not in known:
            raise ValueError(
                f"{what}[{index}].profile: no profile {rule.profile!r} "
                f"(known: {', '.join(sorted(known))})"
            )
        if rule.where in seen:
            raise ValueError(
                f"{what}[{index}]: binds {rule.describe()} again; "
                "remove one (the most specific binding wins, two equal ones are ambiguous)"
            )
        seen.add(rule.where)


def parse_model(model: str | None) -> str | None:
    """The profile named by an API request's `model` (`herald:<profile>`), or None."""
    if model is None or not model.startswith(MODEL_PREFIX):
        return None
    return model.removeprefix(MODEL_PREFIX)


OPENAI_BASE_URL = "https://api.openai.com/v1"
"""Where the `openai` SDK goes without a `base_url`."""


def url_origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of `url`: two URLs of one origin are one server."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port or {"http": 80, "https": 443}.get(scheme)
    except ValueError:  # a port that is no number: no server's origin
        port = -1
    return scheme, (parts.hostname or "").lower(), port
