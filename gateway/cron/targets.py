"""Where reports go: target strings, checked when a job is saved and resolved when it runs.

Targets: `home` (the home channel: the chat that sent `/sethome`, else the first of
`home.targets`), `all` (every home: `/sethome`'s and each of `home.targets`), and explicit
chats `<platform>:<chat>[:<thread>]`. A platform may read its own targets differently, or
answer to further prefixes (its spec's `parse_target` and `aliases`, `gateway/platforms.py`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from gateway import platforms
from gateway.contracts.config import PlatformSection
from gateway.contracts.ids import AccountId, ChatId, Origin, ThreadId
from gateway.contracts.platform import ChatAddress
from gateway.store.outbox import Target

HOME_SETTING = "home.target"
"""The settings key `/sethome` writes: `platform:chat[:thread]`."""
HOME = "home"
ALL = "all"

_NOT_TARGETS = frozenset(str(origin) for origin in Origin)


class TargetError(ValueError):
    """A target that cannot be used; the message says why."""


@dataclass(frozen=True, slots=True)
class Address:
    """A resolved chat, before the account is known: platform, chat, thread."""

    platform: str
    chat: str
    thread: str | None = None

    def __str__(self) -> str:
        parts = [self.platform, self.chat] + ([self.thread] if self.thread else [])
        return ":".join(parts)


def parse_target(text: str) -> str | Address:
    """`home`, `all`, or the Address a target names. Raises TargetError."""
    spec = text.strip()
    if spec.lower() in (HOME, ALL):
        return spec.lower()
    name, sep, rest = spec.partition(":")
    name = name.lower()
    if not sep or not rest:
        raise TargetError(
            f"{spec!r} is not a target: use home, all, or platform:chat "
            f"(like {platforms.example_target()})"
        )
    platform = platforms.by_target_prefix(name)
    if platform is None:
        known = ", ".join(platforms.target_prefixes())
        raise TargetError(f"{spec!r}: unknown platform {name!r} (known: {known})")
    if platform.parse_target is not None:
        try:
            address = platform.parse_target(name, rest)
        except ValueError as err:
            raise TargetError(f"{spec!r}: {err}") from err
        return Address(platform.name, address.chat, address.thread)
    chat, _, thread = rest.partition(":")
    if not chat:
        raise TargetError(f"{spec!r} has no chat id")
    return Address(platform.name, chat, thread or None)


def normalize_targets(targets: Sequence[str], configured: Collection[str]) -> tuple[str, ...]:
    """Checked and normalized targets (at least one, no duplicates). Raises TargetError.

    An explicit chat on a platform that is not among `configured` is refused.
    """
    out: list[str] = []
    for raw in targets:
        parsed = parse_target(raw)
        if isinstance(parsed, Address) and parsed.platform not in configured:
            raise TargetError(
                f"{raw!r}: platform {parsed.platform} is not configured "
                f"(configured: {', '.join(sorted(configured)) or 'none'})"
            )
        text = parsed if isinstance(parsed, str) else _stored(raw, parsed)
        if text not in out:
            out.append(text)
    if not out:
        raise TargetError("at least one target is needed (home, all, or platform:chat)")
    return tuple(out)


def _stored(raw: str, address: Address) -> str:
    name = raw.strip().partition(":")[0].lower()
    format_target = platforms.spec(address.platform).format_target
    if format_target is None:
        return str(address)
    return format_target(name, ChatAddress(address.chat, address.thread))


def home_address(value: str) -> Address:
    """The Address of a home written `platform:chat[:thread]` (by `/sethome` or config)."""
    parsed = parse_target(value)
    if isinstance(parsed, str):
        raise TargetError(f"home {value!r} must name a chat")
    return parsed


def home_problems(targets: Sequence[str], configured: Collection[str]) -> list[str]:
    """What is wrong with `home` targets: each one that names no chat or a platform not
    among `configured` (reports to it would never arrive). Empty when all are usable."""
    problems: list[str] = []
    for target in targets:
        try:
            address = home_address(target)
        except TargetError as err:
            problems.append(str(err))
            continue
        if address.platform not in configured:
            problems.append(
                f"home {target!r}: platform {address.platform} is not configured "
                f"(configured: {', '.join(sorted(configured)) or 'none'}); "
                "set that platform up or choose another home"
            )
    return problems


def chat_target(platform: str, chat: str, thread: str | None) -> str:
    """The target string of a chat (what `/sethome` writes and `/cron` looks for)."""
    return ":".join(p for p in (platform, chat, thread) if p)


def session_chat(key: str) -> str | None:
    """The target of the chat a session key names, or None (API, CLI, cron sessions).

    Keys are `platform:account:chat[:thread][:u=<sender>]` with `%`, `:` and `=` escaped.
    """
    parts = key.split(":")
    if len(parts) < 3 or parts[0] in {str(p) for p in _NOT_TARGETS}:
        return None
    rest = [_unescape(p) for p in parts[2:] if not p.startswith("u=")]
    chat = rest[0]
    thread = rest[1] if len(rest) > 1 else None
    return chat_target(parts[0], chat, thread)


def _unescape(part: str) -> str:
    return part.replace("%3D", "=").replace("%3A", ":").replace("%25", "%")


@dataclass(frozen=True, slots=True)
class Resolved:
    """Where one target of a job goes now: chats, and what could not be resolved."""

    targets: tuple[Target, ...]
    problems: tuple[str, ...]


def resolve(
    targets: Sequence[str],
    *,
    homes: Sequence[str],
    sethome: str | None,
    sections: Mapping[str, PlatformSection],
) -> Resolved:
    """The chats a job's targets name right now (accounts from the platform sections)."""
    addresses: list[tuple[str, Address]] = []
    problems: list[str] = []
    home_list = ([sethome] if sethome else []) + [h for h in homes if h != sethome]
    for text in targets:
        try:
            parsed = parse_target(text)
        except TargetError as err:
            problems.append(str(err))
            continue
        if parsed == HOME:
            if not home_list:
                problems.append("no home channel: send /sethome in a chat or set home.targets")
                continue
            chosen = home_list[:1]
        elif parsed == ALL:
            if not home_list:
                problems.append("no home channel: send /sethome in a chat or set home.targets")
                continue
            chosen = home_list
        else:
            assert isinstance(parsed, Address)
            addresses.append((text, parsed))
            continue
        for home in chosen:
            try:
                addresses.append((home, home_address(home)))
            except TargetError as err:
                problems.append(str(err))
    out: list[Target] = []
    for text, address in addresses:
        section = sections.get(address.platform)
        if section is None:
            problems.append(f"{text}: platform {address.platform} is not configured")
            continue
        target = Target(
            address.platform,
            AccountId(section.account),
            ChatId(address.chat),
            None if address.thread is None else ThreadId(address.thread),
        )
        if target not in out:
            out.append(target)
    return Resolved(tuple(out), tuple(problems))
