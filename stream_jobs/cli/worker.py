"""`stream-jobs worker APP [--type T ...] [--processes N|auto]`."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from stream_jobs import logs
from stream_jobs.app import App, load_app
from stream_jobs.cli.common import (
    KAFKA_LOG_LEVEL_OPTION,
    LOG_FORMAT_OPTION,
    LOG_LEVEL_OPTION,
    LogLevel,
    app,
    run_fast,
    settings_of,
)
from stream_jobs.errors import ConfigError

if TYPE_CHECKING:
    from stream_jobs.runtime.host import Counts
    from stream_jobs.runtime.shadow import Shadow
    from stream_jobs.runtime.supervisor import Child
    from stream_jobs.runtime.worker import Worker

console = Console(stderr=True)


@app.command("worker")
def worker(
    ctx: typer.Context,
    app_spec: str = typer.Argument(..., metavar="APP", help="MODULE:ATTR of a stream_jobs.App."),
    job_types: list[str] | None = typer.Option(
        None, "--type", "-t", metavar="TYPE", help="A job type to run; give it again for "
        "more. Default: every type the app has a handler for."),
    processes: str = typer.Option(
        "1", "--processes", envvar="STREAM_JOBS_WORKER_PROCESSES",
        help="Worker processes, each running every type: a number, or auto (one per CPU). "
        "More than 1 forks them under a supervisor that restarts any that dies."),
    until_idle: bool = typer.Option(
        False, "--until-idle", help="Exit once no type of the command has a job in a lane, "
        "a delay tier (a retry or delay not due yet is waited for), the outbox or a "
        "handler, in this process and, with --processes, in every one of them at once."),
    shadow: bool = typer.Option(False, "--shadow", help="Run nothing: read each type's lanes "
                                "in group T.shadow and count what is there (see `stats`)."),
    log_level: LogLevel = LOG_LEVEL_OPTION,
    kafka_log_level: LogLevel | None = KAFKA_LOG_LEVEL_OPTION,
    log_format: str | None = LOG_FORMAT_OPTION,
    metrics_port: int | None = typer.Option(
        None, "--metrics-port", envvar="STREAM_JOBS_METRICS_PORT",
        help="Serve Prometheus metrics on this port (0: off); with --processes N, worker "
        "process i serves on this port + i - 1."),
) -> None:
    """Run job types' handlers (group T.worker) and delay relays (group T.relay).

    Each type keeps its own consumer groups, concurrency and rate limit; all of them run
    in each worker process. SIGTERM or SIGINT drains: no new jobs start, running ones get
    a grace period, finished offsets are committed.
    """
    from stream_jobs.runtime.host import select_types, summary
    from stream_jobs.runtime.supervisor import processes_of

    settings = settings_of(ctx, metrics_port=metrics_port, log_format=log_format,
                           kafka_log_level=kafka_log_level)
    count = processes_of(processes, _usable_cpus())
    logs.configure(log_format=settings.log_format, level=log_level,
                   kafka_level=settings.kafka_log_level)
    job_app = load_app(app_spec)
    job_app.use_settings(settings)
    types = select_types(job_app.handlers, job_types or [], shadow=shadow)
    for job_type in types:
        job_app.job_type(job_type)  # a type without topics/T.toml: one sentence, now
    if settings.metrics_port and settings.metrics_port + count - 1 > 65535:
        raise ConfigError(f"--metrics-port {settings.metrics_port} leaves no room for "
                          f"{count} processes (one port each, up to 65535).")
    plan = _Plan(job_app, types, shadow=shadow, until_idle=until_idle)
    if count == 1:
        counts = run_fast(plan.run_process(None))
        console.print(f"stopped: {summary(counts, shadow=shadow)}")
        return
    _supervise(plan, count, types, until_idle=until_idle, shadow=shadow)


def _supervise(plan: _Plan, count: int, types: list[str], *, until_idle: bool,
               shadow: bool) -> None:
    """`count` worker processes under a supervisor, until they stop; their counts."""
    from stream_jobs.runtime.host import summary
    from stream_jobs.runtime.supervisor import Supervisor

    console.print(f"supervisor of {count} worker processes for [bold]{', '.join(types)}[/]; "
                  "Ctrl-C drains and stops")
    result = Supervisor(count, plan.child_main, until_idle=until_idle).run()
    for child, restarts in sorted(result.restarts.items()):
        console.print(f"{child} was restarted {restarts} time{'s' if restarts > 1 else ''}")
    if result.unreported:
        console.print("not counted below (killed before they could report): "
                      + ", ".join(result.unreported))
    console.print(f"stopped: {summary(result.counts, shadow=shadow)}")
    if result.exit_code:
        raise typer.Exit(result.exit_code)


def _usable_cpus() -> int:
    # The CPUs this process may run on (taskset, cpusets), not all the machine has.
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class _Plan:
    """What each worker process of the command runs: its types, as workers or shadows."""

    def __init__(self, job_app: App, types: list[str], *, shadow: bool,
                 until_idle: bool) -> None:
        self.job_app = job_app
        self.types = types
        self.shadow = shadow
        self.until_idle = until_idle

    def child_main(self, child: Child) -> Counts:
        """One child of the supervisor, after the fork: its own loop, clients and pools."""
        settings = self.job_app.settings
        if settings.metrics_port:
            self.job_app.use_settings(settings.model_copy(
                update={"metrics_port": settings.metrics_port + child.index - 1}))
        counts = run_fast(self.run_process(child))
        from stream_jobs.runtime.host import summary

        console.print(f"{child.name} stopped: {summary(counts, shadow=self.shadow)}")
        return counts

    async def run_process(self, child: Child | None) -> Counts:
        from stream_jobs.runtime.host import WorkerHost, process_services
        from stream_jobs.runtime.worker import Worker

        # aiokafka's clients must be created on the running loop, so the workers are too.
        runners = [self._runner(t) for t in self.types]
        workers = [r for r in runners if isinstance(r, Worker)]
        settings = self.job_app.settings
        host = WorkerHost(runners, until_idle=self.until_idle,
                          services=process_services(settings, workers),
                          lifeline=child.lifeline if child is not None else None,
                          idle_link=child.idle_link if child is not None else None)
        groups = ", ".join(r.group_id for r in runners)
        who = f"{child.name}: " if child is not None else ""
        what = "shadow" if self.shadow else "worker"
        how = ("counts, runs nothing; Ctrl-C stops" if self.shadow
               else "Ctrl-C drains and stops")
        metrics = (f", metrics on :{settings.metrics_port}"
                   if settings.metrics_port and workers else "")
        console.print(f"{who}{what} for [bold]{', '.join(self.types)}[/] on "
                      f"{settings.kafka_bootstrap} (group{'s' if len(runners) > 1 else ''} "
                      f"{groups}{metrics}); {how}")
        await host.run(handle_signals=True)
        return host.counts()

    def _runner(self, job_type: str) -> Worker | Shadow:
        if not self.shadow:
            return self.job_app.worker(job_type)
        from stream_jobs.runtime.shadow import Shadow

        # The model check needs the handler; a type without one still counts what decodes.
        return Shadow(self.job_app.settings, self.job_app.job_type(job_type),
                      self.job_app.handlers.get(job_type))

