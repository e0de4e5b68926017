"""What every `herald` command shares: loading the config, logging with secrets redacted,
and turning any failure into one line on stderr with the right exit code.

Exit codes: 0 done; 1 a failure that may pass (a server that does not answer, a failed
check); 2 a configuration or environment error that a restart cannot mend (systemd's
`RestartPreventExitStatus=2` then stops restarting).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from sqlalchemy.exc import DBAPIError
from typer.exceptions import TyperException

from gateway.cli.help import HeraldGroup as PlainGroup
from gateway.config import HeraldConfig, load_config
from gateway.contracts.errors import ConfigError, HeraldError
from gateway.redact import RedactingFilter, Redactor, install, secrets_of

DEBUG = "herald.debug"
"""`ctx.meta` key: `--debug` was given."""
EXIT_FAILED = 1
EXIT_SETUP = 2

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Environment errors of the machine (not of the network): the operator has to act.
_SETUP_ERRNOS = frozenset(
    {
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.ENOENT,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.EEXIST,
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EADDRINUSE,
        errno.EADDRNOTAVAIL,
        errno.EMFILE,
        errno.ENFILE,
    }
)


@dataclass(frozen=True, slots=True)
class Failure:
    """What to tell the operator about an error, and the exit code."""

    line: str
    code: int


def explain(err: BaseException) -> Failure:
    """The one line (problem and fix) and exit code for an error that ended a command."""
    if isinstance(err, BaseExceptionGroup):
        leaves = [e for e in _leaves(err) if not isinstance(e, asyncio.CancelledError)]
        if leaves:
            return explain(leaves[0])
    if isinstance(err, ConfigError):
        return Failure(str(err), EXIT_SETUP)
    if isinstance(err, HeraldError):
        return Failure(str(err), EXIT_FAILED)
    if isinstance(err, OSError):
        what = f"{err.strerror}: {err.filename}" if err.strerror and err.filename else str(err)
        if err.errno in _SETUP_ERRNOS:
            return Failure(f"{what}; fix the path or permission it names", EXIT_SETUP)
        return Failure(f"{what}; try again later", EXIT_FAILED)
    if isinstance(err, DBAPIError):
        return Failure(f"database error: {err.orig}; see `herald doctor`", EXIT_FAILED)
    return Failure(
        f"unexpected {type(err).__name__}: {err} (run `herald --debug ...` for the traceback)",
        EXIT_FAILED,
    )


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for err in group.exceptions:
        out.extend(_leaves(err) if isinstance(err, BaseExceptionGroup) else [err])
    return out


class HeraldGroup(PlainGroup):
    """The top-level command group: any error a command lets out becomes one line on stderr
    (redacted) and an exit code; the traceback only with `--debug`."""

    def invoke(self, ctx: Any) -> Any:  # typer's (vendored) click Context
        """Run the command; report an escaping error as `error: ...` and exit 1 or 2."""
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, TyperException):
            raise
        except Exception as err:
            redact = current_redactor()
            failure = explain(err)
            stderr = Console(stderr=True, highlight=False, soft_wrap=True)
            if ctx.meta.get(DEBUG):
                text = "".join(traceback.format_exception(err))
                stderr.print(redact(text), markup=False, end="")
            stderr.print(f"[red]error:[/] {escape(redact(failure.line))}")
            raise typer.Exit(failure.code) from err


def load(path: Path | None, *, log_level: str | None = "WARNING") -> HeraldConfig:
    """The config (exit 2 with the problem on stderr when it is invalid), with logging set up
    at `log_level` (None: the config's `log_level`; `--debug` set DEBUG already) and every
    secret of the config redacted from logs and from error lines."""
    try:
        cfg = load_config(path)
    except ConfigError as err:
        Console(stderr=True, highlight=False).print(f"[red]error:[/] {escape(str(err))}")
        raise typer.Exit(EXIT_SETUP) from err
    redactor = Redactor(secrets_of(cfg, cfg.effective_database_url))
    configure_logging(log_level or cfg.log_level, redactor)
    return cfg


def configure_logging(level: str, redactor: Redactor) -> None:
    """Log to stderr at `level` with `redactor` applied to every record. Where logging is
    already set up (Herald embedded, or under pytest), only the redaction is added."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(handler)
        root.setLevel(level)
    install(redactor, root=root)


def current_redactor() -> Redactor:
    """The redactor `load` installed for the loaded config (before that, one that knows only
    the credential patterns)."""
    for handler in logging.getLogger().handlers:
        for found in handler.filters:
            if isinstance(found, RedactingFilter):
                return found.redactor
    return Redactor()
