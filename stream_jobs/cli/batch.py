"""`stream-jobs batch ID`: where a batch or a chain stands; `stream-jobs batch --open` lists
the ones not finished yet.

Read from the workflow's row, whose counters move in each member's finish transaction
(stream_jobs/workflows/progress.py), so the figures are exact at the moment of reading.
"""

from __future__ import annotations

import asyncio
import sys

import orjson
import typer
from rich.console import Console
from rich.table import Table

from stream_jobs.cli.common import settings_of
from stream_jobs.cli.tables import (
    JOB_ID_WIDTH,
    WIDE_OPTION,
    FittedTable,
    job_id_column,
    number_column,
    print_table,
    word_column,
)
from stream_jobs.workflows.members import step_job_id
from stream_jobs.workflows.progress import Progress, open_workflows, read_progress

console = Console()

_STYLE = {"running": "yellow", "succeeded": "green", "completed": "cyan", "failed": "red"}


def batch(
    ctx: typer.Context,
    workflow_id: str | None = typer.Argument(None, metavar="ID",
                                             help="The ID client.batch or client.chain "
                                                  "returned."),
    show_open: bool = typer.Option(False, "--open", help="List the batches and chains not "
                                                          "finished yet, oldest first."),
    limit: int = typer.Option(20, "--limit", min=1, help="With --open: rows shown at most."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    wide: bool = WIDE_OPTION,
) -> None:
    """Where a batch or chain stands: a batch's members succeeded, failed and pending and
    which callbacks were written; a chain's current step, or the step that was
    dead-lettered and why."""
    if show_open:
        _list_open(ctx, limit, as_json, wide=wide)
        return
    if workflow_id is None:
        raise typer.BadParameter("give a batch or chain ID, or --open")
    found = asyncio.run(read_progress(settings_of(ctx), workflow_id))
    if as_json:
        sys.stdout.write(orjson.dumps(found.to_dict(), option=orjson.OPT_INDENT_2).decode()
                         + "\n")
        return
    console.print(f"[bold {_STYLE.get(found.state, 'white')}]{found.state}[/] "
                  f"{found.summary()}", highlight=False, soft_wrap=True)
    console.print(progress_table(found))


def progress_table(found: Progress) -> Table:
    table = Table(title=f"{found.kind} {found.workflow_id}", show_header=False)
    table.add_column("", no_wrap=True)
    # Callbacks and steps are named by their job IDs: never folded.
    table.add_column("", overflow="fold", min_width=JOB_ID_WIDTH)
    done = found.finished_at.isoformat(timespec="seconds") if found.finished_at else "-"
    rows = [("created", found.created_at.isoformat(timespec="seconds")), ("finished", done)]
    if found.kind == "batch":
        rows += [("members", f"{found.total:,}"), ("succeeded", f"{found.succeeded:,}"),
                 ("failed", f"{found.failed:,}"), ("pending", f"{found.pending:,}")]
        rows += [(slot, f"{job_id} ({'written' if found.fired(slot) else 'waiting'})")
                 for slot, job_id in found.callbacks]
    else:
        rows += [("steps", f"{found.total:,}"), ("succeeded", f"{found.succeeded:,}")]
        if found.failed_step is not None:
            rows += [("failed step", f"{found.failed_step} "
                                     f"({step_job_id(found.workflow_id, found.failed_step)})"),
                     ("failure", found.failure or "")]
        elif found.pending:
            rows.append(("current step", f"{found.succeeded} "
                                         f"({step_job_id(found.workflow_id, found.succeeded)})"))
    if found.parent_job_id:
        rows.append(("started by job", found.parent_job_id))
    for name, value in rows:
        table.add_row(name, value)
    return table


def _list_open(ctx: typer.Context, limit: int, as_json: bool, *, wide: bool) -> None:
    count, found = asyncio.run(open_workflows(settings_of(ctx), limit))
    if as_json:
        document = {"open": count, "workflows": [p.to_dict() for p in found]}
        sys.stdout.write(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    print_table(console, open_table(count, found, wide=wide), wide=wide)


# At 80 columns the IDs, done of all and failed (the rest is pending); --wide adds when each
# was created and the pending count.
_OPEN_COLUMNS = (job_id_column("id"), word_column("kind"),
                 word_column("created (UTC)", wide=True), number_column("done"),
                 number_column("failed"), number_column("pending", wide=True))


def open_table(count: int, found: list[Progress], *, wide: bool) -> FittedTable:
    table = FittedTable(_OPEN_COLUMNS, wide=wide, title=f"{count:,} open batches and chains")
    for p in found:
        table.add_row(p.workflow_id, p.kind, p.created_at.isoformat(timespec="seconds"),
                      f"{p.succeeded:,}/{p.total:,}", f"{p.failed:,}", f"{p.pending:,}")
    return table
