"""`stream-jobs scheduler APP` and `stream-jobs schedules list|pause|resume|trigger`.

The scheduler command runs the schedulers of an app's types on their own (every worker
of a type also runs its scheduler; one of all of them leads each type). The `schedules`
commands read and change the state in Postgres, and `trigger` enqueues a firing now.
"""

from __future__ import annotations

import asyncio
import signal

import typer
from rich.console import Console

from stream_jobs import clock, logs
from stream_jobs.app import load_app
from stream_jobs.cli import common
from stream_jobs.cli.common import LogLevel, app, run_fast, settings_of
from stream_jobs.cli.tables import (
    WIDE_OPTION,
    FittedTable,
    job_id_column,
    number_column,
    print_table,
    text_column,
    word_column,
)
from stream_jobs.errors import ConfigError
from stream_jobs.job_types import JobTypePolicy, load_job_types
from stream_jobs.schedules import Scheduler
from stream_jobs.schedules.listing import ScheduleView, read_schedules
from stream_jobs.settings import Settings
from stream_jobs.tools.schedules import set_schedule_paused, trigger_schedule

console = Console()
status = Console(stderr=True)
schedules_app = typer.Typer(help="Periodic jobs: list, pause, resume, trigger.",
                            no_args_is_help=True)


@app.command("scheduler")
def scheduler(
    ctx: typer.Context,
    app_spec: str = typer.Argument(..., metavar="APP", help="MODULE:ATTR of a stream_jobs.App."),
    job_types: list[str] = typer.Option(
        [], "--type", "-t", metavar="TYPE", help="A type whose schedules to run "
        "(repeatable; default: every type with schedules)."),
    log_level: LogLevel = common.LOG_LEVEL_OPTION,  # the same three options as `worker`'s
    kafka_log_level: LogLevel | None = common.KAFKA_LOG_LEVEL_OPTION,
    log_format: str | None = common.LOG_FORMAT_OPTION,
) -> None:
    """Run the schedulers of APP's types alone: each waits for its type's lock and, while
    it holds it, enqueues every due firing. SIGTERM or SIGINT stops it (the lock goes to
    another scheduler at once)."""
    settings = settings_of(ctx, log_format=log_format, kafka_log_level=kafka_log_level)
    logs.configure(log_format=settings.log_format, level=log_level,
                   kafka_level=settings.kafka_log_level)
    job_app = load_app(app_spec)
    job_app.use_settings(settings)
    chosen = job_types or job_app.scheduled_types()
    if not chosen:
        raise ConfigError(f"No type of {app_spec} has schedules: declare [[schedules]] in "
                          f"{settings.topics_dir}/<type>.toml or use @app.periodic.")

    async def main() -> list[Scheduler]:
        runners = []
        for job_type in chosen:
            runner = job_app.scheduler(job_type)
            if runner is None:
                raise ConfigError(f"Job type {job_type!r} has no schedules.")
            runners.append(runner)
        def stop() -> None:
            for runner in runners:
                runner.request_stop()

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop)
        status.print(f"scheduler for [bold]{', '.join(chosen)}[/] on "
                     f"{settings.kafka_bootstrap}; Ctrl-C stops")
        await asyncio.gather(*(r.run() for r in runners))
        return runners

    runners = run_fast(main())
    fired = ", ".join(f"{r.job_type} {r.fired}" for r in runners)
    status.print(f"stopped: firings enqueued: {fired}")


def _types(settings: Settings) -> dict[str, JobTypePolicy]:
    try:
        return load_job_types(settings.topics_dir)
    except ConfigError:
        return {}  # schedules declared in code are still listed from their rows


def _views(settings: Settings) -> tuple[dict[str, JobTypePolicy], list[ScheduleView]]:
    types = _types(settings)
    return types, asyncio.run(read_schedules(settings, types))


@schedules_app.command("list")
def list_schedules(
    ctx: typer.Context,
    job_type: str | None = typer.Option(None, "--type", "-t", help="Only this type's."),
    wide: bool = WIDE_OPTION,
) -> None:
    """Every schedule: how it fires, its next fire time, its last firing, whether it is
    paused, firings left out by its missed policy, and the scheduler leading its type."""
    settings = settings_of(ctx)
    _, views = _views(settings)
    views = [v for v in views if job_type in (None, v.job_type)]
    if not views:
        status.print("no schedules: declare [[schedules]] in topics/<type>.toml, or run a "
                     "scheduler for an app that uses @app.periodic")
        return
    print_table(console, schedules_table(views, clock.now_ms(), wide=wide), wide=wide)


# At 80 columns each schedule, when it fires next and whether it is paused; --wide adds how
# it fires, its last firing (time and job ID), the firings its missed policy left out and
# the scheduler leading its type.
_SCHEDULE_COLUMNS = (text_column("type"), text_column("schedule"),
                     text_column("fires", wide=True), text_column("next fire"),
                     text_column("last fired", wide=True),
                     job_id_column("last job ID", wide=True), word_column("paused"),
                     number_column("missed", wide=True), text_column("leader", wide=True))


def schedules_table(views: list[ScheduleView], now: int, *, wide: bool) -> FittedTable:
    table = FittedTable(_SCHEDULE_COLUMNS, wide=wide)
    for v in views:
        nxt = "paused" if v.paused else v.when(v.next_fire_ms)
        if v.overdue and v.next_fire_ms is not None:
            nxt = f"[red]overdue {(now - v.next_fire_ms) / 1000:.0f} s: {nxt}[/]"
        table.add_row(v.job_type, v.name, v.fires, nxt, v.when(v.last_fired_ms),
                      v.last_job_id or "—", "yes" if v.paused else "no", str(v.missed_total),
                      v.leader or "[yellow]none[/]")
    return table


def _toggle(ctx: typer.Context, name: str, job_type: str | None, paused: bool) -> None:
    settings = settings_of(ctx)
    types = _types(settings)
    status.print(asyncio.run(set_schedule_paused(settings, types, name, job_type, paused)))


@schedules_app.command("pause")
def pause(ctx: typer.Context, name: str = typer.Argument(..., metavar="NAME"),
          job_type: str | None = typer.Option(None, "--type", "-t",
                                              help="The type, if NAME is in several.")) -> None:
    """Stop NAME from firing (returns once a firing in progress has committed)."""
    _toggle(ctx, name, job_type, True)


@schedules_app.command("resume")
def resume(ctx: typer.Context, name: str = typer.Argument(..., metavar="NAME"),
           job_type: str | None = typer.Option(None, "--type", "-t",
                                               help="The type, if NAME is in several.")) -> None:
    """Let NAME fire again from its next fire time on."""
    _toggle(ctx, name, job_type, False)


@schedules_app.command("trigger")
def trigger(
    ctx: typer.Context,
    name: str = typer.Argument(..., metavar="NAME"),
    job_type: str | None = typer.Option(None, "--type", "-t",
                                        help="The type, if NAME is in several."),
    app_spec: str | None = typer.Option(None, "--app", metavar="APP",
                                        help="MODULE:ATTR of the App, for a schedule whose "
                                             "payload is computed in code."),
) -> None:
    """Enqueue one run of NAME now, with a new job ID (not one of its firings: it is
    not deduplicated against them), and print that ID."""
    settings = settings_of(ctx)
    types = _types(settings)
    job_app = None
    if app_spec is not None:
        job_app = load_app(app_spec)
        job_app.use_settings(settings)
    triggered = asyncio.run(trigger_schedule(settings, types, name, job_type, job_app))
    print(triggered.job_id)
    status.print(f"{triggered.job_type}:{name} triggered at {triggered.at.isoformat()}")

