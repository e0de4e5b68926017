"""What list commands print: a table that fits the terminal, or records, or `--json`.

Cells are plain text, never Rich markup: what comes from the database is shown as it is.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

JsonOption = Annotated[
    bool, typer.Option("--json", help="Print JSON (an array of objects) instead of a table.")
]

TEXT_WIDTH = 40
"""Free-text columns wrap at this width."""


class Kind(StrEnum):
    """How a column behaves when space is short."""

    ID = "id"
    """Never wrapped nor cut: it is meant to be copied."""
    TEXT = "text"
    """Wrapped at word boundaries (at most TEXT_WIDTH wide)."""
    NUMBER = "number"
    """Right-aligned, never wrapped."""


@dataclass(frozen=True, slots=True)
class Column:
    """A column's header and how it behaves."""

    header: str
    kind: Kind = Kind.TEXT


def print_json(rows: Sequence[dict[str, Any]]) -> None:
    """Write `rows` to stdout as one JSON array (datetimes as ISO 8601 strings)."""

    def default(value: Any) -> str:
        if isinstance(value, datetime):
            return value.isoformat()
        return str(value)

    typer.echo(json.dumps(list(rows), default=default, ensure_ascii=False, indent=2))


def print_rows(
    console: Console,
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    *,
    title: str | None = None,
) -> None:
    """A table when it fits the console's width with no value cut; else one record per row,
    its first column on a line of its own and the other fields below it."""
    widths = _widths(columns, rows, console.width)
    if widths is None:
        if title:
            console.print(Text(title, style="italic"))
        for row in rows:
            console.print(Text(row[0], style="bold"))
            fields = [
                Text(f"{column.header}: ", style="dim") + Text(cell)
                for column, cell in zip(columns[1:], row[1:], strict=True)
                if cell
            ]
            console.print(Text("  ") + Text("   ").join(fields))
        return
    table = Table(
        box=None,
        pad_edge=False,
        header_style="bold underline",
        title=title,
        title_justify="left",
    )
    for column, width in zip(columns, widths, strict=True):
        table.add_column(
            column.header,
            width=width,
            no_wrap=column.kind is not Kind.TEXT,
            justify="right" if column.kind is Kind.NUMBER else "left",
        )
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    console.print(table)


GAP = 2
"""Spaces between two columns."""


def _widths(
    columns: Sequence[Column], rows: Sequence[Sequence[str]], space: int
) -> list[int] | None:
    """Each column's width, or None when the columns cannot fit `space` uncut: text columns
    may wrap down to their longest word, the others keep their full width."""
    natural: list[int] = []
    least: list[int] = []
    for n, column in enumerate(columns):
        cells = [column.header, *(row[n] for row in rows)]
        full = max(cell_len(c) for c in cells)
        if column.kind is Kind.TEXT:
            full = min(full, TEXT_WIDTH)
            word = max((cell_len(w) for c in cells for w in c.split()), default=1)
            least.append(min(full, word))
        else:
            least.append(full)
        natural.append(full)
    free = space - GAP * (len(columns) - 1) - sum(least)
    if free < 0:
        return None
    widths = list(least)
    for n in range(len(columns)):  # left to right, each text column grows to its full width
        grow = min(free, natural[n] - widths[n])
        widths[n] += grow
        free -= grow
    return widths
