"""`stream-jobs running [TYPE]` and `stream-jobs workers [TYPE]`: what runs now, and the
live worker processes, as their latest reports in P._stats tell
(`stream_jobs.tools.running`)."""

from __future__ import annotations

import asyncio
import sys

import orjson
import typer
from rich.console import Console

from stream_jobs.cli.common import app, settings_of
from stream_jobs.cli.tables import (
    FittedTable,
    job_id_column,
    number_column,
    print_table,
    text_column,
    word_column,
)
from stream_jobs.job_types import get_job_type, load_job_types
from stream_jobs.plurals import counted
from stream_jobs.tools.running import RunningView
from stream_jobs.tools.worker_reports import read_running

console = Console()

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


def _freshness(view: RunningView) -> str:
    ages = view.report_age_s()
    assert ages is not None  # only asked with live workers
    return (f"{counted(len(view.workers), 'live worker')}; their reports are "
            f"{ages[0]:.0f}-{ages[1]:.0f} s old")


_RUNNING_COLUMNS = (job_id_column(), text_column("type"), number_column("attempt"),
                    number_column("running for"), text_column("worker", wide=True),
                    text_column("topic", wide=True), number_column("part", wide=True),
                    number_column("offset", wide=True))


def running_table(view: RunningView, *, wide: bool) -> FittedTable:
    """The running jobs, longest first; --wide adds where each runs."""
    table = FittedTable(_RUNNING_COLUMNS, wide=wide)
    for row in view.jobs:
        table.add_row(row.job.job_id, row.job_type, str(row.job.attempt),
                      _for(row.running_for_s(view.at_ms)), row.worker_id, row.job.topic,
                      str(row.job.partition), str(row.job.offset))
    return table


_WORKER_COLUMNS = (text_column("host"), number_column("pid"), text_column("types"),
                   number_column("parts", wide=True), number_column("in flight"),
                   number_column("oldest"), word_column("report"),
                   word_column("version", wide=True), text_column("partitions", wide=True),
                   job_id_column("oldest job", wide=True))


def workers_table(view: RunningView, *, wide: bool) -> FittedTable:
    """One row per live worker process; --wide adds its partitions and oldest job."""
    table = FittedTable(_WORKER_COLUMNS, wide=wide)
    for process in view.processes:
        oldest = process.oldest
        table.add_row(process.host or process.key, str(process.pid or "-"),
                      ", ".join(process.types), str(len(process.partitions)),
                      str(process.in_flight),
                      "-" if oldest is None else _for(oldest.running_for_s(view.at_ms)),
                      f"{process.report_age_s(view.at_ms):.0f} s ago", process.version or "-",
                      " ".join(f"{topic}/{part}" for topic, part in process.partitions),
                      "-" if oldest is None else oldest.job.job_id)
    return table


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
    print_table(console, running_table(view, wide=wide), wide=wide)
    more = f"; {view.unlisted} more running, not listed" if view.unlisted else ""
    console.print(f"{counted(view.running_count, 'job')} running ({_freshness(view)}{more}).",
                  highlight=False, soft_wrap=True)


@app.command("workers")
def workers(
    ctx: typer.Context,
    job_type: str | None = _TYPE,
    wide: bool = typer.Option(False, "--wide", help="Add the lane partitions held (their "
                              "count and names), the version and the oldest running job's "
                              "ID."),
    as_json: bool = _JSON,
) -> None:
    """The live worker processes: host and pid, the types they run, jobs in flight, the
    oldest running job's time and how old their latest report is (--wide: the lane
    partitions they hold and the stream-jobs version). Read from the reports in
    P._stats."""
    view = _view(ctx, job_type)
    if as_json:
        _print_json(view)
        return
    if _no_workers(view):
        return
    print_table(console, workers_table(view, wide=wide), wide=wide)
    console.print(f"{counted(len(view.processes), 'process', 'processes')}, "
                  f"{_freshness(view)}.", highlight=False, soft_wrap=True)


__all__ = ["running", "running_table", "workers", "workers_table"]
