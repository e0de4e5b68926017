"""`herald profiles …`: the profiles of the config and the bindings that choose them.

Profiles live in the config file (`profiles.<name>`); `bind` and `unbind` store bindings in
the database (`profile_bindings`), which every instance reads at each message: a binding
made here applies from the next message, no restart. Bindings of the config file are
changed there.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from gateway.cli.base import load
from gateway.cli.help import HeraldTyper
from gateway.cli.output import Column, JsonOption, Kind, print_json, print_rows
from gateway.config import HeraldConfig
from gateway.contracts.errors import ConfigError
from gateway.profiles import DEFAULT, MODEL_PREFIX, Binding, BindingConfig
from gateway.store import Store
from gateway.store.profiles import StoredBindings

profiles_app = HeraldTyper(help="Show the profiles and bind chats to them.", no_args_is_help=True)

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML config file (default: $HERALD_CONFIG)."),
]
PlatformOption = Annotated[str | None, typer.Option(help="The platform (any when left out).")]
AccountOption = Annotated[str | None, typer.Option(help="The platform account (any).")]
ChatOption = Annotated[str | None, typer.Option(help="The chat id (any).")]
ThreadOption = Annotated[str | None, typer.Option(help="The thread id (any).")]


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _fail(message: str, code: int = 1) -> typer.Exit:
    Console(stderr=True, highlight=False).print(f"[red]error:[/] {escape(message)}")
    return typer.Exit(code)


async def _stored(cfg: HeraldConfig) -> list[Binding]:
    """The stored bindings; none when the database does not exist yet."""
    try:
        async with Store.open(cfg.effective_database_url, create=False) as store:
            return await StoredBindings(store).list()
    except ConfigError:
        return []


def _describe(cfg: HeraldConfig, name: str, rules: list[Binding]) -> dict[str, Any]:
    profile = None if name == DEFAULT else cfg.profiles[name]
    namespace = DEFAULT if profile is None else profile.namespace or name
    return {
        "name": name,
        "model": cfg.profile_llm(name).model,
        "api_model": f"{MODEL_PREFIX}{name}",
        "soul": "config" if profile is not None and profile.soul is not None else "SOUL.md",
        "memory": namespace,
        "tools": "all" if profile is None or profile.tools == "all" else list(profile.tools),
        "mcp": "all" if profile is None or profile.mcp == "all" else list(profile.mcp),
        "home": list(cfg.profile_home(name)),
        "bindings": [_binding(r) for r in rules if r.profile == name],
    }


def _binding(rule: Binding) -> dict[str, Any]:
    return {
        "profile": rule.profile,
        "platform": rule.platform,
        "account": rule.account,
        "chat": rule.chat,
        "thread": rule.thread,
        "source": rule.source,
    }


@profiles_app.command("list")
def profiles_list(config: ConfigOption = None, json_: JsonOption = False) -> None:
    """Every profile (model, memory, home) and every binding, the config's and the stored."""
    cfg = load(config)
    rules = [*cfg.binding_rules(), *asyncio.run(_stored(cfg))]
    found = [_describe(cfg, n, rules) for n in cfg.profile_names()]
    if json_:
        print_json(found)
        return
    console = _console()
    print_rows(
        console,
        [Column("profile", Kind.ID), Column("model"), Column("memory"), Column("home")],
        [[p["name"], p["model"], p["memory"], ", ".join(p["home"]) or "-"] for p in found],
    )
    console.print()
    if not rules:
        console.print("no bindings: the default profile answers everywhere")
        return
    print_rows(
        console,
        [Column("binding"), Column("profile", Kind.ID), Column("from")],
        [[r.describe(), r.profile, r.source] for r in rules],
        title="bindings (the most specific one that matches wins)",
    )


@profiles_app.command("show")
def profiles_show(name: str, config: ConfigOption = None, json_: JsonOption = False) -> None:
    """One profile in full and the bindings that choose it."""
    cfg = load(config)
    if name not in cfg.profile_names():
        raise _fail(f"no profile {name!r} (profiles: {', '.join(cfg.profile_names())})")
    data = _describe(cfg, name, [*cfg.binding_rules(), *asyncio.run(_stored(cfg))])
    if json_:
        print_json([data])
        return
    console = _console()
    console.print(f"[bold]{escape(name)}[/] (API model {escape(data['api_model'])})")
    for key in ("model", "soul", "memory", "tools", "mcp", "home"):
        value = data[key]
        shown = ", ".join(value) if isinstance(value, list) else str(value)
        console.print(f"  {key}: {escape(shown or '-')}")
    bound = [f"{b['source']}: {Binding(**b).describe()}" for b in data["bindings"]]
    console.print(f"  bindings: {escape('; '.join(bound) or 'none')}")


def _rule(
    profile: str,
    platform: str | None,
    account: str | None,
    chat: str | None,
    thread: str | None,
) -> Binding:
    """The binding the options describe; typer.Exit saying what is wrong with it."""
    try:
        checked = BindingConfig(
            profile=profile, platform=platform, account=account, chat=chat, thread=thread
        )
    except ValidationError as err:
        reason = err.errors()[0]["msg"].removeprefix("Value error, ")
        raise _fail(reason) from None
    return checked.rule("cli")


@profiles_app.command("bind")
def profiles_bind(
    profile: str,
    *,
    platform: PlatformOption = None,
    account: AccountOption = None,
    chat: ChatOption = None,
    thread: ThreadOption = None,
    config: ConfigOption = None,
) -> None:
    """Let PROFILE answer in the chats named (from the next message on, on every instance;
    a chat that changes profile starts a new conversation)."""
    cfg = load(config)
    if profile not in cfg.profile_names():
        raise _fail(f"no profile {profile!r} (profiles: {', '.join(cfg.profile_names())})")
    rule = _rule(profile, platform, account, chat, thread)

    async def go() -> bool:
        async with Store.open(cfg.effective_database_url) as store:
            return await StoredBindings(store).bind(rule)

    new = asyncio.run(go())
    verb = "bound" if new else "rebound"
    _console().print(f"{verb} {escape(rule.describe())} to {escape(profile)}")


@profiles_app.command("unbind")
def profiles_unbind(
    platform: PlatformOption = None,
    account: AccountOption = None,
    chat: ChatOption = None,
    thread: ThreadOption = None,
    config: ConfigOption = None,
) -> None:
    """Remove the stored binding of exactly these chats (the config's are edited there)."""
    cfg = load(config)
    rule = _rule(DEFAULT, platform, account, chat, thread)

    async def go() -> bool:
        try:
            async with Store.open(cfg.effective_database_url, create=False) as store:
                return await StoredBindings(store).unbind(rule)
        except ConfigError:
            return False

    if not asyncio.run(go()):
        in_config = any(r.where == rule.where for r in cfg.binding_rules())
        where = " (it is in the config file: edit `bindings` there)" if in_config else ""
        raise _fail(f"no stored binding of {rule.describe()}{where}")
    _console().print(f"unbound {escape(rule.describe())}")
