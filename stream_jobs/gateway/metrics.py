"""Prometheus metrics of the gateway: gauges from the stats it samples.

The gateway samples `stream_jobs.tools.stats` in the background and `StatsCollector`
turns the latest snapshot into gauges: lag, oldest age, tier and DLQ depth (letters),
dead-lettered jobs (distinct job IDs: a job can leave several letters), rates, live
workers, the rate limit in force, and per-partition lag and committed offsets (what the
"partition stuck" alert watches), and the outbox's depth and oldest row. Types with
`[fairness]` get per-tenant gauges for the top `TOP_TENANTS` tenants by name and the rest
as `tenant="other"`: the labels stay bounded whatever the number of tenants. `HistoryCollector`
counts the jobs the history process recorded. Nothing here runs per job or per request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from stream_jobs.fairness.census import TenantCensus
from stream_jobs.fairness.tally import OTHER
from stream_jobs.history.tally import Tally
from stream_jobs.runtime.metrics import WORKER_METRICS, gauge
from stream_jobs.tools.type_stats import StatsSnapshot

GATEWAY_METRICS = frozenset({
    "stream_jobs_lag",
    "stream_jobs_oldest_age_seconds",
    "stream_jobs_tier_depth",
    "stream_jobs_dlq_depth",
    "stream_jobs_dlq_jobs",
    "stream_jobs_outcomes_per_second",
    "stream_jobs_workers_alive",
    "stream_jobs_in_flight",
    "stream_jobs_rate_limit_per_second",
    "stream_jobs_partition_lag",
    "stream_jobs_partition_committed_offset",
    "stream_jobs_partition_stuck",
    "stream_jobs_stats_sampled_timestamp_seconds",
    "stream_jobs_outbox_depth",
    "stream_jobs_outbox_oldest_age_seconds",
    "stream_jobs_gateway_enqueued_total",
    "stream_jobs_gateway_requests_total",
    "stream_jobs_history_jobs_total",
    "stream_jobs_tenant_waiting",
    "stream_jobs_tenant_overflow",
    "stream_jobs_tenant_in_flight",
    "stream_jobs_tenant_dwell_p95_seconds",
})
# Every series a worker or the gateway exports: what ops/ may refer to.
EXPORTED_METRICS = WORKER_METRICS | GATEWAY_METRICS


class StatsCollector(Collector):
    """Gauges from the latest stats snapshot the gateway sampled (none before the first)."""

    def __init__(self, latest: Callable[[], StatsSnapshot | None],
                 tenants: Callable[[], Mapping[str, TenantCensus]] = dict) -> None:
        self.latest = latest
        self.tenants = tenants

    def collect(self) -> Iterator[Metric]:
        snapshot = self.latest()
        if snapshot is None:
            return
        yield from _type_gauges(snapshot)
        yield gauge("stream_jobs_stats_sampled_timestamp_seconds",
                    "When the gateway last sampled these stats (Unix time).",
                    [([], snapshot.at_ms / 1000)], [])
        yield from _outbox_gauges(snapshot)
        yield from _tenant_gauges(self.tenants())


class HistoryCollector(Collector):
    """`stream_jobs_history_jobs_total{type,outcome}`: jobs finished since the history
    began, as the history process counted them (docs/history.md). Unlike a worker's own
    `stream_jobs_jobs_total` it does not start over when a worker restarts. Read at the
    stats sampler's pace; absent until the first reading."""

    def __init__(self, totals: Callable[[], Mapping[str, Tally] | None]) -> None:
        self.totals = totals

    def collect(self) -> Iterator[Metric]:
        totals = self.totals()
        if totals is None:
            return
        jobs = CounterMetricFamily("stream_jobs_history_jobs", "Jobs finished since the "
                                   "history began, by outcome, from the history process.",
                                   labels=["type", "outcome"])
        for job_type, tally in sorted(totals.items()):
            for outcome, n in sorted(tally.outcomes.items()):
                jobs.add_metric([job_type, outcome], n)
        yield jobs


def _type_gauges(snapshot: StatsSnapshot) -> Iterator[Metric]:
    """Every type's lanes, tiers, DLQ, rates, workers, rate limit and partitions."""
    lag, oldest, tiers, dlq, dlq_jobs, rates, alive, in_flight, limits = (
        [] for _ in range(9))
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
        if t.dlq is not None:
            dlq_jobs.append(([name], t.dlq.jobs))
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
    yield gauge("stream_jobs_lag", "Jobs not yet finished in a lane.", lag, by_lane)
    yield gauge("stream_jobs_oldest_age_seconds",
                "Age of the oldest unfinished job in a lane (absent when none waits).",
                oldest, by_lane)
    yield gauge("stream_jobs_tier_depth", "Retries waiting in a delay tier.", tiers,
                ["type", "tier"])
    yield gauge("stream_jobs_dlq_depth", "Dead letters the DLQ holds.", dlq)
    yield gauge("stream_jobs_dlq_jobs", "Dead-lettered jobs: distinct job IDs in the DLQ "
                "(a job can have several letters).", dlq_jobs)
    yield gauge("stream_jobs_outcomes_per_second",
                f"Outcomes per second over the last {snapshot.window_s:g} s "
                "(done = succeeded + duplicate), from the workers' reports.", rates,
                ["type", "outcome"])
    yield gauge("stream_jobs_workers_alive", "Workers reporting for the type.", alive)
    yield gauge("stream_jobs_in_flight", "Jobs the live workers hold.", in_flight)
    yield gauge("stream_jobs_rate_limit_per_second",
                "The type's rate limit in force (absent without one).", limits,
                ["type", "source"])
    yield gauge("stream_jobs_partition_lag", "Jobs not yet finished per lane partition.",
                part_lag, by_part)
    yield gauge("stream_jobs_partition_committed_offset",
                "The worker group's committed offset per lane partition.",
                part_committed, by_part)
    yield gauge("stream_jobs_partition_stuck",
                "1 when a lane partition's heartbeats stopped being processed "
                "(types with heartbeat_interval only).", stuck, by_part)


def _tenant_gauges(censuses: Mapping[str, TenantCensus]) -> Iterator[Metric]:
    """Per type with `[fairness]`: its top tenants by name, the rest as `other`."""
    waiting, overflow, in_flight, dwell = [], [], [], []
    for job_type, census in sorted(censuses.items()):
        for tenant, figures in [*census.top, (OTHER, census.other)]:
            labels = [job_type, tenant]
            waiting.append((labels, figures.waiting))
            overflow.append((labels, figures.overflow))
            in_flight.append((labels, figures.in_flight))
            if figures.dwell_p95_s is not None:
                dwell.append((labels, figures.dwell_p95_s))
    by_tenant = ["type", "tenant"]
    yield gauge("stream_jobs_tenant_waiting", "Jobs of a tenant not yet finished in the "
                "type's lanes (at least, when the sample's scan met its bound).", waiting,
                by_tenant)
    yield gauge("stream_jobs_tenant_overflow", "Jobs of a tenant not yet finished in the "
                "type's overflow lane.", overflow, by_tenant)
    yield gauge("stream_jobs_tenant_in_flight", "Jobs of a tenant the live workers hold.",
                in_flight, by_tenant)
    yield gauge("stream_jobs_tenant_dwell_p95_seconds", "95th percentile wait from due to "
                "start of a tenant's jobs over the sampler's window (a bucket's bound).",
                dwell, by_tenant)


def _outbox_gauges(snapshot: StatsSnapshot) -> Iterator[Metric]:
    box = snapshot.outbox
    if box is not None:  # absent while Postgres does not answer
        yield gauge("stream_jobs_outbox_depth", "Rows waiting in the transactional "
                    "outbox for a relay.", [([box.schema], box.depth)], ["schema"])
        yield gauge("stream_jobs_outbox_oldest_age_seconds",
                    "Age of the oldest outbox row (absent when none waits).",
                    [] if box.oldest_age_s is None else [([box.schema], box.oldest_age_s)],
                    ["schema"])


__all__ = ["EXPORTED_METRICS", "GATEWAY_METRICS", "HistoryCollector", "StatsCollector"]
