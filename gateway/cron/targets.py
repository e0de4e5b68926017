"""Where reports go: target strings, checked when a job is saved and resolved when it runs.

Targets: `home` (the home channel: the chat that sent `/sethome`, else the first of
`home.targets`), `all` (every home: `/sethome`'s and each of `home.targets`), and explicit
chats `<platform>[:<account>]:<chat>[:<thread>]`. A platform may read its own targets
differently, or answer to further prefixes (its spec's `parse_target` and `aliases`,
`gateway/platforms.py`).

The account is named when it must be: `telegram:family:123` is chat 123 of the account
`family`, `telegram:123` the platform's only account (or its account named `default`). The
part after the platform is an account only when it is a configured account of that platform
(chat ids may hold colons: Matrix rooms, mail addresses).
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
"""The settings key `/sethome` writes: `platform[:account]:chat[:thread]`."""
DEFAULT_ACCOUNT = "default"
"""The account a platform written as one section has unless it names another."""
HOME = "home"
ALL = "all"

_NOT_TARGETS = frozenset(str(origin) for origin in Origin)


class TargetError(ValueError):
    """A target that cannot be used; the message says why."""


@dataclass(frozen=True, slots=True)
class Address:
    """A chat a target names: platform, chat, thread, and the account when it was named."""

    platform: str
    chat: str
    thread: str | None = None
    account: str | None = None
    """None: the platform's only account (or its `default`), found by `account_for`."""

    def __str__(self) -> str:
        parts = [self.platform, *([self.account] if self.account else []), self.chat]
        return ":".join(parts + ([self.thread] if self.thread else []))


def account_for(platform: str, account: str | None, configured: Collection[tuple[str, str]]) -> str:
    """The account a target on `platform` goes through: the one it names, else the
    platform's only account, else its account named `default`. Raises TargetError."""
    names = sorted(a for p, a in configured if p == platform)
    if account is not None:
        if account not in names:
            raise TargetError(
                f"{platform} has no account {account!r} (configured: {', '.join(names) or 'none'})"
            )
        return account
    if len(names) == 1:
        return names[0]
    if DEFAULT_ACCOUNT in names:
        return DEFAULT_ACCOUNT
    if not names:
        raise TargetError(f"platform {platform} is not configured")
    raise TargetError(
        f"{platform} has several accounts ({', '.join(names)}): name one, like "
        f"{platform}:{names[0]}:<chat>"
    )


def parse_target(text: str, accounts: Collection[tuple[str, str]] = ()) -> str | Address:
    """`home`, `all`, or the Address a target names; the part after the platform is its
    account when it is one of `accounts` (platform, account). Raises TargetError."""
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
    account: str | None = None
    head, sep, tail = rest.partition(":")
    if sep and tail and (platform.name, head) in accounts:
        account, rest = head, tail
    if platform.parse_target is not None:
        try:
            address = platform.parse_target(name, rest)
        except ValueError as err:
            raise TargetError(f"{spec!r}: {err}") from err
        return Address(platform.name, address.chat, address.thread, account)
    chat, _, thread = rest.partition(":")
    if not chat:
        raise TargetError(f"{spec!r} has no chat id")
    return Address(platform.name, chat, thread or None, account)


def normalize_targets(
    targets: Sequence[str], configured: Collection[tuple[str, str]]
) -> tuple[str, ...]:
    """Checked and normalized targets (at least one, no duplicates). Raises TargetError.

    `configured` are the (platform, account) pairs set up. An explicit chat on a platform
    not among them is refused, and one without an account on a platform whose account
    cannot be told (several, none named `default`).
    """
    out: list[str] = []
    for raw in targets:
        parsed = parse_target(raw, configured)
        if isinstance(parsed, Address):
            if parsed.platform not in {p for p, _ in configured}:
                names = sorted({p for p, _ in configured})
                raise TargetError(
                    f"{raw!r}: platform {parsed.platform} is not configured "
                    f"(configured: {', '.join(names) or 'none'})"
                )
            try:
                account_for(parsed.platform, parsed.account, configured)
            except TargetError as err:
                raise TargetError(f"{raw!r}: {err}") from err
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
    text = format_target(name, ChatAddress(address.chat, address.thread))
    if address.account is None:
        return text
    prefix, _, rest = text.partition(":")
    return f"{prefix}:{address.account}:{rest}"


def home_address(value: str, accounts: Collection[tuple[str, str]] = ()) -> Address:
    """The Address of a home written `platform[:account]:chat[:thread]` (by `/sethome` or
    config)."""
    parsed = parse_target(value, accounts)
    if isinstance(parsed, str):
        raise TargetError(f"home {value!r} must name a chat")
    return parsed


def home_problems(targets: Sequence[str], configured: Collection[tuple[str, str]]) -> list[str]:
    """What is wrong with `home` targets: each one that names no chat, a platform not among
    `configured` (platform, account) or no account where one must be named (reports to it
    would never arrive). Empty when all are usable."""
    problems: list[str] = []
    names = sorted({p for p, _ in configured})
    for target in targets:
        try:
            address = home_address(target, configured)
        except TargetError as err:
            problems.append(str(err))
            continue
        if address.platform not in names:
            problems.append(
                f"home {target!r}: platform {address.platform} is not configured "
                f"(configured: {', '.join(names) or 'none'}); "
                "set that platform up or choose another home"
            )
            continue
        try:
            account_for(address.platform, address.account, configured)
        except TargetError as err:
            problems.append(f"home {target!r}: {err}")
    return problems


def named_account(
    platform: str, account: str, configured: Collection[tuple[str, str]]
) -> str | None:
    """`account` when a target must name it (it is not the one a target without account
    means among `configured`), else None: old targets keep their old form."""
    try:
        return None if account_for(platform, None, configured) == account else account
    except TargetError:
        return account if configured else None


def chat_target(platform: str, chat: str, thread: str | None, account: str | None = None) -> str:
    """The target string of a chat (what `/sethome` writes and `/cron` looks for), naming
    `account` when given (see `named_account`)."""
    return ":".join(p for p in (platform, account, chat, thread) if p)


def session_chat(key: str, configured: Collection[tuple[str, str]] = ()) -> str | None:
    """The target of the chat a session key names, or None (API, CLI, cron sessions); its
    account is named when `configured` has others on the platform that a target without
    account would mean instead.

    Keys are `platform:account:chat[:thread][:u=<sender>]` with `%`, `:` and `=` escaped.
    """
    parts = key.split(":")
    if len(parts) < 3 or parts[0] in {str(p) for p in _NOT_TARGETS}:
        return None
    rest = [_unescape(p) for p in parts[2:] if not p.startswith("u=")]
    chat = rest[0]
    thread = rest[1] if len(rest) > 1 else None
    account = named_account(parts[0], _unescape(parts[1]), configured)
    return chat_target(parts[0], chat, thread, account)


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
    sections: Mapping[tuple[str, str], PlatformSection],
) -> Resolved:
    """The chats a job's targets name right now, through the accounts of `sections`
    (by platform and account)."""
    addresses: list[tuple[str, Address]] = []
    problems: list[str] = []
    home_list = ([sethome] if sethome else []) + [h for h in homes if h != sethome]
    for text in targets:
        try:
            parsed = parse_target(text, sections)
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
                addresses.append((home, home_address(home, sections)))
            except TargetError as err:
                problems.append(str(err))
    out: list[Target] = []
    for text, address in addresses:
        try:
            account = account_for(address.platform, address.account, sections)
        except TargetError as err:
            problems.append(f"{text}: {err}")
            continue
        target = Target(
            address.platform,
            AccountId(account),
            ChatId(address.chat),
            None if address.thread is None else ThreadId(address.thread),
        )
        if target not in out:
            out.append(target)
    return Resolved(tuple(out), tuple(problems))
