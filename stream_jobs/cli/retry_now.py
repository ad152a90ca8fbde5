"""`stream-jobs retry-now JOB_ID [--type TYPE]`: a job waiting in a delay tier runs now."""

from __future__ import annotations

import asyncio
import sys

import orjson
import typer
from rich.console import Console

from stream_jobs.cli.common import app, settings_of
from stream_jobs.job_types import get_job_type, load_job_types
from stream_jobs.lookup import DEFAULT_MAX_RECORDS_PER_TOPIC
from stream_jobs.tools.retry_now import retry_now

console = Console()


@app.command("retry-now")
def retry_now_command(
    ctx: typer.Context,
    job_id: str = typer.Argument(..., metavar="JOB_ID", help="The ID enqueue returned."),
    job_type: str | None = typer.Option(None, "--type", "-t", help="Look for the job in "
                                        "this type's topics only (default: every type)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    max_records: int = typer.Option(DEFAULT_MAX_RECORDS_PER_TOPIC, "--max-records", min=1,
                                    help="Records read per topic at most, to find the job."),
) -> None:
    """Run a job that waits in a delay tier (a retry, or a delayed enqueue) now instead of
    at its due time, once. A copy of its waiting attempt is written to its lane and the
    attempt is recorded as released early, so the relay does not release the original
    and workers skip it. A job that is done, running, pending, dead-lettered or not found
    is refused with a sentence saying so (exit code 1)."""
    settings = settings_of(ctx)
    types = load_job_types(settings.topics_dir)
    if job_type is not None:
        get_job_type(types, job_type)
    done = asyncio.run(retry_now(settings, types, job_id, job_type=job_type,
                                 max_records_per_topic=max_records))
    if as_json:
        sys.stdout.write(orjson.dumps(done.to_dict()).decode() + "\n")
        return
    console.print(f"[bold yellow]retried now[/] {done.summary()}", highlight=False,
                  soft_wrap=True)
