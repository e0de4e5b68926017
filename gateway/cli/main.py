"""The `herald` command line."""

from __future__ import annotations

import asyncio
import getpass
import logging
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import openai
import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agent_core.llm import make_provider
from gateway.config import HeraldConfig, load_config, masked
from gateway.contracts.errors import ConfigError, LLMError
from gateway.store import Store, engine
from gateway.supervisor import Supervisor

app = typer.Typer(
    name="herald",
    help="Herald: an always-on messaging gateway for an LLM agent.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
sessions_app = typer.Typer(help="Inspect conversations.", no_args_is_help=True)
config_app = typer.Typer(help="Inspect the configuration.", no_args_is_help=True)
db_app = typer.Typer(help="Manage the database.", no_args_is_help=True)
app.add_typer(sessions_app, name="sessions")
app.add_typer(config_app, name="config")
app.add_typer(db_app, name="db")

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML config file (default: $HERALD_CONFIG)."),
]


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _load(path: Path | None) -> HeraldConfig:
    try:
        return load_config(path)
    except ConfigError as err:
        Console(stderr=True).print(f"[red]error:[/] {escape(str(err))}", highlight=False)
        raise typer.Exit(2) from err


def _logging(level: str) -> None:
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


@app.command()
def run(config: ConfigOption = None) -> None:
    """Run the daemon until SIGTERM / SIGINT."""
    cfg = _load(config)
    _logging(cfg.log_level)
    try:
        code = asyncio.run(Supervisor(cfg).run())
    except OSError as err:
        logging.getLogger("herald").error("%s", err)
        raise typer.Exit(1) from err
    raise typer.Exit(code)


@app.command()
def chat(
    config: ConfigOption = None,
    session: Annotated[
        str | None, typer.Option(help="Session name (default: cli-<your user name>).")
    ] = None,
    message: Annotated[
        str | None, typer.Option("--message", "-m", help="Send one message and exit.")
    ] = None,
    url: Annotated[
        str | None, typer.Option(help="API base URL (default: from the config).")
    ] = None,
) -> None:
    """Talk to the agent in the terminal, through the running daemon's session manager."""
    cfg = _load(config)
    base = url or f"http://{_client_host(cfg.api.host)}:{cfg.api.port}/v1"
    name = session or f"cli-{getpass.getuser()}"
    key = cfg.api.key.get_secret_value() if cfg.api.key else None
    console = _console()

    async def talk() -> None:
        client = openai.AsyncOpenAI(base_url=base, api_key=key or "none", max_retries=1)
        extra: dict[str, Any] = (
            {"extra_headers": {"X-Herald-Session-Id": name}} if key else {"user": name}
        )
        try:
            if message is not None:
                await _send(client, cfg.api.model_name, message, extra, console)
                return
            console.print(f"[dim]session {name} on {base} (Ctrl-D to quit)[/]")
            while True:
                try:
                    text = await asyncio.to_thread(console.input, "[bold]you>[/] ")
                except EOFError:
                    console.print()
                    return
                if text.strip() in ("/quit", "/exit"):
                    return
                if text.strip():
                    await _send(client, cfg.api.model_name, text, extra, console)
        finally:
            await client.close()

    try:
        asyncio.run(talk())
    except openai.APIConnectionError as err:
        console.print(f"[red]Herald is not running at {base}[/]; start it with `herald run`.")
        raise typer.Exit(1) from err
    except openai.APIStatusError as err:
        console.print(f"[red]error {err.status_code}:[/] {err.message}")
        raise typer.Exit(1) from err
    except KeyboardInterrupt:
        console.print()


async def _send(
    client: Any, model: str, text: str, extra: dict[str, Any], console: Console
) -> None:
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], stream=True, **extra
    )
    console.print("[bold cyan]herald>[/] ", end="")
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            console.print(chunk.choices[0].delta.content, end="", markup=False)
    console.print()


def _client_host(host: str) -> str:
    if host in ("0.0.0.0", ""):  # noqa: S104 - reaching a wildcard listener locally
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _with_store(config: Path | None, work: Callable[[Any], Awaitable[None]]) -> None:
    cfg = _load(config)

    async def go() -> None:
        async with Store.open(cfg.effective_database_url) as store:
            await work(store)

    asyncio.run(go())


@sessions_app.command("list")
def sessions_list(
    config: ConfigOption = None,
    limit: Annotated[int, typer.Option(min=1)] = 50,
) -> None:
    """Sessions, most recently active first."""
    console = _console()

    async def work(store: Any) -> None:
        table = Table("key", "epoch", "messages", "last active (UTC)", "user")
        for s in await store.list_sessions(limit=limit):
            table.add_row(
                escape(s.key),
                str(s.epoch),
                str(s.message_count),
                f"{s.updated_at:%Y-%m-%d %H:%M:%S}",
                escape(s.user_id or ""),
            )
        console.print(table)

    _with_store(config, work)


@sessions_app.command("show")
def sessions_show(
    key: str,
    config: ConfigOption = None,
    limit: Annotated[int, typer.Option(min=1)] = 200,
) -> None:
    """The transcript of a session's current epoch."""
    console = _console()

    async def work(store: Any) -> None:
        session = await store.get_session(key)
        if session is None:
            console.print(f"[red]no session {escape(key)}[/]")
            raise typer.Exit(1)
        console.print(
            f"[bold]{escape(session.key)}[/] epoch {session.epoch}, "
            f"{session.message_count} messages"
        )
        for m in await store.transcript(session.id, limit=limit):
            mark = " [yellow](interrupted)[/]" if m.interrupted else ""
            calls = ", ".join(f"{c.name}({c.arguments})" for c in m.tool_calls)
            when = f"{m.created_at:%Y-%m-%d %H:%M:%S}" if m.created_at else ""
            console.print(f"[dim]{when}[/] [bold]{m.role}[/]{mark}: ", end="")
            console.print(m.content + (f" → {calls}" if calls else ""), markup=False)

    _with_store(config, work)


@sessions_app.command("search")
def sessions_search(
    query: str,
    config: ConfigOption = None,
    limit: Annotated[int, typer.Option(min=1, max=100)] = 20,
) -> None:
    """Full-text search over every transcript."""
    console = _console()

    async def work(store: Any) -> None:
        hits = await store.search_messages(query, user_id=None, limit=limit)
        if not hits:
            console.print("no matches")
        for h in hits:
            console.print(
                f"[bold]{h.session_key}[/] [dim]{h.created_at:%Y-%m-%d %H:%M}[/] ", end=""
            )
            console.print(f"{h.role}: {h.snippet}", markup=False)

    _with_store(config, work)


@config_app.command("check")
def config_check(config: ConfigOption = None) -> None:
    """Validate the configuration and print it, secrets masked."""
    cfg = _load(config)
    typer.echo(yaml.safe_dump(masked(cfg), sort_keys=False, allow_unicode=True), nl=False)


@db_app.command("upgrade")
def db_upgrade(config: ConfigOption = None) -> None:
    """Apply the database migrations (also done at every start)."""

    async def work(store: Any) -> None:
        typer.echo(f"database at revision {await engine.current_revision(store.engine)}")

    _with_store(config, work)


@app.command()
def doctor(config: ConfigOption = None) -> None:
    """Check config, state directory, database, LLM and each platform, with a verdict each."""
    console = _console()
    cfg = _load(config)
    verdicts: list[tuple[str, str, str]] = [("config", "ok", "valid")]
    verdicts.append(_check_state_dir(cfg.state_dir))
    verdicts.extend(asyncio.run(_async_checks(cfg)))
    if not verdicts or all(name != "platforms" for name, _, _ in verdicts):
        verdicts.append(("platforms", "ok", "none configured (HTTP API and CLI only)"))
    colors = {"ok": "green", "warn": "yellow", "fail": "red"}
    for name, verdict, detail in verdicts:
        console.print(f"[{colors[verdict]}]{verdict.upper():4}[/] {name}: ", end="")
        console.print(detail, markup=False)
    if any(v == "fail" for _, v, _ in verdicts):
        raise typer.Exit(1)


def _check_state_dir(path: Path) -> tuple[str, str, str]:
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        with tempfile.NamedTemporaryFile(dir=path):
            pass
    except OSError as err:
        return ("state_dir", "fail", f"{path} is not writable: {err.strerror}")
    return ("state_dir", "ok", str(path))


async def _async_checks(cfg: HeraldConfig) -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    try:
        async with Store.open(cfg.effective_database_url, migrate=False) as store:
            await store.ping()
            current = await engine.current_revision(store.engine)
            head = engine.head_revision()
            if current == head:
                out.append(("database", "ok", f"{store.dialect}, schema {current}"))
            else:
                out.append(
                    (
                        "database",
                        "warn",
                        f"{store.dialect}, schema {current} (newest {head}): "
                        "run `herald db upgrade` or start the daemon to migrate",
                    )
                )
    except Exception as err:
        out.append(("database", "fail", f"unreachable: {type(err).__name__}: {err}"))
    provider = make_provider(cfg.llm)
    try:
        detail = await provider.check()
        verdict = "warn" if provider.name == "echo" else "ok"
        out.append(("llm", verdict, detail))
    except LLMError as err:
        out.append(("llm", "fail", str(err)))
    finally:
        await provider.aclose()
    return out


def main() -> None:
    """The console script entry point."""
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    app()
