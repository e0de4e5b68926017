"""The `herald` command line."""

from __future__ import annotations

import asyncio
import difflib
import getpass
import os
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.markup import escape

from agent_core.memory import MemoryFiles, NamespacedDocs
from gateway import __version__, platforms
from gateway.access import Pairings
from gateway.cli.base import DEBUG, HeraldGroup, configure_logging, current_redactor, load
from gateway.cli.checks import (
    FAIL,
    PLATFORM_CHECK_TIMEOUT,
    REFUSED,
    check_llm,
    check_platform,
    check_speech,
)
from gateway.cli.help import HeraldTyper
from gateway.cli.jobs import jobs_app
from gateway.cli.memory import memory_app, memory_check
from gateway.cli.output import Column, JsonOption, Kind, print_json, print_rows
from gateway.cli.profiles import profiles_app
from gateway.cli.setup import setup
from gateway.cli.skills import doctor_check as skills_check
from gateway.cli.skills import skills_app
from gateway.cli.state import state_app
from gateway.cli.triggers import triggers_app
from gateway.commands import Command, parse_command
from gateway.config import HeraldConfig, masked, section_key
from gateway.contracts.errors import HeraldError
from gateway.contracts.ids import API_ACCOUNT, Origin, SessionKey
from gateway.contracts.messages import utcnow
from gateway.cron.targets import home_problems
from gateway.redact import Redactor
from gateway.store import Store, engine
from gateway.store.inbox import Inbox
from gateway.store.instances import list_instances
from gateway.store.lanes import lanes_by_owner
from gateway.store.leases import list_leases
from gateway.store.memory_docs import SqlMemoryDocs
from gateway.store.outbox import Outbox, OutboxRow, OutboxStatus

if TYPE_CHECKING:
    import openai

# The daemon's modules (the supervisor, the model client, the HTTP app) are imported by the
# commands that use them: most commands only read the database, and start faster without.

app = HeraldTyper(
    name="herald",
    help="Herald: an always-on messaging gateway for an LLM agent.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=HeraldGroup,
)
sessions_app = HeraldTyper(help="Inspect conversations.", no_args_is_help=True)
config_app = HeraldTyper(help="Inspect the configuration.", no_args_is_help=True)
db_app = HeraldTyper(help="Manage the database.", no_args_is_help=True)
deliveries_app = HeraldTyper(
    help="Inspect, retry and discard outbound deliveries.", no_args_is_help=True
)
pairing_app = HeraldTyper(help="Approve who may talk to the agent.", no_args_is_help=True)
users_app = HeraldTyper(
    help="A person's identities across platforms: list, link, unlink.", no_args_is_help=True
)
app.add_typer(sessions_app, name="sessions")
app.add_typer(deliveries_app, name="deliveries")
app.add_typer(pairing_app, name="pairing")
app.add_typer(users_app, name="users")
app.add_typer(config_app, name="config")
app.add_typer(db_app, name="db")
app.add_typer(jobs_app, name="jobs")
app.add_typer(triggers_app, name="triggers")
app.add_typer(profiles_app, name="profiles")
app.add_typer(memory_app, name="memory")
app.command("setup")(setup)
app.add_typer(skills_app, name="skills")
app.add_typer(state_app, name="state")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"herald {__version__}")
        raise typer.Exit


ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML config file (default: $HERALD_CONFIG)."),
]


@app.callback()
def _options(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option(
            "--version", "-V", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
    debug: Annotated[
        bool,
        typer.Option("--debug", help="On failure, print the traceback too; log at DEBUG level."),
    ] = False,
) -> None:
    """Herald: an always-on messaging gateway for an LLM agent."""
    ctx.meta[DEBUG] = debug
    if debug:
        configure_logging("DEBUG", Redactor())


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _load(path: Path | None) -> HeraldConfig:
    return load(path)


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (it is on Linux); else asyncio's own."""
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:
        return None
    return uvloop.new_event_loop


@app.command()
def run(config: ConfigOption = None) -> None:
    """Run the daemon until SIGTERM / SIGINT / SIGHUP (each drains, then exit 0)."""
    from gateway.supervisor import Supervisor  # noqa: PLC0415

    cfg = load(config, log_level=None)
    # Failures (a bad state directory, a port in use, a database newer than the code, another
    # instance on this SQLite database) reach HeraldGroup: one line, exit 2.
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        code = runner.run(Supervisor(cfg).run())
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
    import openai  # noqa: PLC0415

    cfg = _load(config)
    base = url or f"http://{_client_host(cfg.api.host)}:{cfg.api.port}/v1"
    name = session or f"cli-{getpass.getuser()}"
    key = cfg.api.key.get_secret_value() if cfg.api.key else None
    console = _console()

    session_key = SessionKey(f"{Origin.API}:{API_ACCOUNT}:{name}")

    async def say(client: Any, text: str, extra: dict[str, Any]) -> None:
        # Commands go to the daemon like any message: it answers them from the one command
        # table every surface shares (gateway/commands.py), without a model call.
        await _send(client, cfg.api.model_name, text, extra, console)
        parsed = parse_command(text)
        if parsed is not None and parsed.command is Command.HELP:
            console.print(QUIT_HELP, markup=False)

    async def talk() -> None:
        client = openai.AsyncOpenAI(base_url=base, api_key=key or "none", max_retries=1)
        extra: dict[str, Any] = (
            {"extra_headers": {"X-Herald-Session-Id": name}} if key else {"user": name}
        )
        try:
            if message is not None:
                await say(client, message, extra)
                return
            console.print(
                f"[dim]session {escape(session_key)} on {escape(base)} "
                "(/help for commands, Ctrl-D to quit)[/]"
            )
            while True:
                try:
                    text = await asyncio.to_thread(console.input, "[bold]you>[/] ")
                except EOFError:
                    console.print()
                    return
                if text.strip() in ("/quit", "/exit"):
                    return
                if not text.strip():
                    continue
                try:
                    await say(client, text, extra)
                except openai.APIError as err:  # this turn failed; the conversation goes on
                    console.print()
                    console.print(f"[red]{escape(_turn_failure(err, base))}[/]")
        finally:
            await client.close()

    try:
        asyncio.run(talk())
    except openai.APIError as err:
        console.print()
        console.print(f"[red]{escape(_turn_failure(err, base))}[/]")
        raise typer.Exit(1) from err
    except KeyboardInterrupt:
        console.print()


def _turn_failure(err: openai.APIError, base: str) -> str:
    """One line saying why a chat turn failed and what to do."""
    import openai  # noqa: PLC0415

    if isinstance(err, openai.APIConnectionError):
        return f"Herald is not running at {base} (or the connection broke); start it: `herald run`."
    if isinstance(err, openai.APIStatusError) and err.status_code == 401:
        return (
            f"error 401: {err.message}. The daemon wants its API key (api.key): give "
            "`herald chat` the daemon's config file with --config PATH, or set "
            "HERALD_CONFIG=PATH (or HERALD_API__KEY to the key)."
        )
    if isinstance(err, openai.APIStatusError):
        return f"error {err.status_code}: {err.message}"
    if err.message.startswith("the turn "):
        return err.message  # the daemon's own words already say how the turn ended
    return f"the turn failed: {err.message}"


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


QUIT_HELP = "/quit or Ctrl-D — leave the terminal"


def _client_host(host: str) -> str:
    if host in ("0.0.0.0", ""):  # noqa: S104 - reaching a wildcard listener locally
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _with_store(
    config: Path | None, work: Callable[[Any], Awaitable[None]], *, create: bool = False
) -> None:
    """Run `work` on the configured store. Unless `create`, a database that does not exist
    yet is an error naming where it was looked for (exit 2), never created empty."""
    cfg = _load(config)

    async def go() -> None:
        async with Store.open(cfg.effective_database_url, create=create) as store:
            await work(store)

    asyncio.run(go())


@app.command()
def instances(config: ConfigOption = None, json_: JsonOption = False) -> None:
    """The instances sharing this database, what each holds, and the leases."""
    console = _console()
    cfg = _load(config)
    ttl = cfg.cluster.lease_ttl

    async def work(store: Any) -> None:
        async with store.read() as conn:
            found = await list_instances(conn)
            leases = await list_leases(conn)
            held = await lanes_by_owner(conn)
        now = utcnow()
        if json_:
            print_json(
                [
                    {
                        "id": i.id,
                        "state": i.state(now, ttl),
                        "host": i.host,
                        "pid": i.pid,
                        "version": i.version,
                        "started_at": i.started_at,
                        "heartbeat_at": i.heartbeat_at,
                        "stopped_at": i.stopped_at,
                        "holds": list(i.holds),
                        "sessions": held.get(i.id, 0) if i.alive(now, ttl) else None,
                        "leases": [
                            {
                                "name": lease.name,
                                "token": lease.token,
                                "expires_at": lease.expires_at,
                            }
                            for lease in leases
                            if lease.owner == i.id
                        ],
                    }
                    for i in found
                ]
            )
            return
        print_rows(
            console,
            [
                Column("instance", Kind.ID),
                Column("state", Kind.ID),
                Column("host", Kind.ID),
                Column("pid", Kind.NUMBER),
                Column("version", Kind.ID),
                Column("started (UTC)"),
                Column("heartbeat", Kind.ID),
                Column("holds"),
                Column("sessions", Kind.NUMBER),
            ],
            [
                [
                    i.id,
                    i.state(now, ttl),
                    i.host,
                    str(i.pid),
                    i.version,
                    f"{i.started_at:%Y-%m-%d %H:%M}",
                    f"{(now - i.heartbeat_at).total_seconds():.0f}s ago",
                    ", ".join(i.holds),
                    str(held.get(i.id, 0)) if i.alive(now, ttl) else "",
                ]
                for i in found
            ],
        )
        if leases:
            console.print()
            print_rows(
                console,
                [
                    Column("lease", Kind.ID),
                    Column("owner", Kind.ID),
                    Column("token", Kind.NUMBER),
                    Column("expires", Kind.ID),
                ],
                [
                    [
                        lease.name,
                        lease.owner,
                        str(lease.token),
                        (
                            f"in {(lease.expires_at - now).total_seconds():.0f}s"
                            if lease.expires_at > now
                            else "expired"
                        ),
                    ]
                    for lease in leases
                ],
            )

    _with_store(config, work)


@sessions_app.command("list")
def sessions_list(
    config: ConfigOption = None,
    limit: Annotated[int, typer.Option(min=1)] = 50,
    json_: JsonOption = False,
) -> None:
    """Sessions, most recently active first."""
    console = _console()

    async def work(store: Any) -> None:
        found = await store.list_sessions(limit=limit)
        if json_:
            print_json(
                [
                    {
                        "key": s.key,
                        "epoch": s.epoch,
                        "conversation": s.epoch + 1,
                        "messages": s.message_count,
                        "updated_at": s.updated_at,
                        "user_id": s.user_id,
                        "profile": s.profile,
                    }
                    for s in found
                ]
            )
            return
        profiles = any(s.profile != "default" for s in found)  # the column only then
        print_rows(
            console,
            [
                Column("key", Kind.ID),
                Column("conversation", Kind.NUMBER),
                Column("messages", Kind.NUMBER),
                Column("last active (UTC)"),
                Column("user", Kind.ID),
                *([Column("profile", Kind.ID)] if profiles else []),
            ],
            [
                [
                    s.key,
                    f"#{s.epoch + 1}",
                    str(s.message_count),
                    f"{s.updated_at:%Y-%m-%d %H:%M:%S}",
                    s.user_id or "",
                    *([s.profile] if profiles else []),
                ]
                for s in found
            ],
        )

    _with_store(config, work)


@sessions_app.command("show")
def sessions_show(
    key: Annotated[
        str, typer.Argument(help="A session key, or the bare name of a `herald chat` session.")
    ],
    config: ConfigOption = None,
    limit: Annotated[int, typer.Option(min=1)] = 200,
) -> None:
    """The transcript of a session's current conversation (a bare name is an API session's)."""
    console = _console()
    if ":" not in key:  # `herald chat`'s and the API's names: api:default:<name>
        key = f"{Origin.API}:{API_ACCOUNT}:{key}"

    async def work(store: Any) -> None:
        session = await store.get_session(key)
        inbound = await Inbox(store).for_session(key, limit=limit)
        if session is None and not inbound:
            console.print(f"[red]no session {escape(key)}[/]")
            raise typer.Exit(1)
        if inbound:
            print_rows(
                console,
                [
                    Column("id", Kind.NUMBER),
                    Column("received (UTC)"),
                    Column("from"),
                    Column("text"),
                    Column("outcome", Kind.ID),
                    Column("turn", Kind.NUMBER),
                    Column("detail"),
                ],
                [
                    [
                        str(r.id),
                        f"{r.received_at:%Y-%m-%d %H:%M:%S}",
                        r.sender_name or r.sender_id,
                        _short(r.text),
                        str(r.outcome or r.status),
                        "" if r.turn_id is None else str(r.turn_id),
                        r.outcome_detail or "",
                    ]
                    for r in inbound
                ],
                title="Inbound messages",
            )
        if session is None:
            return
        console.print(
            f"[bold]{escape(session.key)}[/] conversation #{session.epoch + 1}, "
            f"{session.message_count} messages"
        )
        for m in await store.transcript(session.id, limit=limit):
            mark = " [yellow](interrupted)[/]" if m.interrupted else ""
            calls = ", ".join(f"{c.name}({c.arguments})" for c in m.tool_calls)
            when = f"{m.created_at:%Y-%m-%d %H:%M:%S}" if m.created_at else ""
            console.print(f"[dim]{when}[/] [bold]{escape(str(m.role))}[/]{mark}: ", end="")
            console.print(m.content + (f" → {calls}" if calls else ""), markup=False)

    _with_store(config, work)


def _short(text: str, width: int = 60) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


@deliveries_app.command("list")
def deliveries_list(
    config: ConfigOption = None,
    dead: Annotated[bool, typer.Option("--dead", help="Only dead letters.")] = False,
    pending: Annotated[bool, typer.Option("--pending", help="Only undelivered chunks.")] = False,
    limit: Annotated[int, typer.Option(min=1)] = 50,
    json_: JsonOption = False,
) -> None:
    """Outbound chunks, newest first, with their status and last error."""
    console = _console()
    status = OutboxStatus.DEAD if dead else OutboxStatus.PENDING if pending else None

    async def work(store: Any) -> None:
        rows = await Outbox(store).list(status=status, limit=limit)
        if json_:
            print_json(
                [
                    {
                        "id": r.id,
                        "created_at": r.created_at,
                        "to": f"{r.target.platform}:{r.target.chat_id}",
                        "status": str(r.status),
                        "recovered": r.recovered,
                        "receipt": r.receipt,
                        "attempts": r.attempts,
                        "text": r.text,
                        "error": r.last_error,
                    }
                    for r in rows
                ]
            )
            return
        if not rows:
            console.print("no deliveries" if status is None else f"no {status} deliveries")
            return
        print_rows(
            console,
            [
                Column("id", Kind.NUMBER),
                Column("created (UTC)"),
                Column("to", Kind.ID),
                Column("status"),
                Column("tries", Kind.NUMBER),
                Column("text"),
                Column("error"),
            ],
            [
                [
                    str(r.id),
                    f"{r.created_at:%Y-%m-%d %H:%M:%S}",
                    f"{r.target.platform}:{r.target.chat_id}",
                    str(r.status)
                    + (" (recovered)" if r.recovered else "")
                    + (f", {r.receipt}" if r.receipt else ""),
                    str(r.attempts),
                    _short(r.text),
                    r.last_error or "",
                ]
                for r in rows
            ],
        )

    _with_store(config, work)


def _each_dead_letter(
    config: Path | None,
    ids: list[int],
    act: Callable[[Outbox, int], Awaitable[OutboxRow]],
    done: str,
) -> None:
    """Apply `act` to each dead letter in `ids` and print `done` (its `{target}` filled in)
    per row; an unknown id is an error on stderr, the others still go through, exit code 1."""
    console = _console()

    async def work(store: Any) -> None:
        failed = False
        outbox = Outbox(store)
        for row_id in ids:
            try:
                row = await act(outbox, row_id)
            except LookupError as err:
                Console(stderr=True).print(f"[red]error:[/] {escape(str(err))}")
                failed = True
                continue
            target = f"{escape(row.target.platform)}:{escape(row.target.chat_id)}"
            console.print(f"{row.id}: {done.format(target=target)}")
        if failed:
            raise typer.Exit(1)

    _with_store(config, work)


DeadLetterIds = Annotated[
    list[int], typer.Argument(help="Dead letter ids (see `deliveries list --dead`).")
]


@deliveries_app.command("retry")
def deliveries_retry(ids: DeadLetterIds, config: ConfigOption = None) -> None:
    """Send dead letters again: the running daemon picks them up within seconds."""
    _each_dead_letter(config, ids, Outbox.retry, "queued again for {target}")


@deliveries_app.command("discard")
def deliveries_discard(ids: DeadLetterIds, config: ConfigOption = None) -> None:
    """Give up on dead letters: kept as discarded, never sent."""
    _each_dead_letter(config, ids, Outbox.discard, "discarded (to {target})")


@pairing_app.command("list")
def pairing_list(
    config: ConfigOption = None,
    all_: Annotated[bool, typer.Option("--all", help="Include decided and expired codes.")] = False,
    json_: JsonOption = False,
) -> None:
    """Pending pairing requests from unknown senders."""
    console = _console()

    async def work(store: Any) -> None:
        rows = await Pairings(store).list(all_=all_)
        if json_:
            print_json(
                [
                    {
                        "code": p.code,
                        "platform": p.platform,
                        "account": p.account,
                        "user_id": p.external_id,
                        "name": p.display_name,
                        "status": p.status,
                        "expires_at": p.expires_at,
                    }
                    for p in rows
                ]
            )
            return
        if not rows:
            console.print("no pending pairing requests" if not all_ else "no pairing requests")
            return
        print_rows(
            console,
            [
                Column("code", Kind.ID),
                Column("platform", Kind.ID),
                Column("account", Kind.ID),
                Column("user id", Kind.ID),
                Column("name"),
                Column("status", Kind.ID),
                Column("expires (UTC)"),
            ],
            [
                [
                    p.code,
                    p.platform,
                    p.account,
                    p.external_id,
                    p.display_name,
                    p.status,
                    f"{p.expires_at:%Y-%m-%d %H:%M:%S}",
                ]
                for p in rows
            ],
        )

    _with_store(config, work)


@pairing_app.command("approve")
def pairing_approve(code: str, config: ConfigOption = None) -> None:
    """Let the sender of a pairing code talk to the agent."""
    console = _console()

    async def work(store: Any) -> None:
        try:
            p = await Pairings(store).approve_and_tell(code)
        except LookupError as err:
            Console(stderr=True).print(f"[red]error:[/] {escape(str(err))}")
            raise typer.Exit(1) from err
        console.print(
            f"approved {escape(p.platform)}:{escape(p.external_id)} "
            f"({escape(p.display_name or 'no name')})"
        )

    _with_store(config, work)


@pairing_app.command("reject")
def pairing_reject(code: str, config: ConfigOption = None) -> None:
    """Refuse a pending pairing code: its sender gets no access."""
    console = _console()

    async def work(store: Any) -> None:
        try:
            p = await Pairings(store).reject(code)
        except LookupError as err:
            Console(stderr=True).print(f"[red]error:[/] {escape(str(err))}")
            raise typer.Exit(1) from err
        console.print(f"rejected {escape(p.platform)}:{escape(p.external_id)} ({escape(p.code)})")

    _with_store(config, work)


@pairing_app.command("revoke")
def pairing_revoke(
    who: Annotated[str, typer.Argument(help="A pairing code, or platform:user_id.")],
    config: ConfigOption = None,
) -> None:
    """Withdraw access granted by pairing (config allowlists are not changed)."""
    console = _console()

    async def work(store: Any) -> None:
        try:
            await Pairings(store).revoke(who)
        except LookupError as err:
            Console(stderr=True).print(f"[red]error:[/] {escape(str(err))}")
            raise typer.Exit(1) from err
        console.print(f"revoked {escape(who)}")

    _with_store(config, work)


IDENTITY_PLATFORMS = frozenset([*platforms.names(), str(Origin.API), str(Origin.CLI), "local"])
"""Platforms a user identity can be on (`local` is the owner at the terminal)."""


_EXAMPLE = platforms.example_target()


def _identity(value: str) -> tuple[str, str]:
    platform, sep, external = value.partition(":")
    if not sep or not platform or not external:
        raise typer.BadParameter(
            f"{value!r} is not platform:id (like {platforms.example_target()})"
        )
    platform = platform.lower()
    if platform not in IDENTITY_PLATFORMS:
        close = difflib.get_close_matches(platform, sorted(IDENTITY_PLATFORMS), n=1)
        hint = (
            f"did you mean {close[0]}?"
            if close
            else f"one of {', '.join(sorted(IDENTITY_PLATFORMS))}"
        )
        raise typer.BadParameter(f"{value!r}: unknown platform {platform!r}; {hint}")
    return platform, external


@users_app.command("link")
def users_link(
    first: Annotated[
        str,
        typer.Argument(help=f"platform:id whose user is kept, e.g. {platforms.example_target()}"),
    ],
    second: Annotated[
        str, typer.Argument(help="platform:id to merge in, as `herald users list` shows it")
    ],
    config: ConfigOption = None,
) -> None:
    """Make two identities one user: one USER.md and memory, one search scope."""
    cfg = _load(config)
    console = _console()
    a, b = _identity(first), _identity(second)

    async def go() -> None:
        async with Store.open(cfg.effective_database_url) as store:
            kept, merged = await store.link_identities(a, b)
            if merged is not None:
                await MemoryFiles(SqlMemoryDocs(store)).merge(merged, kept)
                for namespace in cfg.memory_namespaces():  # each profile's memory too
                    docs = NamespacedDocs(SqlMemoryDocs(store), namespace)
                    await MemoryFiles(docs).merge(merged, kept)
            ids = ", ".join(f"{p}:{e}" for p, e in await store.identities_of(kept))
        console.print(f"user {escape(kept)}: {escape(ids)}")

    asyncio.run(go())


@users_app.command("list")
def users_list(config: ConfigOption = None, json_: JsonOption = False) -> None:
    """Every user with its linked identities."""
    console = _console()

    async def work(store: Any) -> None:
        found = await store.list_users()
        if json_:
            print_json(
                [
                    {"id": u, "name": name, "identities": [f"{p}:{e}" for p, e in ids]}
                    for u, name, ids in found
                ]
            )
            return
        if not found:
            console.print("no users yet")
            return
        print_rows(
            console,
            [Column("user", Kind.ID), Column("name"), Column("identities")],
            [[u, name, ", ".join(f"{p}:{e}" for p, e in ids)] for u, name, ids in found],
        )

    _with_store(config, work)


@users_app.command("unlink")
def users_unlink(
    identity: Annotated[
        str, typer.Argument(help="platform:id to detach, as `herald users list` shows it")
    ],
    config: ConfigOption = None,
) -> None:
    """Detach an identity from its user: its next message starts a user of its own."""
    who = _identity(identity)
    console = _console()

    async def work(store: Any) -> None:
        try:
            user_id = await store.unlink_identity(who)
        except LookupError as err:
            Console(stderr=True).print(f"[red]error:[/] {escape(str(err))}")
            raise typer.Exit(1) from err
        rest = ", ".join(f"{p}:{e}" for p, e in await store.identities_of(user_id))
        console.print(
            f"unlinked {escape(who[0])}:{escape(who[1])} from user {escape(user_id)} "
            f"(still {escape(rest)}); its chats start over as its own from its next message, "
            "and the jobs it made are its own"
        )

    _with_store(config, work)


@sessions_app.command("search")
def sessions_search(
    query: str,
    config: ConfigOption = None,
    limit: Annotated[int, typer.Option(min=1, max=100)] = 20,
    json_: JsonOption = False,
) -> None:
    """Full-text search over every transcript."""
    console = _console()

    async def work(store: Any) -> None:
        hits = await store.search_messages(query, user_id=None, limit=limit)
        if json_:
            print_json(
                [
                    {
                        "session_key": h.session_key,
                        "role": str(h.role),
                        "created_at": h.created_at,
                        "snippet": h.snippet,
                    }
                    for h in hits
                ]
            )
            return
        if not hits:
            console.print("no matches")
        for h in hits:
            console.print(
                f"[bold]{escape(h.session_key)}[/] [dim]{h.created_at:%Y-%m-%d %H:%M}[/] ", end=""
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

    _with_store(config, work, create=True)


@app.command()
def doctor(config: ConfigOption = None) -> None:
    """Check config, state directory, database, LLM and each platform, with a verdict each."""
    console = _console()
    cfg = _load(config)
    verdicts: list[tuple[str, str, str]] = [("config", "ok", "valid")]
    verdicts.append(_check_state_dir(cfg.state_dir))
    verdicts.extend(asyncio.run(_async_checks(cfg)))
    if not cfg.platforms.accounts():
        verdicts.append(("platforms", "ok", "none configured (HTTP API and CLI only)"))
    if cfg.home.targets:
        problems = home_problems(cfg.home.targets, cfg.platforms.accounts())
        verdicts.append(
            ("home", "fail", "; ".join(problems))
            if problems
            else ("home", "ok", ", ".join(cfg.home.targets))
        )
    verdicts.append(skills_check(cfg))
    colors = {"ok": "green", "warn": "yellow", "fail": "red"}
    redact = current_redactor()
    for name, verdict, detail in verdicts:
        console.print(f"[{colors[verdict]}]{verdict.upper():4}[/] {name}: ", end="")
        console.print(redact(detail), markup=False)
    if any(v == "fail" for _, v, _ in verdicts):
        raise typer.Exit(1)


def _check_state_dir(path: Path) -> tuple[str, str, str]:
    """The state directory's verdict; creates nothing (a missing one is reported)."""
    if not path.exists():
        if _creatable(path):
            return ("state_dir", "warn", f"none yet at {path}: `herald run` creates it")
        return ("state_dir", "fail", f"cannot create {path}: its parent is not writable")
    try:
        with tempfile.NamedTemporaryFile(dir=path):
            pass
    except OSError as err:
        return ("state_dir", "fail", f"{path} is not writable: {err.strerror}")
    return ("state_dir", "ok", str(path))


async def _async_checks(cfg: HeraldConfig) -> list[tuple[str, str, str]]:
    out = [await _database_check(cfg.effective_database_url)]
    out.extend(await _platform_checks(cfg))
    out.extend(await _mcp_checks(cfg))
    if cfg.memory.provider != "none":
        out.append(await memory_check(cfg))
    verdict, detail = await check_llm(cfg.llm)
    out.append(("llm", FAIL if verdict == REFUSED else verdict, detail))
    for name, profile in cfg.profiles.items():
        if profile.llm:  # a model of its own (else the default's, checked above)
            verdict, detail = await check_llm(cfg.profile_llm(name))
            out.append((f"profiles.{name}.llm", FAIL if verdict == REFUSED else verdict, detail))
    if cfg.speech.enabled:
        out.append(("speech", *(await check_speech(cfg))))
    return out


async def _database_check(url: str) -> tuple[str, str, str]:
    """The database's verdict; creates nothing (a missing SQLite file is reported)."""
    path = engine.sqlite_file(url)
    if path is not None and not path.exists():
        if _creatable(path.parent):
            return (
                "database",
                "warn",
                f"none yet at {path}: `herald run` (or `herald db upgrade`) creates it",
            )
        return ("database", "fail", f"cannot create {path}: {path.parent} is not writable")
    try:
        async with Store.open(url, migrate=False) as store:
            await store.ping()
            current = await engine.current_revision(store.engine)
            dialect = store.dialect
    except HeraldError as err:
        return ("database", "fail", str(err))
    except Exception as err:
        return ("database", "fail", f"unreachable: {type(err).__name__}: {err}")
    head = engine.head_revision()
    if current == head:
        return ("database", "ok", f"{dialect}, schema {current}")
    if current is not None and not engine.known_revision(current):
        return (
            "database",
            "fail",
            f"upgraded by a newer Herald (revision {current}; this one knows up to {head}): "
            "upgrade Herald or restore a backup",
        )
    return (
        "database",
        "warn",
        f"{dialect}, schema {current} (newest {head}): "
        "run `herald db upgrade` or start the daemon to migrate",
    )


def _creatable(directory: Path) -> bool:
    """Whether `directory` exists and is writable, or could be made in the nearest
    existing ancestor."""
    for candidate in (directory, *directory.parents):
        if candidate.exists():
            return candidate.is_dir() and os.access(candidate, os.W_OK | os.X_OK)
    return False


async def _platform_checks(cfg: HeraldConfig) -> list[tuple[str, str, str]]:
    """Each enabled account's credentials, checked against its platform (named by its
    config key: `platforms.<name>`, or `platforms.<name>.accounts.<account>`)."""
    out: list[tuple[str, str, str]] = []
    for (name, account), section in cfg.platforms.accounts().items():
        verdict, detail = await check_platform(name, section, cfg.state_dir)
        key = section_key(cfg.platforms, name, account)
        out.append((key, FAIL if verdict == REFUSED else verdict, detail))
    return out


async def _mcp_checks(cfg: HeraldConfig) -> list[tuple[str, str, str]]:
    """Each enabled MCP server: started (or reached) and its tools listed, then stopped."""
    from agent_core.mcp.server import MCPServer  # noqa: PLC0415 - the SDK only when needed
    from agent_core.mcp.status import ServerState  # noqa: PLC0415

    out: list[tuple[str, str, str]] = []
    for name, server in cfg.mcp.enabled().items():
        status = await MCPServer(name, server).check(PLATFORM_CHECK_TIMEOUT)
        if status.state is ServerState.READY:
            out.append((f"mcp.{name}", "ok", f"{status.transport}, {status.tools} tools"))
        else:
            why = status.error or str(status.state)
            out.append((f"mcp.{name}", "fail", f"{status.transport}, not ready: {why}"))
    return out


def main() -> None:
    """The console script entry point."""
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    app()
