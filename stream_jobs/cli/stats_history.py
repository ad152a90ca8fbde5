"""`stream-jobs stats TYPE --history 1h|24h|7d`: one type's history (docs/history.md) as a
table, or every window as one JSON document."""

from __future__ import annotations

from datetime import UTC, datetime

from rich import box
from rich.console import Console, Group
from rich.table import Table

from stream_jobs.errors import ConfigError
from stream_jobs.history.reader import read_view
from stream_jobs.history.store import HistoryStore
from stream_jobs.history.view import HistoryRow, HistoryView, span_name
from stream_jobs.settings import Settings

_ROW_NAMES = {"1h": "5 min", "24h": "hour", "7d": "day"}


def checked_window(window: str, job_type: str | None, *, watch: bool,
                   partitions: bool) -> str:
    """The span asked for, or a ConfigError saying what is wrong with the command."""
    try:
        span_name(window)
    except ValueError as exc:
        raise ConfigError(f"--history: {exc}.") from exc
    if job_type is None:
        raise ConfigError(f"--history shows one type: `stream-jobs stats TYPE --history "
                          f"{window}`.")
    if watch or partitions:
        raise ConfigError("--history reads past windows once: drop --watch and --partitions.")
    return window


async def read_history(settings: Settings, job_type: str, window: str) -> HistoryView:
    store = HistoryStore(settings)
    try:
        return await read_view(store, job_type, window)
    finally:
        await store.close()


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:g}ms" if value < 1 else f"{value:g}s"


def _start(row: HistoryRow, window: str) -> str:
    """The row's start in UTC, short enough for 80 columns: the date is in the title."""
    when = datetime.fromtimestamp(row.start_ms / 1000, UTC)
    shape = "%m-%d" if window == "7d" else "%H:%M:%S" if row.size_s % 60 else "%H:%M"
    return when.strftime(shape) + ("*" if row.open else "")


def _cells(row: HistoryRow, outcomes: list[str]) -> list[str]:
    ratio = row.failure_ratio
    return [*(f"{row.tally.outcomes.get(name, 0):,}" for name in outcomes),
            "-" if ratio is None else f"{ratio:.1%}", f"{row.per_min:,.1f}",
            *(_seconds(row.tally.duration_s(q)) for q in (0.5, 0.95, 0.99)),
            *(_seconds(row.tally.dwell_s(q)) for q in (0.5, 0.95))]


def render_history(view: HistoryView) -> Group | str:
    """The table of `view` with a totals line; a sentence when the span is empty."""
    note = view.note()
    if note is not None:
        return f"[yellow]{note}[/]"
    outcomes = view.outcome_names()
    since = datetime.fromtimestamp(view.since_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M")
    table = Table(title=f"{view.job_type}: last {view.window} (since {since} UTC), a row "
                        f"per {_ROW_NAMES[view.window]}", box=box.SIMPLE_HEAD,
                  padding=(0, 0), show_edge=False)
    table.add_column("from", no_wrap=True)
    # Two-line headers: with succeeded, retried and dead_lettered the table fits 80 columns.
    for column in (*(name.replace("_", "\n") for name in outcomes), "failed", "jobs\n/min",
                   "run\np50", "run\np95", "run\np99", "wait\np50", "wait\np95"):
        table.add_column(column, justify="right")
    rows = view.table_rows()
    for i, row in enumerate(rows):
        table.add_row(_start(row, view.window), *_cells(row, outcomes),
                      end_section=i == len(rows) - 1)
    table.add_row("total", *_cells(view.totals(), outcomes), style="bold")
    return Group(table, f"[dim]* still open. Run: run duration; wait: dwell (due to "
                        f"start); percentiles are bucket bounds. `--json` gives every "
                        f"{view.size_s} s window.[/]")


def print_history(console: Console, view: HistoryView) -> None:
    console.print(render_history(view), highlight=False, soft_wrap=True)


__all__ = ["checked_window", "print_history", "read_history", "render_history"]
