"""`stream-jobs history`: the history process (docs/history.md).

A faust-streaming app that folds the workers' reports into per-type windows, exactly
once, and keeps them in Postgres for `stats TYPE --history`, the gateway's
`/types/{type}/history` and the dashboard's charts. Run one per prefix (more wait as
standbys: the reports topic has one partition); `serve --history` runs it inside the
gateway instead, for a single box.
"""

from __future__ import annotations

import asyncio
import signal

import typer
from rich.console import Console

from stream_jobs import logs
from stream_jobs.cli.common import (
    KAFKA_LOG_LEVEL_OPTION,
    LOG_FORMAT_OPTION,
    LOG_LEVEL_OPTION,
    LogLevel,
    app,
    run_fast,
    settings_of,
)

console = Console(stderr=True)


@app.command("history")
def history(
    ctx: typer.Context,
    log_level: LogLevel = LOG_LEVEL_OPTION,
    kafka_log_level: LogLevel | None = KAFKA_LOG_LEVEL_OPTION,
    log_format: str | None = LOG_FORMAT_OPTION,
) -> None:
    """Keep every type's history (jobs by outcome per minute for 7 days and per hour for
    90, with duration and dwell percentiles) until SIGTERM or Ctrl-C. Exits 1 if the app
    stops on an error: start it again (its state is in Kafka; nothing is counted twice)."""
    settings = settings_of(ctx, log_format=log_format, kafka_log_level=kafka_log_level)
    logs.configure(log_format=settings.log_format, level=log_level,
                   kafka_level=settings.kafka_log_level)

    from stream_jobs.history.process import run_history  # faust: only for this command

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        console.print(f"history of prefix [bold]{settings.topic_prefix}[/] into schema "
                      f"[bold]{settings.database_schema}[/]; Ctrl-C stops")
        await run_history(settings, stop)

    run_fast(main())
    console.print("history stopped")
