"""`herald skills …`: the skills on disk and the writes recorded in the database.

Shared skills live in `<state_dir>/skills/`; the agent's own, per person, beside their
memory files. Installing, removing and sharing act on the files at once (a running daemon
sees them in its next sessions); `approve` applies a write the agent asked for while
`skills.write_approval` is on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from agent_core.memory import person
from agent_core.skills.install import install_folder, quarantined
from agent_core.skills.model import (
    Skill,
    SkillAction,
    SkillError,
    SkillWrite,
    WriteStatus,
)
from agent_core.skills.scanner import reveal
from agent_core.skills.service import Actor, Author, Request, Skills
from gateway.cli.base import load
from gateway.cli.help import HeraldTyper
from gateway.cli.output import Column, JsonOption, Kind, print_json, print_rows
from gateway.config import HeraldConfig
from gateway.contracts.ids import UserId
from gateway.store import Store
from gateway.store.skills import SkillWrites

skills_app = HeraldTyper(help="Manage skills (procedures the agent follows).", no_args_is_help=True)

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML config file (default: $HERALD_CONFIG)."),
]
UserOption = Annotated[
    str | None,
    typer.Option("--user", "-u", help="A Herald user id or identity (platform:id)."),
]


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _fail(message: str, code: int = 1) -> typer.Exit:
    Console(stderr=True, highlight=False).print(f"[red]error:[/] {escape(message)}")
    return typer.Exit(code)


def _skills(cfg: HeraldConfig, store: Store | None) -> Skills:
    from gateway.supervisor import build_skills  # noqa: PLC0415 - the daemon's wiring, lazily

    skills = build_skills(cfg, store)
    if skills is None:
        raise _fail("skills are turned off (skills.enabled: false)")
    return skills


def _with_skills(
    config: Path | None,
    work: Callable[[Skills], Awaitable[None]],
    *,
    database: bool = True,
    create: bool = False,
) -> None:
    """Run `work` with the configured skills; their journal is the database's unless
    `database` is False. Unless `create`, a database that does not exist yet is an error
    naming where it was looked for (exit 2), never created empty."""
    cfg = load(config)

    async def go() -> None:
        if not database:
            await work(_skills(cfg, None))
            return
        async with Store.open(cfg.effective_database_url, create=create) as store:
            skills = _skills(cfg, store)
            await skills.sync.refresh()
            await work(skills)

    asyncio.run(go())


def owner_of(user: str) -> str:
    """The memory owner of a user id (`u-…`); a `u-…` / `g-…` owner is taken as it is."""
    if user.startswith(("u-", "g-")):
        return user
    return person(UserId(user))


async def resolve_owner(user: str, skills: Skills) -> str:
    """The memory owner named by USER: a Herald user id, an identity `platform:id` (looked
    up in the database), or a memory owner (`u-…`, `g-…`) as it is."""
    if user.startswith(("u-", "g-")) or ":" not in user:
        return owner_of(user)
    platform, _, external = user.partition(":")
    journal = skills.journal
    if not isinstance(journal, SkillWrites):
        raise _fail(f"cannot look up {user!r} without the database")
    for user_id, _name, identities in await journal.store.list_users():
        if (platform, external) in identities:
            return person(user_id)
    raise _fail(f"no Herald user has the identity {user!r} (see `herald users list`)")


def _status(skill: Skill) -> str:
    """`ok`, or the verdict with its reasons: `invalid: …`, `flagged: …`, `refused: …`."""
    reason = skill.problem or skill.quarantine
    return f"{skill.verdict}: {reason}" if reason else skill.verdict


@skills_app.command("list")
def skills_list(config: ConfigOption = None, json_: JsonOption = False) -> None:
    """Every skill with the scanner's verdict: ok, flagged or refused (with the reasons), or
    invalid; flagged and refused ones are never shown to the model."""
    console = _console()

    async def work(skills: Skills) -> None:
        found = [*skills.store.everything(), *quarantined(skills.store)]
        if json_:
            print_json(
                [
                    {
                        "name": s.name,
                        "category": s.category,
                        "source": str(s.source),
                        "owner": s.owner,
                        "status": "invalid"
                        if s.problem
                        else "quarantined"
                        if s.quarantine
                        else "ok",
                        "verdict": s.verdict,
                        "reason": s.problem or s.quarantine,
                        "description": s.description,
                        "path": str(s.path),
                    }
                    for s in found
                ]
            )
            return
        if not found:
            console.print("no skills")
            return
        rows = [
            [s.name, s.category or "-", str(s.source), s.owner or "everyone", _status(s)]
            for s in found
        ]
        print_rows(
            console,
            [
                Column("name", Kind.ID),
                Column("category", Kind.ID),
                Column("source", Kind.ID),
                Column("seen by", Kind.ID),
                Column("status"),
            ],
            rows,
        )

    _with_skills(config, work, database=False)


async def _find(skills: Skills, name: str, user: str | None) -> Skill:
    owner = await resolve_owner(user, skills) if user else None
    candidates = [*(skills.store.personal(owner) if owner else []), *skills.store.everything()]
    candidates += quarantined(skills.store)
    for skill in candidates:
        if skill.name == name:
            return skill
    raise _fail(f"no skill named {name!r} (see `herald skills list`)")


@skills_app.command("show")
def skills_show(
    name: str,
    file: Annotated[str | None, typer.Option(help="A supporting file to show instead.")] = None,
    user: UserOption = None,
    config: ConfigOption = None,
) -> None:
    """Print a skill's SKILL.md (or one of its files), whoever it belongs to; characters a
    reader cannot see are written out as <U+XXXX>."""

    async def work(skills: Skills) -> None:
        skill = await _find(skills, name, user)
        try:
            text = reveal(skills.store.read(skill, file))  # hidden characters written out
        except SkillError as err:
            raise _fail(str(err)) from err
        typer.echo(text, nl=not text.endswith("\n"))

    _with_skills(config, work, database=user is not None and ":" in user)


@skills_app.command("install")
def skills_install(
    path: Path,
    category: Annotated[str | None, typer.Option(help="A category folder to put it in.")] = None,
    config: ConfigOption = None,
) -> None:
    """Install a skill folder as a shared skill, scanned first (flagged: quarantined)."""
    console = _console()

    async def work(skills: Skills) -> None:
        try:
            async with skills.sync.writing():
                done = install_folder(skills.store, path, category)
        except SkillError as err:
            raise _fail(str(err)) from err
        if done.change is None:
            raise _fail(
                f"skill {done.name!r} was quarantined ({done.path}), not installed: "
                f"{done.quarantine}",
            )
        if skills.journal is not None:
            await skills.journal.record(
                SkillWrite(done.change, str(Author.OPERATOR), WriteStatus.APPLIED)
            )
        console.print(f"installed skill {done.name!r} at {done.path}", markup=False)

    _with_skills(config, work, create=True)


@skills_app.command("rm")
def skills_rm(name: str, user: UserOption = None, config: ConfigOption = None) -> None:
    """Delete a shared skill (or, with --user, a person's own).

    A deleted bundled skill stays deleted through upgrades.
    """
    console = _console()

    async def work(skills: Skills) -> None:
        actor = Actor(await resolve_owner(user, skills) if user else None, Author.OPERATOR)
        try:
            text = await skills.manage(Request(SkillAction.DELETE, name), actor)
        except SkillError as err:
            raise _fail(str(err)) from err
        console.print(text, markup=False)

    _with_skills(config, work, create=True)


@skills_app.command("share")
def skills_share(
    user: Annotated[str, typer.Argument(help="A Herald user id, or one of its identities.")],
    name: str,
    config: ConfigOption = None,
) -> None:
    """Share USER's skill NAME with everyone (it becomes an operator skill).

    Read it first: a skill written from someone's conversation can carry their data.
    """
    console = _console()

    async def work(skills: Skills) -> None:
        try:
            shared = await skills.share(await resolve_owner(user, skills), name)
        except SkillError as err:
            raise _fail(str(err)) from err
        console.print(f"shared skill {name!r}: now at {shared.path}", markup=False)

    _with_skills(config, work, create=True)


def _write_rows(writes: list[SkillWrite]) -> list[list[str]]:
    return [
        [
            str(w.id),
            w.change.skill,
            str(w.change.action),
            w.change.file_path,
            w.change.owner or "everyone",
            w.author,
            f"{w.created_at:%Y-%m-%d %H:%M}" if w.created_at else "-",
            "-" if w.turn_id is None else str(w.turn_id),
        ]
        for w in writes
    ]


@skills_app.command("pending")
def skills_pending(config: ConfigOption = None, json_: JsonOption = False) -> None:
    """The agent's skill writes waiting for approval (`skills.write_approval`)."""
    console = _console()

    async def work(skills: Skills) -> None:
        assert skills.journal is not None
        writes = await skills.journal.writes(status=WriteStatus.PENDING)
        if json_:
            print_json(
                [
                    {
                        "id": w.id,
                        "skill": w.change.skill,
                        "action": str(w.change.action),
                        "file": w.change.file_path,
                        "owner": w.change.owner,
                        "author": w.author,
                        "created_at": w.created_at,
                        "turn_id": w.turn_id,
                    }
                    for w in writes
                ]
            )
            return
        if not writes:
            console.print("no pending skill writes")
            return
        print_rows(
            console,
            [
                Column("id", Kind.NUMBER),
                Column("skill", Kind.ID),
                Column("action", Kind.ID),
                Column("file", Kind.ID),
                Column("seen by", Kind.ID),
                Column("by", Kind.ID),
                Column("when (UTC)", Kind.ID),
                Column("turn", Kind.NUMBER),
            ],
            _write_rows(writes),
        )

    _with_skills(config, work)


@skills_app.command("diff")
def skills_diff(write_id: int, config: ConfigOption = None) -> None:
    """The diff of a recorded (or pending) skill write."""

    async def work(skills: Skills) -> None:
        assert skills.journal is not None
        try:
            write = await skills.journal.get(write_id)
        except LookupError as err:
            raise _fail(str(err)) from err
        typer.echo(write.change.diff() or "(no change)", nl=False)

    _with_skills(config, work)


@skills_app.command("approve")
def skills_approve(write_id: int, config: ConfigOption = None) -> None:
    """Apply a pending skill write."""
    console = _console()

    async def work(skills: Skills) -> None:
        try:
            text = await skills.approve(write_id)
        except (SkillError, LookupError) as err:
            raise _fail(str(err)) from err
        console.print(f"approved #{write_id}: {text}", markup=False)

    _with_skills(config, work)


@skills_app.command("reject")
def skills_reject(write_id: int, config: ConfigOption = None) -> None:
    """Refuse a pending skill write (nothing is written)."""
    console = _console()

    async def work(skills: Skills) -> None:
        try:
            await skills.reject(write_id)
        except (SkillError, LookupError) as err:
            raise _fail(str(err)) from err
        console.print(f"rejected #{write_id}", markup=False)

    _with_skills(config, work)


def doctor_check(cfg: HeraldConfig) -> tuple[str, str, str]:
    """`herald doctor`'s verdict on skills: those failing validation or quarantined."""
    from gateway.supervisor import build_skills  # noqa: PLC0415 - the daemon's wiring

    skills = build_skills(cfg, None)
    if skills is None:
        return ("skills", "ok", "turned off")
    found = skills.store.everything()
    bad = [s for s in found if not s.usable] + quarantined(skills.store)
    missing = [str(d) for d in skills.store.dirs if not d.is_dir()]
    if not bad and not missing:
        return ("skills", "ok", f"{len(found)} valid")
    parts = [f"{s.name} ({s.path}): {_status(s)}" for s in bad]
    parts += [f"skills.dirs folder {d} does not exist" for d in missing]
    return ("skills", "warn", f"{len(found) - len(bad)} valid; " + "; ".join(parts))
