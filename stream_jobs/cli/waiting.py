"""`stream-jobs waiting TYPE [--state S] [--after CURSOR] [--limit N]`: a type's jobs by
state, a page at a time, as the dashboard's tabs show them (`stream_jobs.waiting`)."""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime

import orjson
import typer
from rich.console import Console
from rich.text import Text

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
from stream_jobs.settings import Settings
from stream_jobs.waiting import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    DeadJobs,
    DeadPage,
    State,
    WaitingPage,
    page_size,
    state_named,
    waiting_page,
)

console = Console()


@app.command("waiting")
def waiting(
    ctx: typer.Context,
    job_type: str = typer.Argument(..., metavar="TYPE"),
    state: str = typer.Option("pending", "--state", metavar="pending|scheduled|retrying|dead",
                              help="Which jobs: waiting in the lanes (or running), delayed "
                              "enqueues or retries waiting in the delay tiers, or dead."),
    after: str | None = typer.Option(None, "--after", metavar="CURSOR",
                                     help="Go on from the cursor the previous page printed."),
    limit: int = typer.Option(DEFAULT_PAGE_SIZE, "--limit", min=1, max=MAX_PAGE_SIZE,
                              help="Jobs on the page."),
    wide: bool = typer.Option(False, "--wide", help="Every column: partition and offset, "
                              "age, the last error or the reason's details."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """List a type's jobs in one state, oldest first (due first in the delay tiers, newest
    failure first for dead jobs), a page at a time. A page of the lanes or tiers reads
    about a page of records whatever the backlog; a page of dead jobs reads the type's
    DLQ. The cursor of the next page is printed under it."""
    settings = settings_of(ctx)
    try:
        chosen = state_named(state)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--state") from exc
    listing = asyncio.run(_page(settings, job_type, chosen, after, page_size(limit)))
    if as_json:
        sys.stdout.write(orjson.dumps(listing.to_dict()).decode() + "\n")
        return
    print_table(console, waiting_table(listing, wide=wide), wide=wide)
    _footer(listing)


async def _page(settings: Settings, job_type: str, state: State, after: str | None,
                size: int) -> WaitingPage | DeadPage:
    policy = get_job_type(load_job_types(settings.topics_dir), job_type)
    if state == "dead":
        return await DeadJobs().page(settings, policy, after=after, size=size)
    return await waiting_page(settings, policy, state, after=after, size=size)


def _short_time(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%m-%d %H:%M:%S")


def _age(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


_DEAD_COLUMNS = (job_id_column(), text_column("reason"), word_column("failed (UTC)"),
                 number_column("requeues", wide=True), number_column("letters", wide=True),
                 word_column("at", wide=True))


def waiting_table(listing: WaitingPage | DeadPage, *, wide: bool) -> FittedTable:
    """A page of jobs: a dead job's reason; a waiting job's attempt, lane or tier and
    time (enqueued in a lane, due in a tier), and with --wide its age, position and (a
    retry) last error."""
    if isinstance(listing, DeadPage):
        table = FittedTable(_DEAD_COLUMNS, wide=wide)
        for dead in listing.rows:
            table.add_row(dead.job_id or "(no ID)", Text(dead.reason),
                          _short_time(dead.failed_at_ms), str(dead.requeues),
                          str(dead.letters), f"{dead.partition}/{dead.offset}")
        return table
    pending = listing.state == "pending"
    columns = [job_id_column(), number_column("attempt"),
               word_column("lane" if pending else "tier"),
               word_column("enqueued (UTC)" if pending else "due (UTC)"),
               number_column("age", wide=True), word_column("at", wide=True)]
    retrying = listing.state == "retrying"
    if retrying:
        columns.append(text_column("last error", wide=True))
    table = FittedTable(columns, wide=wide)
    for row in listing.rows:
        at = (row.enqueued_at_ms or row.timestamp_ms) if pending else row.due_ms
        failure = row.failure
        error = [Text(f"{failure.error_class}: {failure.message}" if failure else "-")]
        table.add_row(row.job_id, str(row.attempt), Text(row.place), _short_time(at),
                      _age(row.age_s(listing.at_ms)), f"{row.partition}/{row.offset}",
                      *(error if retrying else ()))
    return table


def _footer(listing: WaitingPage | DeadPage) -> None:
    shown = (f"{listing.first:,}-{listing.first + len(listing.rows) - 1:,}"
             if listing.rows else "none")
    where = {"pending": "waiting or running in the lanes", "dead": "dead jobs"}.get(
        listing.state, "waiting in the delay tiers (scheduled and retrying)")
    if not listing.rows and not listing.total:
        console.print(f"None: 0 {where}.", highlight=False)
        return
    console.print(f"{shown} of {listing.total:,} {where}; {listing.records_read:,} records "
                  "read.", highlight=False, soft_wrap=True)
    if listing.more_may_follow:
        console.print("The page stopped at its read cap: more may follow.", highlight=False)
    if listing.next_cursor:
        # On a line of its own, never wrapped: a cursor is copied whole.
        console.print(f"Next page: --state {listing.state} --after", highlight=False)
        console.print(listing.next_cursor, highlight=False, soft_wrap=True)


__all__ = ["waiting", "waiting_table"]
