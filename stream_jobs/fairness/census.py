"""Tenants by waiting, in flight, dwell and overflow: what `stream-jobs stats T --tenants`,
the dashboard's tenants tab and the metrics show.

*Waiting* and *in overflow* count the jobs past the worker group's committed offsets in
the type's lanes and in its overflow lane (`P.T.overflow`), by their `sj-tenant` header:
a scan of at most `max_records` records (DEFAULT_MAX_RECORDS), shared out over the
partitions (a partition's unused share goes to the next). When the bound stops it, the
census says so (`complete` False: the counts are "at least"). A record fetched but not
finished by a worker is past the committed offset too: it is counted waiting, and in
flight in the worker's report. *In flight* and *dwell p95* come from the live workers'
reports (`stream_jobs.fairness.tally`): in flight from each one's latest report, dwell
from all their reports of the window asked for (each report carries the dwells since the
one before), added up.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stream_jobs.clock import now_ms
from stream_jobs.fairness.tally import OTHER, TOP_TENANTS, TenantFigures, TenantSection, top_split
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.admin import Admin, open_admin
from stream_jobs.kafka.consumer import Consumer, open_reader
from stream_jobs.kafka.scan import PartitionRange, scan
from stream_jobs.naming import worker_group
from stream_jobs.record import HEADER_JOB_ID, tenant_in
from stream_jobs.settings import Settings

# Records a census reads at most, over all the partitions of the lanes and the overflow.
DEFAULT_MAX_RECORDS = 100_000
# The scan reads headers only, but fetches whole records: no more than this at a time.
_FETCH_BYTES = 1024 * 1024


@dataclass(frozen=True)
class WaitingCount:
    """Jobs past the worker group's committed offsets, by tenant: in the lanes and in the
    overflow lane; `scanned` records read; `complete` False when the bound stopped it."""

    lanes: Mapping[str, int]
    overflow: Mapping[str, int]
    scanned: int
    complete: bool


@dataclass(frozen=True)
class TenantCensus:
    """One type's tenants: the top ones (most unfinished jobs first) and the rest."""

    job_type: str
    top: tuple[tuple[str, TenantFigures], ...]
    other: TenantFigures
    tenants: int  # distinct tenants seen, by name (the rest of the workers' are in other)
    scanned: int
    max_records: int
    complete: bool
    workers: int
    at_ms: int

    @property
    def total(self) -> TenantFigures:
        found = self.other
        for _, figures in self.top:
            found = found.plus(figures)
        return found

    def to_dict(self) -> dict[str, Any]:
        """The `stats T --tenants --json` document (docs/fairness.md)."""
        return {"job_type": self.job_type, "at_ms": self.at_ms,
                "tenants": [{"tenant": name, **figures.to_dict()} for name, figures in self.top],
                OTHER: self.other.to_dict(), "total": self.total.to_dict(),
                "tenants_seen": self.tenants, "workers": self.workers,
                "scan": {"records": self.scanned, "max_records": self.max_records,
                         "complete": self.complete}}


def fold(job_type: str, waiting: WaitingCount, sections: Sequence[TenantSection], *,
         workers: int, top: int = TOP_TENANTS, max_records: int = DEFAULT_MAX_RECORDS,
         at_ms: int | None = None) -> TenantCensus:
    """The census of `waiting` (a scan) and the `workers` live workers' report
    `sections`: added up, whatever each holds (`TenantSection.only`)."""
    figures: dict[str, TenantFigures] = {}

    def of(name: str) -> TenantFigures:
        found = figures.get(name)
        if found is None:
            found = figures[name] = TenantFigures()
        return found

    for name, n in waiting.lanes.items():
        of(name).waiting += n
    for name, n in waiting.overflow.items():
        of(name).overflow += n
    workers_other = TenantFigures()
    for section in sections:
        for name, reported in section.top:
            figures[name] = of(name).plus(reported)
        workers_other = workers_other.plus(section.other)
    named, rest = top_split(figures, top)
    return TenantCensus(job_type, tuple(named), rest.plus(workers_other), len(figures),
                        waiting.scanned, max_records, waiting.complete, workers,
                        now_ms() if at_ms is None else at_ms)


async def count_waiting(consumer: Consumer, admin: Admin, prefix: str, policy: JobTypePolicy,
                        *, max_records: int = DEFAULT_MAX_RECORDS) -> WaitingCount:
    """Count the jobs past `P.T.worker`'s committed offsets in the lanes and the
    overflow lane by tenant, reading at most `max_records` records."""
    topics = policy.worker_topics(prefix)
    known = await consumer.learn_topics(list(topics.values()))
    tps = [TopicPartition(topic, part) for topic in topics.values()
           for part in sorted(known.get(topic, ()))]
    if not tps:
        return WaitingCount({}, {}, 0, True)
    firsts = await consumer.beginning_offsets(tps)
    ends = await consumer.end_offsets(tps)
    committed = await admin.committed_offsets(worker_group(prefix, policy.job_type), tps)
    overflow = topics.get("overflow")
    counts: dict[bool, Counter[str]] = {False: Counter(), True: Counter()}
    scanned, complete = 0, True
    for index, tp in enumerate(tps):
        start = min(max(committed.get(tp) or 0, firsts[tp]), ends[tp])
        share = (max_records - scanned) // (len(tps) - index)
        stop = min(ends[tp], start + share)
        complete = complete and stop == ends[tp]
        tally = counts[tp.topic == overflow]
        async for record in scan(consumer, tp.topic, [PartitionRange(tp.partition, start, stop)]):
            scanned += 1
            if any(name == HEADER_JOB_ID for name, _ in record.headers):  # not a heartbeat
                tally[tenant_in(record.headers)] += 1
    return WaitingCount(dict(counts[False]), dict(counts[True]), scanned, complete)


async def tenant_census(settings: Settings, policy: JobTypePolicy,
                        sections: Sequence[TenantSection], *, workers: int,
                        top: int = TOP_TENANTS, max_records: int = DEFAULT_MAX_RECORDS
                        ) -> TenantCensus:
    """`policy`'s type's census: the scan (`count_waiting`), folded with `sections`, the
    tenants of its `workers` live workers' reports."""
    async with open_reader(settings, client_id="stream-jobs-tenants",
                           max_partition_fetch_bytes=_FETCH_BYTES) as consumer, \
            open_admin(settings) as admin:
        waiting = await count_waiting(consumer, admin, settings.topic_prefix, policy,
                                      max_records=max_records)
    return fold(policy.job_type, waiting, sections, workers=workers, top=top,
                max_records=max_records)


__all__ = ["DEFAULT_MAX_RECORDS", "TenantCensus", "WaitingCount", "count_waiting", "fold",
           "tenant_census"]
