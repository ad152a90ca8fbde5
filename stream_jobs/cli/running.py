"""`stream-jobs running [TYPE]` and `stream-jobs workers [TYPE]`: what runs now, and the
live worker processes, as their latest reports in P._stats tell
(`stream_jobs.tools.running`)."""

from __future__ import annotations

import asyncio
import sys

import orjson
import typer
from rich import box
from rich.console import Console
from rich.table import Table

from stream_jobs.cli.common import app, settings_of
from stream_jobs.job_types import get_job_type, load_job_types
from stream_jobs.plurals import counted
from stream_jobs.tools.running import RunningView
from stream_jobs.tools.worker_reports import read_running

console = Console()
WIDE_COLUMNS = 240  # what --wide may take at most, whatever the terminal's width

_TYPE = typer.Argument(None, metavar="TYPE", show_default=False,
                       help="One job type (default: every declared type).")
_JSON = typer.Option(False, "--json", help="Print one JSON document (for scripts).")


def _view(ctx: typer.Context, job_type: str | None) -> RunningView:
    settings = settings_of(ctx)
    types = load_job_types(settings.topics_dir)
    if job_type is not None:
        get_job_type(types, job_type)  # an unknown type is one sentence, before any I/O
    return asyncio.run(read_running(settings, types, job_type=job_type))


def _print_json(view: RunningView) -> None:
    sys.stdout.write(orjson.dumps(view.to_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")


def _for(seconds: float) -> str:
    """A running time: "12 s", "4 min 05 s", "2 h 10 min"."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def _no_workers(view: RunningView) -> bool:
    """Say so when no worker of the scope is live (True: nothing else to show)."""
    if view.workers:
        return False
    scope = f" of type {view.job_type}" if view.job_type else ""
    console.print(f"No worker{scope} is live: none reported in P._stats within three of "
                  "its report intervals. Start one with `stream-jobs worker APP`.",
                  highlight=False, soft_wrap=True)
    return True


def _print(table: Table, wide: bool) -> None:
    """The table in the terminal's width; with --wide, as wide as its cells need (a
    narrow terminal wraps the lines instead of the cells)."""
    if not wide:
        console.print(table)
        return
    for column in table.columns:
        column.no_wrap = True
    Console(width=max(console.width, WIDE_COLUMNS)).print(table)


def _freshness(view: RunningView) -> str:
    ages = view.report_age_s()
    assert ages is not None  # only asked with live workers
    return (f"{counted(len(view.workers), 'live worker')}; their reports are "
            f"{ages[0]:.0f}-{ages[1]:.0f} s old")


@app.command("running")
def running(
    ctx: typer.Context,
    job_type: str | None = _TYPE,
    wide: bool = typer.Option(False, "--wide", help="Add the worker, the lane topic, the "
                              "partition and the offset of each job."),
    as_json: bool = _JSON,
) -> None:
    """The jobs in live workers' handlers now, longest running first: job ID, type,
    attempt and how long it has run. Read from each live worker's latest report, which
    lists its 50 oldest running jobs and is a few seconds old at most."""
    view = _view(ctx, job_type)
    if as_json:
        _print_json(view)
        return
    if _no_workers(view):
        return
    jobs = view.jobs
    if not jobs:
        console.print(f"Nothing is running ({_freshness(view)}).", highlight=False,
                      soft_wrap=True)
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("job ID", no_wrap=True)
    table.add_column("type", overflow="fold")
    table.add_column("attempt", justify="right", no_wrap=True)
    table.add_column("running for", justify="right", no_wrap=True)
    if wide:
        for column in ("worker", "topic", "part", "offset"):
            table.add_column(column, overflow="fold",
                             justify="right" if column in ("part", "offset") else "left")
    for row in jobs:
        cells = [row.job.job_id, row.job_type, str(row.job.attempt),
                 _for(row.running_for_s(view.at_ms))]
        if wide:
            cells += [row.worker_id, row.job.topic, str(row.job.partition), str(row.job.offset)]
        table.add_row(*cells)
    _print(table, wide)
    more = f"; {view.unlisted} more running, not listed" if view.unlisted else ""
    console.print(f"{counted(view.running_count, 'job')} running ({_freshness(view)}{more}).",
                  highlight=False, soft_wrap=True)


@app.command("workers")
def workers(
    ctx: typer.Context,
    job_type: str | None = _TYPE,
    wide: bool = typer.Option(False, "--wide", help="Add the lane partitions held and the "
                              "oldest running job's ID."),
    as_json: bool = _JSON,
) -> None:
    """The live worker processes: host and pid, the types they run, how many lane
    partitions they hold, jobs in flight, the oldest running job's time, how old their
    latest report is, and the stream-jobs version. Read from the reports in P._stats."""
    view = _view(ctx, job_type)
    if as_json:
        _print_json(view)
        return
    if _no_workers(view):
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for column in ("host", "pid", "types", "parts", "in flight", "oldest", "report",
                   "version"):
        table.add_column(column, overflow="fold",
                         justify="left" if column in ("host", "types", "version") else "right")
    if wide:
        table.add_column("partitions", overflow="fold")
        table.add_column("oldest job", no_wrap=True)
    for process in view.processes:
        oldest = process.oldest
        cells = [process.host or process.key, str(process.pid or "-"),
                 ", ".join(process.types), str(len(process.partitions)),
                 str(process.in_flight),
                 "-" if oldest is None else _for(oldest.running_for_s(view.at_ms)),
                 f"{process.report_age_s(view.at_ms):.0f} s ago",
                 process.version or "-"]
        if wide:
            cells += [" ".join(f"{topic}/{part}" for topic, part in process.partitions),
                      "-" if oldest is None else oldest.job.job_id]
        table.add_row(*cells)
    _print(table, wide)
    console.print(f"{counted(len(view.processes), 'process', 'processes')}, "
                  f"{_freshness(view)}.", highlight=False, soft_wrap=True)


__all__ = ["running", "workers"]
