"""`stream-jobs stats`: backlog, oldest age, tier and DLQ depths, and recent rates per type.

Everything comes from Kafka, so stats need no database:

- **lag** of a lane: its end offset minus the committed offset of `P.T.worker` (from the
  beginning offset when the group never committed), summed over partitions;
- **oldest age**: now minus the timestamp of the record at the committed offset, the
  oldest job not yet finished (one record read per lagging partition, no group joined);
- **tier depth**: records in a delay tier not yet relayed (end minus `P.T.relay`'s
  committed offset); **DLQ depth**: records the DLQ holds (end minus beginning);
- **rates**: outcomes per second over a window, from the reports every worker publishes
  to `P._stats` (`stream_jobs.runtime.reports`): per worker, its latest report minus its latest
  report at or before the window's start, summed over workers;
- **shadow**: for a type read by `worker --shadow`, the lag of group `P.T.shadow` and
  what the shadows counted, next to what the real workers finished (`stream_jobs.runtime.shadow`).

The arithmetic (lag, age, rates, liveness) is pure and lives at the top of this module.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from stream_jobs import clock
from stream_jobs.errors import BrokerUnavailable
from stream_jobs.job_types import JobTypePolicy, get_job_type
from stream_jobs.kafka import scan
from stream_jobs.kafka.admin import admin_client
from stream_jobs.naming import relay_group, shadow_group, stats_topic, worker_group
from stream_jobs.runtime.heartbeats import HeartbeatStats, heartbeat_stats
from stream_jobs.runtime.reports import ShadowReport, WorkerReport
from stream_jobs.runtime.shadow import ShadowStats, shadow_stats
from stream_jobs.runtime.throttle import NO_LIMIT, RateInForce, rate_in_force, read_overrides
from stream_jobs.settings import Settings

DEFAULT_WINDOW_S = 60.0
# The workers' default report period; a worker is alive while its last report is younger
# than ALIVE_INTERVALS of these and was not its final one.
DEFAULT_REPORT_INTERVAL_S = 5.0
ALIVE_INTERVALS = 3
# Reading one record for its timestamp must not fetch megabytes of backlog behind it.
_PEEK_FETCH_BYTES = 64 * 1024

# ---------------------------------------------------------------------------------------
# Pure arithmetic.


def unfinished_from(beginning: int, committed: int | None) -> int:
    """The offset of the oldest unfinished record: the committed offset, or the beginning
    offset when the group never committed or retention deleted what it had not read."""
    if committed is None or committed < beginning:
        return beginning
    return committed


def backlog(beginning: int, end: int, committed: int | None) -> int:
    """Records from `unfinished_from` to the end offset (never negative)."""
    return max(0, end - unfinished_from(beginning, committed))


def age_s(now_ms: int, timestamp_ms: int) -> float:
    """Seconds from a record's timestamp to now; 0 for a timestamp ahead of our clock."""
    return max(0, now_ms - timestamp_ms) / 1000


@dataclass(frozen=True)
class OutcomeCounts:
    """Jobs by outcome; `done` is succeeded plus duplicate (finished, nothing to retry)."""

    done: int = 0
    retried: int = 0
    dead_lettered: int = 0
    expired: int = 0

    @classmethod
    def of(cls, outcomes: Mapping[str, int]) -> OutcomeCounts:
        return cls(done=outcomes.get("succeeded", 0) + outcomes.get("duplicate", 0),
                   retried=outcomes.get("retried", 0),
                   dead_lettered=outcomes.get("dead_lettered", 0),
                   expired=outcomes.get("expired", 0))

    def since(self, earlier: OutcomeCounts) -> OutcomeCounts:
        # Counters are cumulative per worker ID, so a difference is never negative unless
        # reports were reordered; clamp rather than report negative work.
        return OutcomeCounts(max(0, self.done - earlier.done),
                             max(0, self.retried - earlier.retried),
                             max(0, self.dead_lettered - earlier.dead_lettered),
                             max(0, self.expired - earlier.expired))

    def __add__(self, other: OutcomeCounts) -> OutcomeCounts:
        return OutcomeCounts(self.done + other.done, self.retried + other.retried,
                             self.dead_lettered + other.dead_lettered,
                             self.expired + other.expired)

    @property
    def total(self) -> int:
        return self.done + self.retried + self.dead_lettered + self.expired


@dataclass(frozen=True)
class Rates:
    """Outcomes counted over the last `window_s` seconds, and the same per second."""

    window_s: float
    counts: OutcomeCounts = OutcomeCounts()

    def per_s(self) -> dict[str, float]:
        c, w = self.counts, self.window_s
        return {"done": c.done / w, "retried": c.retried / w,
                "dead_lettered": c.dead_lettered / w, "expired": c.expired / w}


def latest_reports(reports: Iterable[WorkerReport]) -> dict[str, WorkerReport]:
    """The last report of each worker (by `at_ms`), by worker ID."""
    latest: dict[str, WorkerReport] = {}
    for report in reports:
        seen = latest.get(report.worker_id)
        if seen is None or report.at_ms >= seen.at_ms:
            latest[report.worker_id] = report
    return latest


def window_counts(reports: Iterable[WorkerReport], *, now_ms: int,
                  window_s: float) -> OutcomeCounts:
    """What the workers did in the window ending at `now_ms`, summed over workers.

    Per worker: its latest report minus its latest report at or before the window's
    start. A worker with no report that old counts from zero if it started inside the
    window, else from the oldest report given. The baseline report can be up to one
    report interval older than the window's start, so counts may include that much more.
    """
    start_ms = now_ms - int(window_s * 1000)
    by_worker: dict[str, list[WorkerReport]] = {}
    for report in reports:
        by_worker.setdefault(report.worker_id, []).append(report)
    total = OutcomeCounts()
    for own in by_worker.values():
        own.sort(key=lambda r: r.at_ms)
        latest = own[-1]
        before = [r for r in own if r.at_ms <= start_ms]
        if before:
            base = OutcomeCounts.of(before[-1].outcomes)
        elif latest.started_at_ms >= start_ms:
            base = OutcomeCounts()
        else:
            base = OutcomeCounts.of(own[0].outcomes)
        total += OutcomeCounts.of(latest.outcomes).since(base)
    return total


def rates_from_reports(reports: Iterable[WorkerReport], *, now_ms: int,
                       window_s: float) -> Rates:
    """`window_counts` as rates over `window_s` seconds."""
    return Rates(window_s, window_counts(reports, now_ms=now_ms, window_s=window_s))


def alive_workers(reports: Iterable[WorkerReport], *, now_ms: int,
                  report_interval_s: float = DEFAULT_REPORT_INTERVAL_S) -> list[WorkerReport]:
    """The latest report of each worker that is alive: it reported within ALIVE_INTERVALS
    of its own report interval, and that report was not its final one. `report_interval_s`
    stands in for reports that do not say their interval."""
    def alive(report: WorkerReport) -> bool:
        interval_s = report.interval_s or report_interval_s
        return not report.final and now_ms - report.at_ms <= ALIVE_INTERVALS * interval_s * 1000

    return sorted((r for r in latest_reports(reports).values() if alive(r)),
                  key=lambda r: r.worker_id)


# ---------------------------------------------------------------------------------------
# The snapshot.


@dataclass(frozen=True)
class PartitionLag:
    """One partition: offsets, what is behind the group, and how old its oldest record is."""

    partition: int
    beginning: int
    end: int
    committed: int | None  # None: the group never committed here
    lag: int
    oldest_age_s: float | None = None  # None when nothing is behind (or it was unreadable)


@dataclass(frozen=True)
class TopicLag:
    """A lane (against `P.T.worker`) or a delay tier (against `P.T.relay`)."""

    name: str  # the lane ("default") or the tier ("5s")
    topic: str
    exists: bool
    lag: int
    oldest_age_s: float | None
    partitions: tuple[PartitionLag, ...] = ()  # filled with `per_partition=True`


@dataclass(frozen=True)
class TypeStats:
    """Everything `stream-jobs stats` shows for one job type."""

    job_type: str
    lanes: tuple[TopicLag, ...]
    tiers: tuple[TopicLag, ...]
    dlq_topic: str
    dlq_depth: int | None  # None when the DLQ topic does not exist
    rates: Rates
    workers: tuple[WorkerReport, ...]  # the latest report of each live worker
    shadow: ShadowStats | None = None  # when a `worker --shadow` reads the type's lanes
    rate: RateInForce = NO_LIMIT  # the limit in force (TOML or throttle)
    heartbeats: HeartbeatStats | None = None  # with `heartbeat_interval` in the TOML

    @property
    def lag(self) -> int:
        return sum(lane.lag for lane in self.lanes)

    @property
    def oldest_age_s(self) -> float | None:
        ages = [lane.oldest_age_s for lane in self.lanes if lane.oldest_age_s is not None]
        return max(ages) if ages else None

    @property
    def missing_topics(self) -> list[str]:
        missing = [t.topic for t in (*self.lanes, *self.tiers) if not t.exists]
        return missing + ([self.dlq_topic] if self.dlq_depth is None else [])

    def to_dict(self, *, per_partition: bool) -> dict[str, Any]:
        def topic(t: TopicLag, depth_key: str) -> dict[str, Any]:
            out: dict[str, Any] = {"topic": t.topic, depth_key: t.lag}
            if depth_key == "lag":
                out["oldest_age_s"] = _round(t.oldest_age_s)
            if per_partition:
                out["partitions"] = [
                    {"partition": p.partition, "beginning": p.beginning, "end": p.end,
                     "committed": p.committed, depth_key: p.lag,
                     **({"oldest_age_s": _round(p.oldest_age_s)} if depth_key == "lag" else {})}
                    for p in t.partitions]
            return out

        counts = self.rates.counts
        return {
            "lag": self.lag,
            "oldest_age_s": _round(self.oldest_age_s),
            "lanes": {lane.name: topic(lane, "lag") for lane in self.lanes},
            "tiers": {tier.name: topic(tier, "depth") for tier in self.tiers},
            "dlq": {"topic": self.dlq_topic, "depth": self.dlq_depth},
            "rates": {
                "window_s": self.rates.window_s,
                "per_s": {k: round(v, 3) for k, v in self.rates.per_s().items()},
                "counts": {"done": counts.done, "retried": counts.retried,
                           "dead_lettered": counts.dead_lettered, "expired": counts.expired},
            },
            "workers": {"alive": len(self.workers),
                        "in_flight": sum(w.in_flight for w in self.workers),
                        "ids": [w.worker_id for w in self.workers]},
            "missing_topics": self.missing_topics,
            "shadow": None if self.shadow is None else self.shadow.to_dict(),
            "rate_limit": {
                "per_s": self.rate.per_s, "source": self.rate.source,
                # Live workers that report applying it, and their shares added up.
                "workers_applying": sum(1 for w in self.workers
                                        if w.rate_limit_per_s == self.rate.per_s),
                "share_per_s": _round(sum(w.rate_share_per_s or 0.0 for w in self.workers)),
            },
            "heartbeats": (None if self.heartbeats is None
                           else self.heartbeats.to_dict(per_partition=per_partition)),
        }


@dataclass(frozen=True)
class StatsSnapshot:
    """Stats of the chosen types at `at_ms`."""

    at_ms: int
    prefix: str
    window_s: float
    types: tuple[TypeStats, ...] = field(default_factory=tuple)

    def to_dict(self, *, per_partition: bool = False) -> dict[str, Any]:
        """The `stats --json` document (its shape is in docs/operating/stats.md)."""
        return {
            "at": datetime.fromtimestamp(self.at_ms / 1000, UTC).isoformat(),
            "at_ms": self.at_ms,
            "prefix": self.prefix,
            "window_s": self.window_s,
            "types": {t.job_type: t.to_dict(per_partition=per_partition) for t in self.types},
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# ---------------------------------------------------------------------------------------
# Reading it from Kafka.


async def collect(settings: Settings, types: Mapping[str, JobTypePolicy], *,
                  job_type: str | None = None, per_partition: bool = False,
                  window_s: float = DEFAULT_WINDOW_S,
                  report_interval_s: float = DEFAULT_REPORT_INTERVAL_S) -> StatsSnapshot:
    """Stats of every declared type, or of `job_type` (UnknownJobType if undeclared).

    Cost: two offset requests for all topics, one committed-offsets request per group,
    one small fetch per lagging lane partition, and the `P._stats` reports of the last
    `window_s` plus a few report intervals. Topics that do not exist are reported as
    missing (run `stream-jobs topics apply`), not as an error.
    """
    chosen = ([get_job_type(types, job_type)] if job_type is not None
              else [types[name] for name in sorted(types)])
    prefix = settings.topic_prefix
    async with _peeker(settings) as consumer, admin_client(settings) as admin:
        lanes_of = {p.job_type: p.lane_topics(prefix) for p in chosen}
        tiers_of = {p.job_type: p.tier_topics(prefix) for p in chosen}
        dlq_of = {p.job_type: p.dlq_topic(prefix) for p in chosen}
        names = [t for p in chosen for t in (*lanes_of[p.job_type].values(),
                                              *tiers_of[p.job_type].values(), dlq_of[p.job_type])]
        tps = await _partitions(consumer, names)
        flat = [tp for parts in tps.values() for tp in parts]
        beginnings = await consumer.beginning_offsets(flat) if flat else {}
        ends = await consumer.end_offsets(flat) if flat else {}
        committed: dict[TopicPartition, int | None] = {}
        shadowed: dict[TopicPartition, int | None] = {}
        for policy in chosen:
            name = policy.job_type
            lane_parts = [tp for t in lanes_of[name].values() for tp in tps.get(t, [])]
            committed.update(await committed_offsets(
                admin, worker_group(prefix, name), lane_parts))
            shadowed.update(await committed_offsets(
                admin, shadow_group(prefix, name), lane_parts))
            committed.update(await committed_offsets(
                admin, relay_group(prefix, name),
                [tp for t in tiers_of[name].values() for tp in tps.get(t, [])]))
        lookback_s = window_s + (ALIVE_INTERVALS + 1) * report_interval_s
        report_ranges = await _report_ranges(consumer, prefix,
                                             clock.now_ms() - int(lookback_s * 1000))
        # Reading assigns partitions, after which this consumer's metadata covers only
        # those topics: every offset question is asked above this line.
        lane_tps = [tp for p in chosen for t in lanes_of[p.job_type].values()
                    for tp in tps.get(t, [])]
        heads = {tp: unfinished_from(beginnings[tp], committed.get(tp)) for tp in lane_tps
                 if backlog(beginnings[tp], ends[tp], committed.get(tp)) > 0}
        stamps = await _timestamps_at(consumer, heads, settings.kafka_request_timeout_ms)
        now_ms = clock.now_ms()
        reports, shadow_reports = await _reports(consumer, prefix, report_ranges)
        overrides = await read_overrides(consumer, prefix)

    def topic_lag(name: str, topic: str, *, ages: bool) -> TopicLag:
        parts = []
        for tp in tps.get(topic, []):
            done = committed.get(tp)
            lag = backlog(beginnings[tp], ends[tp], done)
            stamp = stamps.get(tp) if ages and lag else None
            parts.append(PartitionLag(tp.partition, beginnings[tp], ends[tp], done, lag,
                                      None if stamp is None else age_s(now_ms, stamp)))
        ages_s = [p.oldest_age_s for p in parts if p.oldest_age_s is not None]
        return TopicLag(name, topic, topic in tps, sum(p.lag for p in parts),
                        max(ages_s) if ages_s else None, tuple(parts) if per_partition else ())

    def shadow_of(name: str, processed: int) -> ShadowStats | None:
        own = [r for r in shadow_reports if r.job_type == name]
        lane_parts = [tp for t in lanes_of[name].values() for tp in tps.get(t, [])]
        if not own and all(shadowed.get(tp) is None for tp in lane_parts):
            return None  # never shadowed
        lags = {lane: (topic, sum(backlog(beginnings[tp], ends[tp], shadowed.get(tp))
                                  for tp in tps.get(topic, [])))
                for lane, topic in lanes_of[name].items()}
        return shadow_stats(shadow_group(prefix, name), lags, own, worker_processed=processed,
                            now_ms=now_ms, window_s=window_s, alive_intervals=ALIVE_INTERVALS)

    def beats_of(policy: JobTypePolicy, own: list[WorkerReport]) -> HeartbeatStats | None:
        if policy.heartbeat_interval_s is None:
            return None
        lanes = [(tp.topic, tp.partition, backlog(beginnings[tp], ends[tp], committed.get(tp)),
                  None if tp not in stamps else age_s(now_ms, stamps[tp]))
                 for t in lanes_of[policy.job_type].values() for tp in tps.get(t, [])]
        return heartbeat_stats(interval_s=policy.heartbeat_interval_s, lanes=lanes,
                               reported=[r.heartbeats for r in latest_reports(own).values()],
                               now_ms=now_ms)

    result = []
    for policy in chosen:
        name = policy.job_type
        own = [r for r in reports if r.job_type == name]
        rates = rates_from_reports(own, now_ms=now_ms, window_s=window_s)
        dlq = dlq_of[name]
        result.append(TypeStats(
            job_type=name,
            lanes=tuple(topic_lag(lane, t, ages=True) for lane, t in lanes_of[name].items()),
            tiers=tuple(topic_lag(tier, t, ages=False) for tier, t in tiers_of[name].items()),
            dlq_topic=dlq,
            dlq_depth=(sum(ends[tp] - beginnings[tp] for tp in tps[dlq]) if dlq in tps
                       else None),
            rates=rates,
            workers=tuple(alive_workers(own, now_ms=now_ms,
                                        report_interval_s=report_interval_s)),
            shadow=shadow_of(name, rates.counts.total),
            rate=rate_in_force(policy.rate_limit_per_s, overrides.get(name)),
            heartbeats=beats_of(policy, own),
        ))
    return StatsSnapshot(now_ms, prefix, window_s, tuple(result))



def _peeker(settings: Settings) -> AbstractAsyncContextManager[Any]:
    """A group-less consumer with small fetches: reads single records, commits nothing."""
    return scan.reader(settings, client_id="stream-jobs-stats",
                       max_partition_fetch_bytes=_PEEK_FETCH_BYTES,
                       fetch_max_bytes=16 * _PEEK_FETCH_BYTES)


async def _partitions(consumer: Any, topics: Sequence[str]) -> dict[str, list[TopicPartition]]:
    """Partitions of the topics that exist."""
    if any(not consumer.partitions_for_topic(t) for t in topics):
        await consumer._client.force_metadata_update()  # aiokafka learns new topics lazily
    found: dict[str, list[TopicPartition]] = {}
    for topic in topics:
        parts = consumer.partitions_for_topic(topic)
        if parts:
            found[topic] = [TopicPartition(topic, p) for p in sorted(parts)]
    return found


async def committed_offsets(admin: Any, group: str, tps: list[TopicPartition]
                            ) -> dict[TopicPartition, int | None]:
    """The group's committed offset per partition; None where it never committed."""
    if not tps:
        return {}
    try:
        offsets = await admin.list_consumer_group_offsets(group, partitions=tps)
    except KafkaError as exc:
        raise BrokerUnavailable(f"Kafka did not return the offsets of group {group}: "
                                f"{exc}. Is the cluster healthy?") from exc
    # -1: the group has no offset for the partition (it never committed there).
    return {tp: (offsets[tp].offset if tp in offsets and offsets[tp].offset >= 0 else None)
            for tp in tps}


async def _timestamps_at(consumer: Any, heads: Mapping[TopicPartition, int],
                         timeout_ms: int) -> dict[TopicPartition, int]:
    """The timestamp of the record at each given offset (or the first one after it).

    Partitions not answered within `timeout_ms` are left out (their age is unknown).
    """
    if not heads:
        return {}
    consumer.assign(list(heads))
    for tp, offset in heads.items():
        consumer.seek(tp, offset)
    found: dict[TopicPartition, int] = {}
    deadline = time.monotonic() + timeout_ms / 1000
    while len(found) < len(heads) and time.monotonic() < deadline:
        waiting = [tp for tp in heads if tp not in found]
        batches = await consumer.getmany(*waiting, timeout_ms=200)
        for tp, records in batches.items():
            if records and tp not in found:
                found[tp] = int(records[0].timestamp)
                consumer.pause(tp)  # one record is all we wanted: stop prefetching
    return found


async def _report_ranges(consumer: Any, prefix: str, since_ms: int
                         ) -> list[scan.PartitionRange]:
    """What to read of `P._stats`: reports written since `since_ms` (none if no worker
    ever made the topic)."""
    topic = stats_topic(prefix)
    if not consumer.partitions_for_topic(topic):
        await consumer._client.force_metadata_update()
        if not consumer.partitions_for_topic(topic):
            return []
    return await scan.ranges(consumer, topic, from_time_ms=since_ms)


async def _reports(consumer: Any, prefix: str, ranges: list[scan.PartitionRange]
                   ) -> tuple[list[WorkerReport], list[ShadowReport]]:
    found: list[WorkerReport] = []
    shadows: list[ShadowReport] = []
    async for record in scan.scan(consumer, stats_topic(prefix), ranges):
        report = WorkerReport.from_json(record.value)
        if report is not None:
            found.append(report)
            continue
        shadow = ShadowReport.from_json(record.value)
        if shadow is not None:
            shadows.append(shadow)
    return found, shadows


__all__ = [
    "OutcomeCounts",
    "PartitionLag",
    "Rates",
    "StatsSnapshot",
    "TopicLag",
    "TypeStats",
    "age_s",
    "alive_workers",
    "backlog",
    "collect",
    "committed_offsets",
    "rates_from_reports",
    "unfinished_from",
    "window_counts",
]
