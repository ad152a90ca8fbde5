"""`stream-jobs enqueue TYPE JSON`: one job by hand, for trying things out."""

from __future__ import annotations

import asyncio

import orjson
import typer
from rich.console import Console

from stream_jobs.cli.common import app, settings_of
from stream_jobs.client import Job, JobClient
from stream_jobs.durations import parse_duration
from stream_jobs.errors import PayloadError
from stream_jobs.job_ids import checked_job_id, checked_key
from stream_jobs.job_types import load_job_types
from stream_jobs.tenants import checked_tenant
from stream_jobs.unique.rules import Enqueued, key_claim

console = Console()
err_console = Console(stderr=True)


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
    tenant: str | None = typer.Option(None, help="The customer the job is for (ctx.tenant), "
                                      "e.g. acme: 1 to 128 bytes, no control characters."),
    unique_key: str | None = typer.Option(None, help="Send nothing while a job holding this "
                                          "key is pending (its ID is printed instead)."),
    unique_for: str | None = typer.Option(None, help="Hold the unique key at least this long "
                                          "after the enqueue, e.g. 10m."),
    debounce: str | None = typer.Option(None, help="Of the key's jobs in this window only the "
                                        "last runs, when it ends, e.g. 30s."),
) -> None:
    """Enqueue one job and print its ID once the broker has it (with --unique-key or
    --debounce: once the key and the job are committed to the outbox)."""
    settings = settings_of(ctx)
    # The client's rules, applied before anything connects.
    if job_id is not None:
        checked_job_id(job_id, "--job-id")
    if key is not None:
        checked_key(key, "--key")
    checked_tenant(tenant)
    try:
        body = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise PayloadError(f"The payload is not JSON: {exc}.") from exc
    if not isinstance(body, dict):
        raise PayloadError("The payload must be a JSON object, e.g. '{\"to\": \"a@b.c\"}'.")
    types = load_job_types(settings.topics_dir)

    job = Job(job_type, body, key=key, job_id=job_id, priority=priority,
              delay=parse_duration(delay) if delay else None,
              expires_in=parse_duration(expires_in) if expires_in else None, tenant=tenant)
    claim = key_claim(unique_key=unique_key,
                      unique_for=parse_duration(unique_for) if unique_for else None,
                      debounce=parse_duration(debounce) if debounce else None,
                      key=key, delay=job.delay)

    async def send() -> str:
        async with JobClient(settings, types) as client:
            if claim is not None:
                return await client.enqueue_keyed(job, claim)
            return await client.enqueue(job_type, body, key=key, priority=priority,
                                        job_id=job_id, delay=job.delay,
                                        expires_in=job.expires_in, tenant=tenant)

    sent = asyncio.run(send())
    console.print(sent)
    if isinstance(sent, Enqueued) and not sent.sent:
        err_console.print(f"not sent: job {sent} holds the unique key {unique_key!r}")
    elif isinstance(sent, Enqueued) and sent.superseded:
        err_console.print(f"supersedes job {sent.superseded} of the same debounce window")
