"""`herald memory …`: the external memory provider, from the command line.

`status` shows the provider, whether it answers, and the sync queue (queued and dead syncs);
`test "query" --user U` shows what recall would put in that person's turn. `herald doctor`
runs `memory_check`.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from agent_core.memory import MemoryFiles
from agent_core.memory_providers.base import MemoryProvider, MemoryRejected, MemoryUnavailable
from agent_core.memory_providers.recall import fence, is_trivial
from gateway.cli.base import load
from gateway.cli.help import HeraldTyper
from gateway.cli.output import Column, JsonOption, Kind, print_json, print_rows
from gateway.config import HeraldConfig
from gateway.contracts.errors import ConfigError
from gateway.contracts.ids import UserId
from gateway.memory_sync import build_provider, describe_age
from gateway.store import Store
from gateway.store import memory_sync as sql
from gateway.store.memory_docs import SqlMemoryDocs

memory_app = HeraldTyper(
    help="The external memory provider (Honcho, Mem0): status and a test recall.",
    no_args_is_help=True,
)

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML config file (default: $HERALD_CONFIG)."),
]
CHECK_TIMEOUT = 15.0


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _fail(message: str, code: int = 1) -> typer.Exit:
    Console(stderr=True, highlight=False).print(f"[red]error:[/] {escape(message)}")
    return typer.Exit(code)


async def reachability(provider: MemoryProvider) -> tuple[str, str]:
    """(`ok` | `unreachable` | `refused`, detail) of a provider (entered here, then left)."""
    started = time.monotonic()
    try:
        async with asyncio.timeout(CHECK_TIMEOUT), provider:
            await provider.ping()
    except TimeoutError:
        return "unreachable", f"no answer within {CHECK_TIMEOUT:g} s"
    except MemoryRejected as err:
        return "refused", str(err)
    except MemoryUnavailable as err:
        return "unreachable", str(err)
    except Exception as err:
        return "unreachable", f"{type(err).__name__}: {err}"
    return "ok", f"answers ({(time.monotonic() - started) * 1000:.0f} ms)"


async def memory_check(cfg: HeraldConfig) -> tuple[str, str, str]:
    """`herald doctor`'s verdict on the memory provider."""
    try:
        provider = build_provider(cfg.memory, cfg.state_dir)
    except ConfigError as err:
        return ("memory", "fail", str(err))
    if provider is None:
        return ("memory", "ok", "no external provider (memory.provider: none)")
    state, detail = await reachability(provider)
    verdict = {"ok": "ok", "unreachable": "warn", "refused": "fail"}[state]
    if state == "unreachable":
        detail += " (turns go on without recall; syncs wait in the queue)"
    return ("memory", verdict, f"{provider.name}: {detail}")


@memory_app.command("status")
def memory_status(
    config: ConfigOption = None,
    json_: JsonOption = False,
    dead: Annotated[int, typer.Option(min=0, help="How many dead syncs to list.")] = 10,
) -> None:
    """The provider, whether it answers, and the sync queue (queued and dead syncs)."""
    cfg = load(config)
    console = _console()

    async def go() -> None:
        provider = build_provider(cfg.memory, cfg.state_dir)
        state, detail = "-", "no external provider (memory.provider: none)"
        if provider is not None:
            state, detail = await reachability(provider)
        async with (
            Store.open(cfg.effective_database_url, create=False) as store,
            store.read() as conn,
        ):
            counts = await sql.counts(conn)
            rows = await sql.dead(conn, dead) if dead else []
        if json_:
            print_json(
                [
                    {
                        "provider": cfg.memory.provider,
                        "reachable": state,
                        "detail": detail,
                        "queued": counts.queued,
                        "dead": counts.dead,
                        "oldest_queued": counts.oldest_queued,
                        "dead_syncs": [_dead_json(r) for r in rows],
                    }
                ]
            )
            return
        console.print(f"provider: {escape(cfg.memory.provider)}")
        console.print(f"reachable: {escape(state)} ({escape(detail)})")
        console.print(
            f"queued syncs: {counts.queued} (oldest waiting {describe_age(counts.oldest_queued)})"
        )
        console.print(f"dead syncs: {counts.dead}")
        if rows:
            console.print()
            print_rows(
                console,
                [
                    Column("id", Kind.NUMBER),
                    Column("person", Kind.ID),
                    Column("kind", Kind.ID),
                    Column("queued (UTC)"),
                    Column("tries", Kind.NUMBER),
                    Column("last error"),
                ],
                [
                    [
                        str(r.id),
                        r.person,
                        str(r.kind),
                        f"{r.created_at:%Y-%m-%d %H:%M}",
                        str(r.attempts),
                        r.last_error or "",
                    ]
                    for r in rows
                ],
            )

    asyncio.run(go())


def _dead_json(row: sql.SyncRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "person": row.person,
        "kind": str(row.kind),
        "session_key": row.session_key,
        "created_at": row.created_at,
        "dead_at": row.dead_at,
        "attempts": row.attempts,
        "last_error": row.last_error,
    }


@memory_app.command("test")
def memory_test(
    query: Annotated[str, typer.Argument(help="A message, as the person would send it.")],
    user: Annotated[
        str,
        typer.Option(
            "--user",
            "-u",
            help="The person: a Herald user id (u_…, see `herald users list`) or an identity "
            "platform:id.",
        ),
    ],
    config: ConfigOption = None,
) -> None:
    """What recall would put in this person's turn for QUERY (read-only)."""
    cfg = load(config)
    console = _console()

    async def go() -> None:
        provider = build_provider(cfg.memory, cfg.state_dir)
        if provider is None:
            raise _fail("memory.provider is none: there is no external memory to ask", 2)
        async with Store.open(cfg.effective_database_url, create=False) as store:
            person = await _person(store, user)
        if is_trivial(query):
            console.print("note: a turn skips recall for this message (it is trivial)")
        async with provider:
            started = time.monotonic()
            try:
                async with asyncio.timeout(CHECK_TIMEOUT):
                    text = await provider.prefetch(person, query, session_key="cli:test")
            except (TimeoutError, MemoryUnavailable, MemoryRejected) as err:
                raise _fail(f"{provider.name}: {err or 'no answer in time'}") from err
            took = time.monotonic() - started
        limit = cfg.memory.recall_timeout
        console.print(
            f"{provider.name} answered for {escape(person)} in {took:.2f} s"
            + (
                f" (over memory.recall_timeout {limit:g} s: a turn would not wait)"
                if took > limit
                else ""
            )
        )
        if not text.strip():
            console.print("nothing recalled")
            return
        console.print(fence(text, provider.name), markup=False)

    asyncio.run(go())


async def _person(store: Store, value: str) -> UserId:
    """The Herald user `value` names (a user id, or `platform:id` of one of their
    identities); exit 2 when there is none (nothing is created)."""
    users = await store.list_users()
    for user_id, _name, identities in users:
        if user_id == value or any(f"{p}:{i}" == value for p, i in identities):
            return user_id
    raise _fail(f"no user {value!r}: see `herald users list`", 2)


@memory_app.command("soul")
def memory_soul(
    set_: Annotated[
        Path | None,
        typer.Option("--set", help="Make this file the persona (SOUL.md) of every instance."),
    ] = None,
    default: Annotated[
        bool, typer.Option("--default", help="Go back to the built-in persona.")
    ] = False,
    config: ConfigOption = None,
) -> None:
    """Show the persona (SOUL.md), kept in the database; `--set FILE` replaces it (every
    instance uses it within 2 s), `--default` brings back the built-in one."""
    cfg = load(config)
    console = _console()
    if set_ is not None and default:
        raise _fail("give --set FILE or --default, not both", 2)
    text: str | None = None
    if set_ is not None:
        try:
            text = set_.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise _fail(f"cannot read {set_}: {err}", 2) from err
        if not text.strip():
            raise _fail(f"{set_} is empty; use --default for the built-in persona", 2)
    elif default:
        text = ""

    async def go() -> None:
        async with Store.open(cfg.effective_database_url, create=text is not None) as store:
            memory = MemoryFiles(SqlMemoryDocs(store))
            if text is not None:
                await memory.set_soul(text)
            console.print(await memory.soul(), markup=False)

    asyncio.run(go())
