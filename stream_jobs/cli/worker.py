"""`stream-jobs worker APP --type T` and `stream-jobs db migrate`."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from stream_jobs import logs
from stream_jobs.app import App, load_app
from stream_jobs.cli.common import app, run_fast, settings_of
from stream_jobs.dedup.store import DedupStore

if TYPE_CHECKING:
    from stream_jobs.runtime.worker import Worker

console = Console(stderr=True)
db_app = typer.Typer(help="The dedup database.", no_args_is_help=True)


@app.command("worker")
def worker(
    ctx: typer.Context,
    app_spec: str = typer.Argument(..., metavar="APP", help="MODULE:ATTR of a stream_jobs.App."),
    job_type: str = typer.Option(..., "--type", "-t", help="The job type this worker runs."),
    until_idle: bool = typer.Option(False, "--until-idle",
                                    help="Exit once lanes and tiers are drained."),
    shadow: bool = typer.Option(False, "--shadow", help="Run nothing: read the lanes in "
                                "group T.shadow and count what is there (see `stats`)."),
    log_level: str = typer.Option("INFO", "--log-level", envvar="STREAM_JOBS_LOG_LEVEL"),
    log_format: str | None = typer.Option(
        None, "--log-format", envvar="STREAM_JOBS_LOG_FORMAT",
        help="text (fields as key=value after the message) or json (one object a line)."),
    metrics_port: int | None = typer.Option(
        None, "--metrics-port", envvar="STREAM_JOBS_METRICS_PORT",
        help="Serve Prometheus metrics on this port (0: off)."),
) -> None:
    """Run one type's handlers (group T.worker) and its delay relay (group T.relay).

    SIGTERM or SIGINT drains: no new jobs start, running ones get a grace period,
    finished offsets are committed.
    """
    settings = settings_of(ctx, metrics_port=metrics_port, log_format=log_format)
    logs.configure(log_format=settings.log_format, level=log_level)
    logging.getLogger("aiokafka").propagate = True  # a worker's log wants the driver's view
    job_app = load_app(app_spec)
    job_app.use_settings(settings)
    if shadow:
        _shadow(job_app, job_type, until_idle)
        return

    async def main() -> Worker:
        # aiokafka's clients must be created on the running loop, so the worker is too.
        runner = job_app.worker(job_type)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, runner.request_stop)
        console.print(f"worker for [bold]{job_type}[/] on {settings.kafka_bootstrap} "
                      f"(group {runner.group_id}); Ctrl-C drains and stops")
        metrics = None
        if settings.metrics_port:
            from stream_jobs.runtime.metrics import serve_metrics, worker_registry

            metrics = await serve_metrics(worker_registry(runner), settings.metrics_host,
                                          settings.metrics_port)
        try:
            await runner.run(until_idle=until_idle)
        finally:
            if metrics is not None:
                metrics.close()
        return runner

    runner = run_fast(main())
    totals = ", ".join(f"{k} {v}" for k, v in sorted(runner.outcomes.items())) or "no jobs"
    console.print(f"stopped: {totals}")


def _shadow(job_app: App, job_type: str, until_idle: bool) -> None:
    from stream_jobs.runtime.shadow import Shadow

    policy = job_app.job_type(job_type)
    # The model check needs the handler; an app without one still counts what decodes.
    handler = job_app.handlers.get(job_type)

    async def main() -> Shadow:
        runner = Shadow(job_app.settings, policy, handler)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, runner.request_stop)
        console.print(f"shadow for [bold]{job_type}[/] on {job_app.settings.kafka_bootstrap} "
                      f"(group {runner.group_id}): counts, runs nothing; Ctrl-C stops")
        await runner.run(until_idle=until_idle)
        return runner

    runner = run_fast(main())
    report = runner.report()
    console.print(f"stopped: {report.valid} valid, {report.undecodable} undecodable")


@db_app.command("migrate")
def migrate(ctx: typer.Context) -> None:
    """Create the dedup table (stream_jobs_done) and the fencing token sequence
    (stream_jobs_fencing_tokens) if they are missing; safe to re-run."""
    settings = settings_of(ctx)

    async def main() -> None:
        store = DedupStore(settings)
        try:
            await store.migrate()
        finally:
            await store.close()

    asyncio.run(main())
    console.print(f"dedup schema ready in {settings.database_schema}")
