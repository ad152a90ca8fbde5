"""One worker process: a `Worker` per job type on one event loop, and the process's services.

`stream-jobs worker APP` runs every type the app has handlers for (or those named with
`--type`) in one process. Each type keeps everything that isolates it: its own `Worker`
with its consumer groups (`P.T.worker`, `P.T.relay`), its producer, its dedup pool, its
concurrency and its rate limit; they only share the event loop, and
`tests/integration/test_flow_control.py` shows a saturated type leaving another's
throughput and latency alone on one loop. The host starts them together, and when one
stops with an error it drains the others and raises that error, so the process ends and
its supervisor (`stream_jobs.runtime.supervisor`), systemd or Kubernetes starts it again:
a process never runs on with a type silently gone.

Per-process services run beside the workers, started before them and stopped after them
(so a service sees every job the workers finished): `process_services` is the one place
that makes them: the transactional outbox's relay (`stream_jobs.outbox.relay`, on unless
`STREAM_JOBS_OUTBOX_RELAY=false`) and the metrics server.

A stop (`request_stop`: SIGTERM, SIGINT, or the supervisor gone) drains every type the
way one worker drains: no new jobs, running ones get their grace period, finished offsets
are committed.

With `until_idle` (`--until-idle`) the host stops by itself once the process is idle: no
type it runs has a job in a lane, a delay tier, the outbox or a handler, judged by one
`stream_jobs.runtime.idle.IdleWatch` over all its types together (a type is not idle
alone while another's handler may write it a job). In a child of a supervisor, the watch
tells the supervisor instead, through the child's `idle_link`, and the supervisor stops
the children once all of them are idle together.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Protocol

from stream_jobs.errors import ConfigError
from stream_jobs.naming import tier_topic
from stream_jobs.outbox.depth import OutboxWaiting
from stream_jobs.outbox.relay import background_relay
from stream_jobs.runtime.idle import IdleLink, IdleWatch, run_until_idle
from stream_jobs.runtime.services import Service, running
from stream_jobs.runtime.shadow import Shadow
from stream_jobs.runtime.worker import Worker
from stream_jobs.settings import Settings

log = logging.getLogger("stream_jobs.host")

# Outcome counts of a process: job type -> outcome (or, for a shadow, valid/undecodable) -> n.
Counts = dict[str, dict[str, int]]


class ProcessService(Service, Protocol):
    """Something that runs once per worker process beside its workers: started before
    the first worker starts, stopped after the last one has drained (`Service`)."""


class MetricsService:
    """Prometheus metrics of every worker of the process, from one registry on one port."""

    name = "metrics"

    def __init__(self, workers: Sequence[Worker], host: str, port: int) -> None:
        self.workers = list(workers)
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        from stream_jobs.runtime.metrics import serve_metrics, worker_registry

        try:
            self._server = await serve_metrics(worker_registry(*self.workers), self.host,
                                               self.port)
        except OSError as exc:
            raise ConfigError(f"Cannot serve metrics on {self.host}:{self.port} "
                              f"({exc.strerror}); give another --metrics-port.") from exc

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


class OutboxRelayService:
    """The outbox relay of the process: rows committed by `enqueue(conn=...)` and
    `ctx.enqueue` reach Kafka from every worker process (`STREAM_JOBS_OUTBOX_RELAY`)."""

    name = "outbox relay"

    def __init__(self, settings: Settings) -> None:
        self._running = background_relay(settings)

    async def start(self) -> None:
        await self._running.__aenter__()

    async def stop(self) -> None:
        await self._running.__aexit__(None, None, None)


def process_services(settings: Settings, workers: Sequence[Worker]) -> list[ProcessService]:
    """The services of one worker process, in start order (stopped in reverse).

    This is where a per-process service is added: it runs in every worker process, the
    single one of `--processes 1` and each child of a supervisor alike.
    """
    services: list[ProcessService] = []
    if settings.outbox_relay and workers:
        services.append(OutboxRelayService(settings))
    if settings.metrics_port and workers:
        services.append(MetricsService(workers, settings.metrics_host, settings.metrics_port))
    return services


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def accept_stop_signals() -> None:
    """Let SIGTERM and SIGINT through to this thread. A supervisor's child starts with them
    held (`stream_jobs.runtime.supervisor`): a stop that comes while the child imports and
    connects waits until its host drains on it, instead of killing it half-started."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


# -- which types a command runs (pure) --------------------------------------------------------


def select_types(handlers: Collection[str], requested: Sequence[str], *,
                 shadow: bool = False) -> list[str]:
    """The types `stream-jobs worker` runs: those `--type` names (each once, in the order
    given), else every type with a handler, sorted. A named type needs a handler, except
    in shadow mode, where a type without one is still counted (without its model check).
    Raises `ConfigError` with one sentence."""
    chosen = list(dict.fromkeys(requested))
    if not chosen:
        if not handlers:
            raise ConfigError("This app has no handlers: register one with @app.job(...), "
                              "or name a type with --type to run it in shadow mode.")
        return sorted(handlers)
    missing = [t for t in chosen if t not in handlers]
    if missing and not shadow:
        known = ", ".join(sorted(handlers)) or "none"
        raise ConfigError(f"This app has no handler for {', '.join(map(repr, missing))} "
                          f"(it has: {known}).")
    return chosen


def summary(counts: Mapping[str, Mapping[str, int]], *, shadow: bool = False) -> str:
    """What a stopped worker prints after "stopped: ": each type's outcome counts, the
    type named when there are several ("email.send: succeeded 2; image.resize: no jobs")."""

    def one(found: Mapping[str, int]) -> str:
        if shadow:
            return f"{found.get('valid', 0)} valid, {found.get('undecodable', 0)} undecodable"
        return ", ".join(f"{k} {v}" for k, v in sorted(found.items()) if v) or "no jobs"

    if len(counts) == 1:
        [found] = counts.values()
        return one(found)
    return "; ".join(f"{job_type}: {one(found)}" for job_type, found in sorted(counts.items())
                     ) or "no jobs"


def add_counts(total: Counts, more: Mapping[str, Mapping[str, int]]) -> None:
    """Add `more` into `total` (the supervisor sums its children's counts)."""
    for job_type, found in more.items():
        into = total.setdefault(job_type, {})
        for name, n in found.items():
            into[name] = into.get(name, 0) + n


# -- the host -------------------------------------------------------------------------------


def outbox_waiting(workers: Sequence[Worker]) -> OutboxWaiting | None:
    """The outbox rows `--until-idle` waits for: those for the workers' lanes and delay
    tiers (a row for a type this process does not run is another worker's to run)."""
    if not workers:
        return None
    settings = workers[0].settings
    prefix = settings.topic_prefix
    topics = [topic for w in workers for topic in (
        *w.topics, *(tier_topic(prefix, w.policy.job_type, tier)
                     for tier in w.policy.retry_tiers))]
    return OutboxWaiting(settings, topics)


class WorkerHost:
    """Runs `runners` (a `Worker` or a `Shadow` per type) together on the running loop,
    with `services` beside them."""

    def __init__(self, runners: Iterable[Worker | Shadow], *, until_idle: bool = False,
                 services: Sequence[ProcessService] = (), lifeline: int | None = None,
                 idle_link: int | None = None) -> None:
        self.runners = list(runners)
        if not self.runners:
            raise ConfigError("A worker process needs at least one job type to run.")
        self.until_idle = until_idle
        self.services = list(services)
        # Readable (end of file) once the supervisor that forked this process is gone.
        self.lifeline = lifeline
        # With until_idle: what decides that every type of the process is idle together.
        self.idle = (IdleWatch(self.runners, outbox=outbox_waiting(self.workers),
                               link=IdleLink(idle_link) if idle_link is not None else None)
                     if until_idle else None)
        self._stop_requested = False

    @property
    def workers(self) -> list[Worker]:
        return [r for r in self.runners if isinstance(r, Worker)]

    def request_stop(self) -> None:
        """Drain every type and return from `run` (safe from a signal handler)."""
        self._stop_requested = True
        for runner in self.runners:
            runner.request_stop()

    async def run(self, *, handle_signals: bool = False) -> None:
        """Start the services, run every type until stopped (or, with `until_idle`, until
        the process is idle: see the module's docstring), stop the services. With
        `handle_signals`, SIGTERM and SIGINT drain (the worker command's behaviour; off
        for a host inside a test or an app)."""
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT) if handle_signals else ()
        for sig in signals:
            loop.add_signal_handler(sig, self.request_stop)
        if signals:
            accept_stop_signals()
        if self.lifeline is not None:
            loop.add_reader(self.lifeline, self._supervisor_gone, loop)
        try:
            async with running(self.services):
                await self._run_runners()
        finally:
            if self.lifeline is not None:
                loop.remove_reader(self.lifeline)
            for sig in signals:
                loop.remove_signal_handler(sig)

    async def _run_runners(self) -> None:
        if self.idle is None:
            await self._run_all()
        else:
            await run_until_idle(self.idle, self._run_all, self._stop_runners)

    def _stop_runners(self) -> None:
        for runner in self.runners:
            runner.request_stop()

    async def _run_all(self) -> None:
        tasks = [asyncio.create_task(r.run(), name=f"{r.group_id} run") for r in self.runners]
        try:
            done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        failed = [(r, t) for r, t in zip(self.runners, tasks, strict=True)
                  if t in done and not t.cancelled() and t.exception() is not None]
        if not failed:
            return
        runner, task = failed[0]
        error = task.exception()
        assert error is not None
        if pending:
            log.error("%s stopped with an error, so the other types of this process drain "
                      "and it exits: %s", runner.job_type, error)
            for other in self.runners:
                other.request_stop()
            await asyncio.gather(*pending, return_exceptions=True)
        raise error

    def _supervisor_gone(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self.lifeline is not None
        with contextlib.suppress(OSError):
            if os.read(self.lifeline, 1):
                return  # nobody writes to it; only its end means something
        loop.remove_reader(self.lifeline)
        if not self._stop_requested:
            log.warning("the supervisor is gone: draining and stopping")
            self.request_stop()

    def counts(self) -> Counts:
        """What each type counted so far: outcomes, or a shadow's valid and undecodable."""
        found: Counts = {}
        for runner in self.runners:
            if isinstance(runner, Worker):
                found[runner.policy.job_type] = {str(k): v for k, v in runner.outcomes.items()}
            else:
                report = runner.report()
                found[runner.policy.job_type] = {"valid": report.valid,
                                                 "undecodable": report.undecodable}
        return found


__all__ = ["STOP_SIGNALS", "Counts", "MetricsService", "ProcessService", "WorkerHost",
           "accept_stop_signals", "add_counts", "outbox_waiting", "process_services",
           "select_types", "summary"]
