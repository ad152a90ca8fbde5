"""Prometheus metrics of workers and of the gateway.

Nothing here runs per job. A worker already counts its outcomes, dead-letter reasons and
(with metrics on) handler durations in plain attributes; `WorkerCollector` reads them
when Prometheus scrapes. The gateway samples `stream_jobs.tools.stats` in the background and
`StatsCollector` turns the latest snapshot into gauges: lag, oldest age, tier and DLQ
depth, rates, live workers, the rate limit in force, and per-partition lag and committed
offsets (what the "partition stuck" alert watches).

Worker metrics are served by `serve_metrics`, a small HTTP server on the worker's own
event loop, so a scrape reads the counters between jobs, never while one is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
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
from stream_jobs.tools.stats import StatsSnapshot

if TYPE_CHECKING:
    from stream_jobs.runtime.worker import Worker

log = logging.getLogger("stream_jobs.metrics")

OUTCOMES = ("succeeded", "retried", "dead_lettered", "expired", "duplicate")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Every series name we export, as Prometheus stores it (counters with `_total`,
# histograms as `_bucket`/`_sum`/`_count`). The Grafana dashboard and the alert rules in
# ops/ may use only these (tests/unit/test_ops_metrics.py checks).
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
})
GATEWAY_METRICS = frozenset({
    "stream_jobs_lag",
    "stream_jobs_oldest_age_seconds",
    "stream_jobs_tier_depth",
    "stream_jobs_dlq_depth",
    "stream_jobs_outcomes_per_second",
    "stream_jobs_workers_alive",
    "stream_jobs_in_flight",
    "stream_jobs_rate_limit_per_second",
    "stream_jobs_partition_lag",
    "stream_jobs_partition_committed_offset",
    "stream_jobs_partition_stuck",
    "stream_jobs_stats_sampled_timestamp_seconds",
    "stream_jobs_gateway_enqueued_total",
    "stream_jobs_gateway_requests_total",
})
EXPORTED_METRICS = WORKER_METRICS | GATEWAY_METRICS


def histogram_buckets(durations: DurationHistogram) -> list[tuple[str, float]]:
    return [("+Inf" if bound == float("inf") else repr(bound), float(n))
            for bound, n in durations.cumulative()]


class WorkerCollector(Collector):
    """One worker's counters, read at scrape time. Turns the worker's duration
    histogram on (it is off, and free, while nothing collects)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        if worker.durations is None:
            worker.durations = DurationHistogram()

    def collect(self) -> Iterator[Metric]:
        worker = self.worker
        job_type = worker.policy.job_type
        jobs = CounterMetricFamily("stream_jobs_jobs", "Jobs this worker finished, by outcome.",
                                   labels=["type", "outcome"])
        for outcome in OUTCOMES:
            jobs.add_metric([job_type, outcome], worker.outcomes.get(outcome, 0))
        yield jobs
        dead = CounterMetricFamily("stream_jobs_dead_letters",
                                   "Jobs this worker dead-lettered, by reason.",
                                   labels=["type", "reason"])
        for reason, n in sorted(worker.dead_letter_reasons.items()):
            dead.add_metric([job_type, reason], n)
        yield dead
        durations = worker.durations
        if durations is not None:
            hist = HistogramMetricFamily("stream_jobs_handler_duration_seconds",
                                         "How long handlers ran (a timeout counts its limit).",
                                         labels=["type"])
            hist.add_metric([job_type], histogram_buckets(durations), durations.sum_s)
            yield hist
        yield _gauge("stream_jobs_worker_in_flight",
                     "Jobs this worker holds: running or buffered, not yet finished.",
                     [([job_type], worker.in_flight())])
        if worker.rate.per_s is not None:
            yield _gauge("stream_jobs_worker_rate_limit_per_second",
                         "The type's rate limit this worker applies (jobs/s).",
                         [([job_type, worker.rate.source], worker.rate.per_s)],
                         labels=["type", "source"])
        if worker.rate_share_per_s is not None:
            yield _gauge("stream_jobs_worker_rate_share_per_second",
                         "This worker's share of the type's rate limit (jobs/s).",
                         [([job_type], worker.rate_share_per_s)])
        lag = []
        for tp, work in sorted(worker.partitions.items()):
            high = worker.consumer.highwater(tp)
            if high is None or work.tracker is None or work.revoked:
                continue  # nothing fetched yet: the broker's end is not known here
            lag.append(([job_type, tp.topic, str(tp.partition)],
                        max(0, high - work.tracker.position)))
        yield _gauge("stream_jobs_worker_partition_lag",
                     "Records after this worker's lowest unfinished offset, per assigned "
                     "lane partition (from the last fetch).", lag,
                     labels=["type", "topic", "partition"])
        if worker.relay is not None:
            released = CounterMetricFamily("stream_jobs_relay_released",
                                           "Delay-tier records this worker's relay put back "
                                           "in their lanes.", labels=["type"])
            released.add_metric([job_type], worker.relay.released)
            yield released


class StatsCollector(Collector):
    """Gauges from the latest stats snapshot the gateway sampled (none before the first)."""

    def __init__(self, latest: Callable[[], StatsSnapshot | None]) -> None:
        self.latest = latest

    def collect(self) -> Iterator[Metric]:
        snapshot = self.latest()
        if snapshot is None:
            return
        lag, oldest, tiers, dlq, rates, alive, in_flight, limits = ([] for _ in range(8))
        part_lag, part_committed, stuck = [], [], []
        for t in snapshot.types:
            name = t.job_type
            for lane in t.lanes:
                lag.append(([name, lane.name], lane.lag))
                if lane.oldest_age_s is not None:
                    oldest.append(([name, lane.name], lane.oldest_age_s))
                for p in lane.partitions:
                    labels = [name, lane.topic, str(p.partition)]
                    part_lag.append((labels, p.lag))
                    if p.committed is not None:
                        part_committed.append((labels, p.committed))
            for tier in t.tiers:
                tiers.append(([name, tier.name], tier.lag))
            if t.dlq_depth is not None:
                dlq.append(([name], t.dlq_depth))
            for outcome, per_s in t.rates.per_s().items():
                rates.append(([name, outcome], per_s))
            alive.append(([name], len(t.workers)))
            in_flight.append(([name], sum(w.in_flight for w in t.workers)))
            if t.rate.per_s is not None:
                limits.append(([name, t.rate.source], t.rate.per_s))
            if t.heartbeats is not None:
                stuck_at = {(b.topic, b.partition) for b in t.heartbeats.stuck}
                for b in t.heartbeats.partitions:
                    stuck.append(([name, b.topic, str(b.partition)],
                                  1.0 if (b.topic, b.partition) in stuck_at else 0.0))
        by_lane, by_part = ["type", "lane"], ["type", "topic", "partition"]
        yield _gauge("stream_jobs_lag", "Jobs not yet finished in a lane.", lag, by_lane)
        yield _gauge("stream_jobs_oldest_age_seconds",
                     "Age of the oldest unfinished job in a lane (absent when none waits).",
                     oldest, by_lane)
        yield _gauge("stream_jobs_tier_depth", "Retries waiting in a delay tier.", tiers,
                     ["type", "tier"])
        yield _gauge("stream_jobs_dlq_depth", "Dead letters the DLQ holds.", dlq)
        yield _gauge("stream_jobs_outcomes_per_second",
                     f"Outcomes per second over the last {snapshot.window_s:g} s "
                     "(done = succeeded + duplicate), from the workers' reports.", rates,
                     ["type", "outcome"])
        yield _gauge("stream_jobs_workers_alive", "Workers reporting for the type.", alive)
        yield _gauge("stream_jobs_in_flight", "Jobs the live workers hold.", in_flight)
        yield _gauge("stream_jobs_rate_limit_per_second",
                     "The type's rate limit in force (absent without one).", limits,
                     ["type", "source"])
        yield _gauge("stream_jobs_partition_lag", "Jobs not yet finished per lane partition.",
                     part_lag, by_part)
        yield _gauge("stream_jobs_partition_committed_offset",
                     "The worker group's committed offset per lane partition.",
                     part_committed, by_part)
        yield _gauge("stream_jobs_partition_stuck",
                     "1 when a lane partition's heartbeats stopped being processed "
                     "(types with heartbeat_interval only).", stuck, by_part)
        yield _gauge("stream_jobs_stats_sampled_timestamp_seconds",
                     "When the gateway last sampled these stats (Unix time).",
                     [([], snapshot.at_ms / 1000)], [])


def _gauge(name: str, documentation: str, samples: Sequence[tuple[Sequence[str], float]],
           labels: list[str] | None = None) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=["type"] if labels is None else labels)
    for values, value in samples:
        family.add_metric(values, value)
    return family


def worker_registry(worker: Worker) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(worker))
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
    "EXPORTED_METRICS",
    "GATEWAY_METRICS",
    "WORKER_METRICS",
    "StatsCollector",
    "WorkerCollector",
    "serve_metrics",
    "worker_registry",
]
