"""`stream-jobs cancel TYPE JOB_ID [--reason TEXT]`: stop a job that has not finished."""

from __future__ import annotations

import asyncio
import sys

import orjson
import typer
from rich.console import Console

from stream_jobs.cli.common import app, settings_of
from stream_jobs.job_types import get_job_type, load_job_types
from stream_jobs.lookup import DEFAULT_MAX_RECORDS_PER_TOPIC
from stream_jobs.tools.cancel import cancel_job

console = Console()


@app.command("cancel")
def cancel(
    ctx: typer.Context,
    job_type: str = typer.Argument(..., metavar="TYPE"),
    job_id: str = typer.Argument(..., metavar="JOB_ID", help="The ID enqueue returned."),
    reason: str | None = typer.Option(None, "--reason", help="Why, kept with the cancel "
                                      "(shown by `stream-jobs job`)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    max_records: int = typer.Option(DEFAULT_MAX_RECORDS_PER_TOPIC, "--max-records", min=1,
                                    help="Records read per topic at most, to find the job."),
) -> None:
    """Cancel a job: it never starts, wherever it waits (a lane, a delay tier, a delayed
    enqueue), and a run in progress is interrupted. A job that already finished is left
    as it is and the answer says so; an ID that is not found is an error (exit code 1)."""
    settings = settings_of(ctx)
    types = load_job_types(settings.topics_dir)
    get_job_type(types, job_type)
    answer = asyncio.run(cancel_job(settings, types, job_id, job_type=job_type, reason=reason,
                                    max_records_per_topic=max_records))
    if as_json:
        sys.stdout.write(orjson.dumps({
            "job_id": answer.job_id, "job_type": answer.job_type, "answer": answer.answer,
            "changed": answer.changed, "reason": answer.reason,
            "summary": answer.summary()}).decode() + "\n")
        return
    style = "yellow" if answer.changed else "dim"
    console.print(f"[bold {style}]{answer.answer}[/] {answer.summary()}", highlight=False,
                  soft_wrap=True)
