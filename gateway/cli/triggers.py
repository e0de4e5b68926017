"""`herald triggers …`: signed webhooks that start agent runs.

Triggers live in the config file (`triggers.<name>`, secrets in files of their own):
`add` and `rm` edit it as `herald setup` does (comments and other keys kept, validated
before anything is written); the daemon reads its config once, so a restart serves the
change. `list` and `show` read the config and the database; `test` sends a signed sample
delivery to the running daemon, as the trigger's sender would.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import uuid
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.markup import escape

from gateway.cli.base import EXIT_SETUP, load
from gateway.cli.help import HeraldTyper
from gateway.cli.output import Column, JsonOption, Kind, print_json, print_rows
from gateway.cli.setup_file import ConfigFile
from gateway.config import HeraldConfig, config_path_from_env
from gateway.contracts.errors import ConfigError
from gateway.contracts.messages import utcnow
from gateway.store import Store
from gateway.store.triggers import TriggerRun, TriggerRuns
from gateway.triggers.config import DEFAULT_TOOLS, Scheme, check_name
from gateway.triggers.verify import sign
from gateway.triggers.views import describe, run_view

triggers_app = HeraldTyper(
    help="Manage triggers: signed webhooks that start agent runs.", no_args_is_help=True
)

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML config file (default: $HERALD_CONFIG)."),
]
SAMPLE = {
    "action": "opened",
    "number": 1,
    "pull_request": {"title": "A test delivery from herald triggers test"},
    "sender": {"login": "herald"},
}


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _fail(message: str, code: int = 1) -> typer.Exit:
    Console(stderr=True, highlight=False).print(f"[red]error:[/] {escape(message)}")
    return typer.Exit(code)


async def _runs(
    cfg: HeraldConfig, name: str | None, limit: int
) -> tuple[list[TriggerRun], dict[str, int]]:
    """Recent runs and the waiting counts; none when the database does not exist yet."""
    try:
        async with Store.open(cfg.effective_database_url, create=False) as store:
            runs = TriggerRuns(store)
            return await runs.runs(name, limit=limit), await runs.waiting()
    except ConfigError:
        return [], {}


@triggers_app.command("list")
def triggers_list(config: ConfigOption = None, json_: JsonOption = False) -> None:
    """Every configured trigger: its path, scheme, targets and runs waiting."""
    cfg = load(config)
    _, waiting = asyncio.run(_runs(cfg, None, 0))
    found = [describe(n, t, waiting.get(n, 0)) for n, t in sorted(cfg.triggers.items())]
    if json_:
        print_json(found)
        return
    console = _console()
    if not found:
        console.print("no triggers (add one with `herald triggers add`)")
        return
    print_rows(
        console,
        [
            Column("name", Kind.ID),
            Column("path"),
            Column("scheme"),
            Column("targets"),
            Column("waiting"),
        ],
        [
            [
                t["name"] + ("" if t["enabled"] else " (off)"),
                t["path"],
                t["scheme"],
                ", ".join(t["targets"]),
                str(t["waiting"]),
            ]
            for t in found
        ],
    )


@triggers_app.command("show")
def triggers_show(
    name: str,
    config: ConfigOption = None,
    json_: JsonOption = False,
    runs: Annotated[int, typer.Option(help="How many recent runs to show.")] = 10,
) -> None:
    """One trigger in full (its secret never shown) and its recent runs."""
    cfg = load(config)
    trigger = cfg.triggers.get(name)
    if trigger is None:
        raise _fail(f"there is no trigger {name!r} (see `herald triggers list`)")
    recent, waiting = asyncio.run(_runs(cfg, name, runs))
    data = describe(name, trigger, waiting.get(name, 0))
    data["runs"] = [run_view(r) for r in recent]
    if json_:
        print_json([data])
        return
    console = _console()
    console.print(f"[bold]{escape(name)}[/] POST {escape(data['path'])}")
    for key in ("enabled", "scheme", "owner", "targets", "tools", "filter", "limits", "waiting"):
        value = data[key]
        shown = ", ".join(value) if isinstance(value, list) else value
        console.print(f"  {key}: ", end="")
        console.print(json.dumps(shown) if isinstance(shown, dict) else str(shown), markup=False)
    console.print("  prompt: ", end="")
    console.print(trigger.prompt, markup=False)
    for run in data["runs"]:
        console.print(
            f"  run {run['id']}: {run['delivery']} {run['event'] or ''} {run['status']} "
            f"({run['received_at']}){' — ' + run['error'] if run['error'] else ''}",
            markup=False,
        )


def _pairs(values: list[str], what: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise _fail(f"{what} {item!r}: use NAME=VALUE", EXIT_SETUP)
        out.setdefault(key, []).append(value)
    return out


def _config_file(config: Path | None) -> ConfigFile:
    path = config_path_from_env(config)
    if path is None:
        raise _fail("name the config file to change: --config or HERALD_CONFIG", EXIT_SETUP)
    try:
        return ConfigFile(path)
    except ConfigError as err:
        raise _fail(str(err), EXIT_SETUP) from err


@triggers_app.command("add")
def triggers_add(  # noqa: PLR0917 - one parameter per option
    name: str,
    prompt: Annotated[str, typer.Option(help="The prompt template ({{ payload.x.y }}).")],
    scheme: Annotated[Scheme, typer.Option(help="How requests are verified.")] = Scheme.GITHUB,
    target: Annotated[
        list[str] | None,
        typer.Option(help="Where results go: home, platform:chat, webhook:<name> (repeat)."),
    ] = None,
    event: Annotated[
        list[str] | None, typer.Option(help="Only these events (the scheme's event header).")
    ] = None,
    field: Annotated[
        list[str] | None, typer.Option(help="Only when payload PATH=VALUE (repeat).")
    ] = None,
    tool: Annotated[
        list[str] | None, typer.Option(help="A tool its runs may use (repeat; default: read-only).")
    ] = None,
    owner: Annotated[str, typer.Option(help="cli, or an operator's platform:id.")] = "cli",
    header: Annotated[str | None, typer.Option(help="hmac: the signature header.")] = None,
    config: ConfigOption = None,
) -> None:
    """Add a trigger to the config file with a new random secret (shown once)."""
    try:
        check_name(name, "trigger")
    except ValueError as err:
        raise _fail(str(err), EXIT_SETUP) from err
    file = _config_file(config)
    if name in file.section("triggers"):
        raise _fail(f"there is a trigger {name!r} already; `herald triggers rm {name}` first")
    secret = secrets.token_hex(32)
    values: dict[str, Any] = {"scheme": str(scheme), "prompt": prompt, "owner": owner}
    values["targets"] = target or ["home"]
    if tool:
        values["tools"] = tool
    rules: dict[str, Any] = {}
    if event:
        event_header = {Scheme.GITHUB: "X-GitHub-Event", Scheme.GITLAB: "X-Gitlab-Event"}
        if scheme in event_header:
            rules["headers"] = {event_header[scheme]: event}
        else:
            rules.setdefault("fields", {})["type"] = event
    if field:
        rules.setdefault("fields", {}).update(_pairs(field, "--field"))
    if rules:
        values["filter"] = rules
    if header:
        values["header"] = header
    for key, value in values.items():
        file.set("triggers", name, key, value=value)
    file.set_secret("triggers", name, "secret", value=secret)
    try:
        file.validate()
    except ConfigError as err:
        raise _fail(str(err), EXIT_SETUP) from err
    file.commit()
    console = _console()
    console.print(f"trigger {escape(name)} added to {escape(str(file.path))}")
    console.print(f"  URL:    https://<your host>/hooks/{escape(name)}")
    console.print(
        f"  secret: {secret}  (shown once; kept in {file.secret_path('triggers', name, 'secret')})"
    )
    console.print(f"  tools:  {', '.join(tool or DEFAULT_TOOLS)}")
    console.print("Restart Herald to serve it (the config is read at start).")


@triggers_app.command("rm")
def triggers_rm(name: str, config: ConfigOption = None) -> None:
    """Remove a trigger from the config file (its runs stay in the database)."""
    file = _config_file(config)
    if name not in file.section("triggers"):
        raise _fail(f"there is no trigger {name!r} in {file.path}")
    file.set("triggers", name, value=None)
    try:
        file.validate()
    except ConfigError as err:
        raise _fail(str(err), EXIT_SETUP) from err
    file.commit()
    _console().print(f"trigger {escape(name)} removed; restart Herald to stop serving it")


@triggers_app.command("test")
def triggers_test(
    name: str,
    payload: Annotated[
        Path | None, typer.Option(help="A JSON file to send (default: a sample pull request).")
    ] = None,
    url: Annotated[
        str | None, typer.Option(help="Herald's base URL (default: api.host and api.port).")
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Send a signed sample delivery to the running daemon, as the sender would; print
    its answer (202: stored and about to run; 200: its filters skip it)."""
    cfg = load(config)
    trigger = cfg.triggers.get(name)
    if trigger is None:
        raise _fail(f"there is no trigger {name!r} (see `herald triggers list`)")
    try:
        body = payload.read_bytes() if payload else json.dumps(SAMPLE).encode()
    except OSError as err:
        raise _fail(f"cannot read {payload}: {err.strerror}", EXIT_SETUP) from err
    headers = sign(trigger, body, utcnow(), f"herald-test-{uuid.uuid4()}")
    if trigger.scheme is Scheme.GITHUB:
        headers.setdefault("X-GitHub-Event", "pull_request")
    elif trigger.scheme is Scheme.GITLAB:
        headers.setdefault("X-Gitlab-Event", "Merge Request Hook")
    base = url or f"http://{cfg.api.host}:{cfg.api.port}"
    try:
        response = httpx.post(
            f"{base.rstrip('/')}/hooks/{name}", content=body, headers=headers, timeout=10.0
        )
    except httpx.HTTPError as err:
        raise _fail(f"cannot reach Herald at {base}: {err}; is it running?") from err
    _console().print(f"{response.status_code} {response.text}", markup=False)
    if response.status_code >= 300:
        raise typer.Exit(1)
