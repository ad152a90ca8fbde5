"""Tables that fit a terminal: by default the columns an operator needs, within 80 columns;
with `--wide`, every column. `--json` is each command's own and never depends on these.

The rule, in one place: a job ID is never wrapped or cut (its column is as wide as the
ID and never wraps); free text (topics, messages, errors) folds in its cell; numbers, times
and states stay on one line; headers are short words, so rich never cuts one ("retried…").
A table too wide for the terminal squeezes its folding columns first. With --wide a table
is as wide as its columns need, whatever the terminal's width (nothing is squeezed or cut:
the terminal wraps the long lines, `less -S` scrolls them), printed by `print_table`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import typer
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table

# The terminal every table is made for without --wide (what a terminal opens at).
TERMINAL_COLUMNS = 80
# A job ID (a UUIDv7 in its canonical form): its column never gets narrower.
JOB_ID_WIDTH = 36
# Wider than any table: what a --wide table is measured within.
_UNBOUNDED = 100_000

WIDE_OPTION: Any = typer.Option(
    False, "--wide", help=f"Show every column (by default a table shows the columns that fit "
    f"{TERMINAL_COLUMNS} columns; --json has everything).")


@dataclass(frozen=True)
class Column:
    """One column of a table: how it is headed, aligned and wrapped, and whether it waits
    for --wide."""

    header: str
    justify: Literal["left", "right"] = "left"
    wide: bool = False  # shown with --wide only
    fold: bool = False  # long text folds in its cell; otherwise it stays on one line
    job_id: bool = False  # whole on one line, always

    def rich_options(self) -> dict[str, Any]:
        if self.job_id:
            return {"justify": self.justify, "no_wrap": True, "min_width": JOB_ID_WIDTH}
        if self.fold:
            return {"justify": self.justify, "overflow": "fold"}
        return {"justify": self.justify, "no_wrap": True}


def job_id_column(header: str = "job ID", *, wide: bool = False) -> Column:
    return Column(header, wide=wide, job_id=True)


def number_column(header: str, *, wide: bool = False) -> Column:
    return Column(header, justify="right", wide=wide)


def text_column(header: str, *, wide: bool = False) -> Column:
    return Column(header, wide=wide, fold=True)


def word_column(header: str, *, wide: bool = False) -> Column:
    """A short word or a time ("batch", "yes", "2026-03-29 03:00:00"): one line."""
    return Column(header, wide=wide)


class FittedTable:
    """A rich table of `columns` without the --wide ones unless `wide`; rows are given
    every cell, and the hidden columns' cells are dropped."""

    def __init__(self, columns: Sequence[Column], *, wide: bool, **table_options: Any) -> None:
        self.wide = wide
        self._shown = [wide or not column.wide for column in columns]
        self.table = Table(**table_options)
        for column, shown in zip(columns, self._shown, strict=True):
            if shown:
                self.table.add_column(column.header, **column.rich_options())

    def add_row(self, *cells: RenderableType | None, **row_options: Any) -> None:
        if len(cells) != len(self._shown):
            raise ValueError(f"a row of {len(cells)} cells for {len(self._shown)} columns")
        self.table.add_row(*(cell for cell, shown in zip(cells, self._shown, strict=True)
                             if shown), **row_options)

    def _natural(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options.update_width(_UNBOUNDED), self.table)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        if self.wide:
            return self._natural(console, options)
        return Measurement.get(console, options, self.table)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self.wide:
            natural = self._natural(console, options).maximum
            if natural > options.max_width:
                self.table.width = natural
        yield self.table


def print_table(console: Console, renderable: RenderableType, *, wide: bool) -> None:
    """Print a table (or a group of them): with --wide, lines wider than the terminal are
    printed whole rather than cut at its edge."""
    console.print(renderable, crop=not wide)


__all__ = [
    "JOB_ID_WIDTH",
    "TERMINAL_COLUMNS",
    "WIDE_OPTION",
    "Column",
    "FittedTable",
    "job_id_column",
    "number_column",
    "print_table",
    "text_column",
    "word_column",
]
