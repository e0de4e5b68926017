"""Typer apps whose help reads plainly: no `<bool>` after a flag, arguments as `KEY`.

Typer's own help marks every flag with its Python type and every required argument as
`{name}`; these classes leave the flag's type out and name arguments in capitals.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption


def _tidy(params: list[Any]) -> list[Any]:
    for param in params:
        if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""  # a flag takes no value: show no type
        elif isinstance(param, TyperArgument) and param.metavar is None:
            param.metavar = (param.name or "value").upper()
    return params


def _usage(params: list[Any]) -> list[str]:
    pieces = ["[OPTIONS]"] if any(isinstance(p, TyperOption) for p in params) else []
    for param in params:
        if isinstance(param, TyperArgument):
            name = param.metavar or (param.name or "value").upper()
            name = name if param.required else f"[{name}]"
            pieces.append(name + ("..." if param.nargs != 1 else ""))
    return pieces


class HeraldCommand(TyperCommand):
    """A command whose help shows no type after flags and arguments as `KEY`."""

    def get_params(self, ctx: Any) -> list[Any]:
        """The command's parameters, tidied for help."""
        return _tidy(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """`[OPTIONS] KEY [OTHER]...` instead of Typer's `{key}`."""
        return _usage(self.get_params(ctx))


class HeraldGroup(TyperGroup):
    """A group whose own options show no type after flags."""

    def get_params(self, ctx: Any) -> list[Any]:
        """The group's parameters, tidied for help."""
        return _tidy(super().get_params(ctx))


class HeraldTyper(typer.Typer):
    """A Typer app of Herald: its group and commands render plain help."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("cls", HeraldGroup)
        super().__init__(**kwargs)

    def command(self, *args: Any, **kwargs: Any) -> Callable[[Any], Any]:
        """Register a command (a HeraldCommand unless `cls` says otherwise)."""
        kwargs.setdefault("cls", HeraldCommand)
        return super().command(*args, **kwargs)
