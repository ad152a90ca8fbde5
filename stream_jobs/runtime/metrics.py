"""Prometheus metrics of a worker (the gateway's are in `stream_jobs.gateway.metrics`).

Nothing here runs per job. A worker already counts its outcomes, dead-letter reasons and
(with metrics on) handler durations in plain attributes; `WorkerCollector` reads them
when Prometheus scrapes, for every worker (job type) of the process at once.

Worker metrics are served by `serve_metrics`, a small HTTP server on the worker's own
event loop, so a scrape reads the counters between jobs, never while one is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from stream_jobs.histogram import DurationHistogram
from stream_jobs.outcomes import Outcome

if TYPE_CHECKING:
    from stream_jobs.runtime.worker import Worker

log = logging.getLogger("stream_jobs.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Every series name we export, as Prometheus stores it (counters with `_total`,
# histograms as `_bucket`/`_sum`/`_count`). The Grafana dashboard and the alert rules in
# ops/ may use only these and `stream_jobs.gateway.metrics.GATEWAY_METRICS`.
WORKER_METRICS = frozenset({
    "stream_jobs_jobs_total",
    "stream_jobs_dead_letters_total",
    "stream_jobs_handler_duration_seconds_bucket",
    "stream_jobs_handler_duration_seconds_sum",
    "stream_jobs_handler_duration_seconds_count",
    "stream_jobs_worker_in_flight",
    "stream_jobs_worker_rate_limit_per_second",
    "stream_jobs_worker_rate_share_per_second",
    "stream_jobs_worker_partition_lag",
    "stream_jobs_relay_released_total",
    "stream_jobs_worker_busy_threads",
    "stream_jobs_worker_overdue_threads",
    "stream_jobs_overdue_threads_total",
    "stream_jobs_loop_stalls_total",
})


def histogram_buckets(durations: DurationHistogram) -> list[tuple[str, float]]:
    return [("+Inf" if bound == float("inf") else repr(bound), float(n))
            for bound, n in durations.cumulative()]


class WorkerCollector(Collector):
    """The counters of a process's workers (one per job type), read at scrape time: each
    series once, with a sample per type. Turns each worker's duration histogram on (it
    is off, and free, while nothing collects)."""

    def __init__(self, *workers: Worker) -> None:
        self.workers = workers
        for worker in workers:
            if worker.durations is None:
                worker.durations = DurationHistogram()

    def collect(self) -> Iterator[Metric]:
        workers = self.workers
        jobs = CounterMetricFamily("stream_jobs_jobs", "Jobs this worker finished, by outcome.",
                                   labels=["type", "outcome"])
        dead = CounterMetricFamily("stream_jobs_dead_letters",
                                   "Jobs this worker dead-lettered, by reason.",
                                   labels=["type", "reason"])
        hist = HistogramMetricFamily("stream_jobs_handler_duration_seconds",
                                     "How long handlers ran (a timeout counts its limit).",
                                     labels=["type"])
        for worker in workers:
            job_type = worker.policy.job_type
            for outcome in Outcome:
                jobs.add_metric([job_type, outcome], worker.outcomes.get(outcome, 0))
            for reason, n in sorted(worker.dead_letter_reasons.items()):
                dead.add_metric([job_type, reason], n)
            durations = worker.durations
            if durations is not None:
                hist.add_metric([job_type], histogram_buckets(durations), durations.sum_s)
        yield jobs
        yield dead
        if hist.samples:
            yield hist
        yield gauge("stream_jobs_worker_in_flight",
                     "Jobs this worker holds: running or buffered, not yet finished.",
                     [([w.policy.job_type], w.in_flight()) for w in workers])
        limits = [([w.policy.job_type, w.rate.source], w.rate.per_s) for w in workers
                  if w.rate.per_s is not None]
        if limits:
            yield gauge("stream_jobs_worker_rate_limit_per_second",
                         "The type's rate limit this worker applies (jobs/s).", limits,
                         labels=["type", "source"])
        shares = [([w.policy.job_type], w.rate_share_per_s) for w in workers
                  if w.rate_share_per_s is not None]
        if shares:
            yield gauge("stream_jobs_worker_rate_share_per_second",
                         "This worker's share of the type's rate limit (jobs/s).", shares)
        yield gauge("stream_jobs_worker_partition_lag",
                     "Records after this worker's lowest unfinished offset, per assigned "
                     "lane partition (from the last fetch).",
                     [sample for w in workers for sample in _lag(w)],
                     labels=["type", "topic", "partition"])
        relays = [w for w in workers if w.relay is not None]
        if relays:
            released = CounterMetricFamily("stream_jobs_relay_released",
                                           "Delay-tier records this worker's relay put back "
                                           "in their lanes.", labels=["type"])
            for w in relays:
                assert w.relay is not None
                released.add_metric([w.policy.job_type], w.relay.released)
            yield released
        yield from _thread_metrics(worker)


def _thread_metrics(worker: Worker) -> Iterator[Metric]:
    """Sync handlers' threads (`stream_jobs.runtime.threads`), and the blocked-loop count."""
    job_type = worker.policy.job_type
    threads = worker.threads
    if threads is not None:
        yield gauge("stream_jobs_worker_busy_threads",
                    "Threads running a sync handler now (at most the type's concurrency).",
                    [([job_type], threads.busy)])
        yield gauge("stream_jobs_worker_overdue_threads",
                    "Threads still running a sync handler whose job stopped waiting for "
                    "it (past its timeout, or abandoned); each keeps a slot taken.",
                    [([job_type], threads.overdue)])
        overdue = CounterMetricFamily("stream_jobs_overdue_threads",
                                      "Sync handler calls that ran on past their job's "
                                      "timeout or grace period.", labels=["type"])
        overdue.add_metric([job_type], threads.overdue_total)
        yield overdue
    stalls = CounterMetricFamily("stream_jobs_loop_stalls",
                                 "Times a job of this type blocked the process's event "
                                 "loop for more than a second (e.g. time.sleep in an async "
                                 "def handler); a stall no job is named for counts for "
                                 "every type of the process.",
                                 labels=["type"])
    stalls.add_metric([job_type], worker.loop_watch.stalls)
    yield stalls


def _lag(worker: Worker) -> list[tuple[list[str], float]]:
    found: list[tuple[list[str], float]] = []
    for tp, work in sorted(worker.partitions.items()):
        high = worker.consumer.highwater(tp)
        if high is None or work.tracker is None or work.revoked:
            continue  # nothing fetched yet: the broker's end is not known here
        found.append(([worker.policy.job_type, tp.topic, str(tp.partition)],
                      max(0, high - work.tracker.position)))
    return found


def gauge(name: str, documentation: str, samples: Sequence[tuple[Sequence[str], float]],
           labels: list[str] | None = None) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=["type"] if labels is None else labels)
    for values, value in samples:
        family.add_metric(values, value)
    return family


def worker_registry(*workers: Worker) -> CollectorRegistry:
    """One registry for the workers of a process (`stream-jobs worker` serves it)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(*workers))
    return registry


async def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> asyncio.Server:
    """Serve `GET /metrics` (any path) on the running loop until the server is closed."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(5):
                request = await reader.readuntil(b"\r\n\r\n")
            method = request.split(b" ", 1)[0]
            if method not in (b"GET", b"HEAD"):
                head, body = b"HTTP/1.1 405 Method Not Allowed\r\nAllow: GET\r\n", b""
            else:
                body = generate_latest(registry)
                head = (f"HTTP/1.1 200 OK\r\nContent-Type: {CONTENT_TYPE}\r\n").encode()
            writer.write(head + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                         .encode() + (body if method == b"GET" else b""))
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ConnectionError):
            pass  # a client that hung up or sent nonsense gets nothing
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    server = await asyncio.start_server(answer, host, port, limit=16 * 1024)
    log.info("metrics on http://%s:%d/metrics", host, port)
    return server


__all__ = [
    "CONTENT_TYPE",
    "WORKER_METRICS",
    "WorkerCollector",
    "gauge",
    "serve_metrics",
    "worker_registry",
]
