"""`stream-jobs enqueue TYPE JSON`: one job by hand, for trying things out."""

from __future__ import annotations

import asyncio

import orjson
import typer
from rich.console import Console

from stream_jobs.cli.common import app, settings_of
from stream_jobs.client import JobClient
from stream_jobs.durations import parse_duration
from stream_jobs.errors import PayloadError
from stream_jobs.job_types import load_job_types

console = Console()


@app.command("enqueue")
def enqueue(
    ctx: typer.Context,
    job_type: str = typer.Argument(..., metavar="TYPE"),
    payload: str = typer.Argument(..., metavar="JSON", help="The payload, a JSON object."),
    key: str | None = typer.Option(None, help="Partition key (default: the job ID)."),
    priority: str = typer.Option("default", help="Lane: high, default or low."),
    delay: str | None = typer.Option(None, help="Run no sooner than this from now, e.g. 30s."),
    expires_in: str | None = typer.Option(None, help="Drop the job if not run by then, e.g. 1h."),
    job_id: str | None = typer.Option(None, help="Give the job ID (default: a new UUIDv7)."),
) -> None:
    """Enqueue one job and print its ID once the broker has it."""
    settings = settings_of(ctx)
    try:
        body = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise PayloadError(f"The payload is not JSON: {exc}.") from exc
    if not isinstance(body, dict):
        raise PayloadError("The payload must be a JSON object, e.g. '{\"to\": \"a@b.c\"}'.")
    types = load_job_types(settings.topics_dir)

    async def send() -> str:
        async with JobClient(settings, types) as client:
            return await client.enqueue(
                job_type, body, key=key, priority=priority, job_id=job_id,
                delay=parse_duration(delay) if delay else None,
                expires_in=parse_duration(expires_in) if expires_in else None)

    console.print(asyncio.run(send()))
