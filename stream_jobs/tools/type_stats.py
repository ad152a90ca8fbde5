"""A job type's stats from what one read of Kafka found: lag, oldest age, depths, rates,
live workers, shadow and heartbeats. Pure: no Kafka here (`stream_jobs.tools.stats` reads).

- **lag** of a lane: its end offset minus the committed offset of `P.T.worker` (from the
  beginning offset when the group never committed), summed over partitions;
- **oldest age**: now minus the timestamp of the record at the committed offset, the
  oldest job not yet finished;
- **tier depth**: records in a delay tier not yet relayed (end minus `P.T.relay`'s
  committed offset); **DLQ depth**: records the DLQ holds (end minus beginning), and
  **DLQ counts**: its letters, the distinct jobs they are of and the repeats
  (`stream_jobs.dlq.tally`);
- **rates**: outcomes per second over a window, from the reports every worker publishes
  to `P._stats` (`stream_jobs.runtime.reports`): per worker, its latest report minus its
  latest report at or before the window's start, summed over workers;
- **shadow**: for a type read by `worker --shadow`, the lag of group `P.T.shadow` and
  what the shadows counted, next to what the real workers finished.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from stream_jobs.dlq.tally import DlqCounts
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.kafka import TopicPartition
from stream_jobs.naming import shadow_group
from stream_jobs.outbox.depth import OutboxDepth
from stream_jobs.outcomes import Outcome
from stream_jobs.runtime.heartbeats import HeartbeatStats, heartbeat_stats
from stream_jobs.runtime.reports import ShadowReport, WorkerReport
from stream_jobs.runtime.shadow import ShadowStats, shadow_stats
from stream_jobs.runtime.throttle import NO_LIMIT, RateInForce, RateOverride, rate_in_force

DEFAULT_WINDOW_S = 60.0
# The workers' default report period; a worker is alive while its last report is younger
# than ALIVE_INTERVALS of these and was not its final one.
DEFAULT_REPORT_INTERVAL_S = 5.0
ALIVE_INTERVALS = 3

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
    """Jobs by outcome; `done` is succeeded plus duplicate (finished, nothing to retry).
    `cancelled` and `superseded` finished without running to the end (docs/control.md)."""

    done: int = 0
    retried: int = 0
    dead_lettered: int = 0
    expired: int = 0
    cancelled: int = 0
    superseded: int = 0

    @classmethod
    def of(cls, outcomes: Mapping[str, int]) -> OutcomeCounts:
        return cls(done=outcomes.get(Outcome.SUCCEEDED, 0) + outcomes.get(Outcome.DUPLICATE, 0),
                   retried=outcomes.get(Outcome.RETRIED, 0),
                   dead_lettered=outcomes.get(Outcome.DEAD_LETTERED, 0),
                   expired=outcomes.get(Outcome.EXPIRED, 0),
                   cancelled=outcomes.get(Outcome.CANCELLED, 0),
                   superseded=outcomes.get(Outcome.SUPERSEDED, 0))

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def since(self, earlier: OutcomeCounts) -> OutcomeCounts:
        # Counters are cumulative per worker ID, so a difference is never negative unless
        # reports were reordered; clamp rather than report negative work.
        before = earlier.as_dict()
        return OutcomeCounts(**{k: max(0, v - before[k]) for k, v in self.as_dict().items()})

    def __add__(self, other: OutcomeCounts) -> OutcomeCounts:
        more = other.as_dict()
        return OutcomeCounts(**{k: v + more[k] for k, v in self.as_dict().items()})

    @property
    def total(self) -> int:
        return sum(self.as_dict().values())


@dataclass(frozen=True)
class Rates:
    """Outcomes counted over the last `window_s` seconds, and the same per second."""

    window_s: float
    counts: OutcomeCounts = OutcomeCounts()

    def per_s(self) -> dict[str, float]:
        return {k: v / self.window_s for k, v in self.counts.as_dict().items()}


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
    dlq: DlqCounts | None = None  # letters, jobs and repeats; None without the DLQ topic

    @property
    def dlq_jobs(self) -> int | None:
        """Dead-lettered jobs: distinct job IDs in the DLQ (what an operator counts)."""
        return None if self.dlq is None else self.dlq.jobs

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
            "dlq": {"topic": self.dlq_topic, "depth": self.dlq_depth,
                    **(self.dlq.to_dict() if self.dlq is not None else {})},
            "rates": {
                "window_s": self.rates.window_s,
                "per_s": {k: round(v, 3) for k, v in self.rates.per_s().items()},
                "counts": counts.as_dict(),
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
    # The transactional outbox (from Postgres), or None with why it could not be read.
    outbox: OutboxDepth | None = None
    outbox_problem: str | None = None

    def to_dict(self, *, per_partition: bool = False) -> dict[str, Any]:
        """The `stats --json` document (its shape is in docs/operating/stats.md)."""
        return {
            "at": datetime.fromtimestamp(self.at_ms / 1000, UTC).isoformat(),
            "at_ms": self.at_ms,
            "prefix": self.prefix,
            "window_s": self.window_s,
            "types": {t.job_type: t.to_dict(per_partition=per_partition) for t in self.types},
            "outbox": None if self.outbox is None else self.outbox.to_dict(),
            "outbox_problem": self.outbox_problem,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


@dataclass(frozen=True)
class StatsReading:
    """What one read of Kafka found for the chosen types (`stream_jobs.tools.stats.read`).

    Offsets are of the topics that exist (`partitions` lists them); `committed` holds
    `P.T.worker`'s offsets on the lanes and `P.T.relay`'s on the tiers, `shadowed` those
    of `P.T.shadow` on the lanes; `head_stamps` the timestamp of the oldest unfinished
    record of each lagging lane partition that answered in time.
    """

    at_ms: int
    partitions: Mapping[str, Sequence[TopicPartition]]
    beginnings: Mapping[TopicPartition, int]
    ends: Mapping[TopicPartition, int]
    committed: Mapping[TopicPartition, int | None]
    shadowed: Mapping[TopicPartition, int | None] = field(default_factory=dict)
    head_stamps: Mapping[TopicPartition, int] = field(default_factory=dict)
    reports: Sequence[WorkerReport] = ()
    shadow_reports: Sequence[ShadowReport] = ()
    overrides: Mapping[str, RateOverride] = field(default_factory=dict)
    dlq_counts: Mapping[str, DlqCounts] = field(default_factory=dict)  # by DLQ topic

    def parts(self, topics: Iterable[str]) -> list[TopicPartition]:
        return [tp for t in topics for tp in self.partitions.get(t, ())]

    def lag(self, tp: TopicPartition, committed: Mapping[TopicPartition, int | None]) -> int:
        return backlog(self.beginnings[tp], self.ends[tp], committed.get(tp))


def type_stats(policy: JobTypePolicy, reading: StatsReading, *, prefix: str,
               window_s: float = DEFAULT_WINDOW_S,
               report_interval_s: float = DEFAULT_REPORT_INTERVAL_S,
               per_partition: bool = False) -> TypeStats:
    """Everything `stream-jobs stats` shows for `policy`'s type, from `reading`."""
    name = policy.job_type
    own = [r for r in reading.reports if r.job_type == name]
    rates = rates_from_reports(own, now_ms=reading.at_ms, window_s=window_s)
    dlq = policy.dlq_topic(prefix)
    dlq_parts = reading.partitions.get(dlq)
    return TypeStats(
        job_type=name,
        lanes=tuple(_topic_lag(reading, lane, topic, ages=True, per_partition=per_partition)
                    for lane, topic in policy.worker_topics(prefix).items()),
        tiers=tuple(_topic_lag(reading, tier, topic, ages=False, per_partition=per_partition)
                    for tier, topic in policy.tier_topics(prefix).items()),
        dlq_topic=dlq,
        dlq_depth=(None if dlq_parts is None
                   else sum(reading.ends[tp] - reading.beginnings[tp] for tp in dlq_parts)),
        rates=rates,
        workers=tuple(alive_workers(own, now_ms=reading.at_ms,
                                    report_interval_s=report_interval_s)),
        shadow=_shadow(policy, reading, prefix=prefix, processed=rates.counts.total,
                       window_s=window_s),
        rate=rate_in_force(policy.rate_limit_per_s, reading.overrides.get(name)),
        heartbeats=_heartbeats(policy, reading, own, prefix=prefix),
        dlq=reading.dlq_counts.get(dlq),
    )


def _topic_lag(reading: StatsReading, name: str, topic: str, *, ages: bool,
               per_partition: bool) -> TopicLag:
    parts = []
    for tp in reading.partitions.get(topic, ()):
        done = reading.committed.get(tp)
        lag = reading.lag(tp, reading.committed)
        stamp = reading.head_stamps.get(tp) if ages and lag else None
        parts.append(PartitionLag(tp.partition, reading.beginnings[tp], reading.ends[tp], done,
                                  lag, None if stamp is None else age_s(reading.at_ms, stamp)))
    ages_s = [p.oldest_age_s for p in parts if p.oldest_age_s is not None]
    return TopicLag(name, topic, topic in reading.partitions, sum(p.lag for p in parts),
                    max(ages_s) if ages_s else None, tuple(parts) if per_partition else ())


def _shadow(policy: JobTypePolicy, reading: StatsReading, *, prefix: str, processed: int,
            window_s: float) -> ShadowStats | None:
    name = policy.job_type
    own = [r for r in reading.shadow_reports if r.job_type == name]
    lanes = policy.lane_topics(prefix)
    if not own and all(reading.shadowed.get(tp) is None for tp in reading.parts(lanes.values())):
        return None  # never shadowed
    lags = {lane: (topic, sum(reading.lag(tp, reading.shadowed)
                              for tp in reading.partitions.get(topic, ())))
            for lane, topic in lanes.items()}
    return shadow_stats(shadow_group(prefix, name), lags, own, worker_processed=processed,
                        now_ms=reading.at_ms, window_s=window_s,
                        alive_intervals=ALIVE_INTERVALS)


def _heartbeats(policy: JobTypePolicy, reading: StatsReading, own: list[WorkerReport], *,
                prefix: str) -> HeartbeatStats | None:
    if policy.heartbeat_interval_s is None:
        return None
    stamps = reading.head_stamps
    lanes = [(tp.topic, tp.partition, reading.lag(tp, reading.committed),
              None if tp not in stamps else age_s(reading.at_ms, stamps[tp]))
             for tp in reading.parts(policy.lane_topics(prefix).values())]
    return heartbeat_stats(interval_s=policy.heartbeat_interval_s, lanes=lanes,
                           reported=[r.heartbeats for r in latest_reports(own).values()],
                           now_ms=reading.at_ms)


__all__ = [
    "ALIVE_INTERVALS",
    "DEFAULT_REPORT_INTERVAL_S",
    "DEFAULT_WINDOW_S",
    "OutcomeCounts",
    "PartitionLag",
    "Rates",
    "StatsReading",
    "StatsSnapshot",
    "TopicLag",
    "TypeStats",
    "age_s",
    "alive_workers",
    "backlog",
    "latest_reports",
    "rates_from_reports",
    "type_stats",
    "unfinished_from",
    "window_counts",
]
