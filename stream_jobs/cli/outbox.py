"""`stream-jobs outbox relay` and `stream-jobs outbox status`: the transactional outbox.

Every `stream-jobs worker` runs a relay already (unless STREAM_JOBS_OUTBOX_RELAY=false);
this command runs one on its own, e.g. beside web servers that enqueue with `conn=` while
no worker of theirs runs, or as the only relay when workers have theirs turned off.
"""

from __future__ import annotations

import asyncio
import signal

import orjson
import typer
from rich.console import Console

from stream_jobs import logs
from stream_jobs.cli.common import (
    KAFKA_LOG_LEVEL_OPTION,
    LOG_FORMAT_OPTION,
    LOG_LEVEL_OPTION,
    LogLevel,
    run_fast,
    settings_of,
)
from stream_jobs.cli.tables import (
    WIDE_OPTION,
    FittedTable,
    job_id_column,
    number_column,
    print_table,
    text_column,
)
from stream_jobs.outbox.depth import FailingRow, OutboxDepth, failing_rows, read_depth
from stream_jobs.outbox.relay import OutboxRelay
from stream_jobs.plurals import counted

console = Console(stderr=True)
out = Console()
outbox_app = typer.Typer(help="The transactional outbox: its relay and what waits in it.",
                         no_args_is_help=True)


@outbox_app.command("relay")
def relay(
    ctx: typer.Context,
    batch: int | None = typer.Option(None, "--batch", min=1, max=10_000,
                                     envvar="STREAM_JOBS_OUTBOX_BATCH_MAX",
                                     help="Rows claimed per round (default 500)."),
    until_idle: bool = typer.Option(False, "--until-idle",
                                    help="Exit once a round finds nothing to send."),
    log_level: LogLevel = LOG_LEVEL_OPTION,
    kafka_log_level: LogLevel | None = KAFKA_LOG_LEVEL_OPTION,
    log_format: str | None = LOG_FORMAT_OPTION,
) -> None:
    """Move committed outbox rows to Kafka until SIGTERM or Ctrl-C (the round in flight
    finishes first). Any number may run: they share the rows (FOR UPDATE SKIP LOCKED)."""
    settings = settings_of(ctx, outbox_batch_max=batch, log_format=log_format,
                           kafka_log_level=kafka_log_level)
    logs.configure(log_format=settings.log_format, level=log_level,
                   kafka_level=settings.kafka_log_level)
    relay = OutboxRelay(settings)

    async def main() -> None:
        if until_idle:
            async with relay:
                await relay.drain()
            return
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        console.print(f"outbox relay for schema [bold]{settings.database_schema}[/] to "
                      f"{settings.kafka_bootstrap}; Ctrl-C stops")
        await relay.run(stop)

    run_fast(main())
    console.print(f"stopped: {counted(relay.moved, 'row')} moved to Kafka")


@outbox_app.command("status")
def status(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    limit: int = typer.Option(20, "--limit", min=1, help="Failing rows listed at most."),
    wide: bool = WIDE_OPTION,
) -> None:
    """Rows waiting in the outbox, the age of the oldest, and the rows whose write to
    Kafka failed (with the error; a relay retries them)."""
    settings = settings_of(ctx)

    async def read() -> tuple[OutboxDepth, list[FailingRow]]:
        return await read_depth(settings), await failing_rows(settings, limit)

    depth, rows = asyncio.run(read())
    if as_json:
        document = {**depth.to_dict(), "failing": [
            {"id": r.id, "topic": r.topic, "job_id": r.job_id, "attempts": r.attempts,
             "created_at": r.created_at.isoformat(),
             "retry_at": r.retry_at.isoformat() if r.retry_at else None,
             "last_error": r.last_error} for r in rows]}
        out.print_json(orjson.dumps(document).decode())
        return
    age = "-" if depth.oldest_age_s is None else f"{depth.oldest_age_s:.1f}s"
    out.print(f"outbox in schema {depth.schema}: {counted(depth.depth, 'row')} waiting, "
              f"oldest {age}, {depth.retrying:,} retrying", highlight=False)
    if rows:
        print_table(out, failing_table(rows, wide=wide), wide=wide)


# At 80 columns each failing row's job, its attempts and last error; --wide adds the row's
# id, its topic and when it is retried.
_FAILING_COLUMNS = (number_column("id", wide=True), text_column("topic", wide=True),
                    job_id_column(), number_column("attempts"),
                    text_column("retry at (UTC)", wide=True), text_column("last error"))


def failing_table(rows: list[FailingRow], *, wide: bool) -> FittedTable:
    table = FittedTable(_FAILING_COLUMNS, wide=wide,
                        title="rows whose write failed (oldest first)")
    for r in rows:
        table.add_row(str(r.id), r.topic, r.job_id or "-", str(r.attempts),
                      r.retry_at.strftime("%H:%M:%S") if r.retry_at else "-",
                      r.last_error or "")
    return table
