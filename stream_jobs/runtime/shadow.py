"""Shadow mode: read a type's lanes on real traffic, run nothing, count what is there.

`stream-jobs worker APP --type T --shadow` joins its own consumer group `P.T.shadow`, so
the real workers' group `P.T.worker` and its offsets are never touched. For each record it
checks what the real worker would check before running a handler (the record decodes as a
job of type T, and its payload fits the handler's model when the app has one) and counts
it, by lane and partition, as valid or undecodable. It runs no handler, writes no dead
letter, retry or dedup row; it only commits its own group's offsets and publishes
`ShadowReport`s to `P._stats`, where `stream-jobs stats` compares its counts with the real
group's. That proves a new deployment (image, app, settings, credentials) on real traffic
before it takes over.

The bottom of this module is the pure comparison `stats` shows.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from stream_jobs.clock import now_ms
from stream_jobs.errors import BadRecord
from stream_jobs.handlers import JobHandler
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.kafka.producer import JobProducer
from stream_jobs.naming import shadow_group
from stream_jobs.record import Record, decode_record
from stream_jobs.runtime.dispatch import PartitionWork, Runner
from stream_jobs.runtime.heartbeats import is_heartbeat
from stream_jobs.runtime.idle import IdleWatch, run_until_idle
from stream_jobs.runtime.member import GroupMember
from stream_jobs.runtime.reports import (
    LaneSeen,
    ShadowReport,
    new_worker_id,
    publish,
    publish_every,
)
from stream_jobs.settings import Settings

log = logging.getLogger("stream_jobs.shadow")



class Shadow(GroupMember):
    """Counts a type's lane records as valid jobs or undecodable, in group `P.T.shadow`."""

    def __init__(self, settings: Settings, policy: JobTypePolicy,
                 handler: JobHandler | None = None, *, commit_interval_s: float = 0.5,
                 report_interval_s: float = 5.0, grace_s: float = 10.0) -> None:
        prefix = settings.topic_prefix
        lanes = policy.lane_topics(prefix)
        super().__init__(settings, shadow_group(prefix, policy.job_type), list(lanes.values()),
                         job_type=policy.job_type, producer=JobProducer(settings),
                         concurrency=1, grace_s=grace_s, commit_interval_s=commit_interval_s,
                         max_buffered=256)
        self.policy = policy
        self.handler = handler
        self.lane_of = {topic: lane for lane, topic in lanes.items()}
        self.valid: Counter[tuple[str, int]] = Counter()
        self.undecodable: Counter[tuple[str, int]] = Counter()
        self.undecodable_reasons: Counter[str] = Counter()
        self.worker_id = new_worker_id()
        self.report_interval_s = report_interval_s
        self._started_at_ms = now_ms()
        self._limit = policy.payload_limit(settings)

    # -- counting -----------------------------------------------------------------------

    def dispatch(self, work: PartitionWork, records: list[Record]) -> None:
        # Counting is instant, so each record is finished as it is dispatched: no task,
        # no buffer, and the tracker commits the whole batch.
        for record in records:
            work.dispatched(record.offset)
            self.count(record)
            work.finished(record.offset)

    def chain_of(self, record: Record) -> Hashable:
        return None

    async def handle(self, work: PartitionWork, record: Record, runner: Runner) -> None:
        self.count(record)  # not reached: `dispatch` counts each record itself

    def count(self, record: Record) -> None:
        if is_heartbeat(record.key, record.headers):
            return  # the workers' own liveness records, not jobs: the workers skip them too
        where = (self.lane_of.get(record.topic, record.topic), record.partition)
        try:
            job = decode_record(key=record.key, value=record.value, headers=record.headers,
                                expected_type=self.policy.job_type,
                                max_payload_bytes=self._limit,
                                check_json=self.handler is None)
            if self.handler is not None:
                self.handler.parse_payload(job.payload)  # the model check, not the handler
        except BadRecord as bad:
            self.undecodable[where] += 1
            self.undecodable_reasons[bad.reason] += 1
            return
        self.valid[where] += 1

    def seen(self) -> dict[str, dict[int, LaneSeen]]:
        """What this shadow counted, by lane and partition."""
        lanes: dict[str, dict[int, LaneSeen]] = {}
        for lane, partition in sorted({*self.valid, *self.undecodable}):
            lanes.setdefault(lane, {})[partition] = LaneSeen(
                self.valid[(lane, partition)], self.undecodable[(lane, partition)])
        return lanes

    # -- running ------------------------------------------------------------------------

    async def run(self, *, until_idle: bool = False) -> None:
        """Count until `request_stop()`; with `until_idle`, until every lane is read to its
        end and committed."""
        await self.producer.start()
        try:
            await self.start()
            reporter = asyncio.create_task(self._report_every())
            try:
                if until_idle:
                    await run_until_idle(IdleWatch([self]), self._loop, self.request_stop)
                else:
                    await self._loop()
            finally:
                await self.stop()
                reporter.cancel()
                await asyncio.gather(reporter, return_exceptions=True)
                await self._report(final=True)
        finally:
            await self.producer.stop()

    def request_stop(self) -> None:
        """Ask `run` to stop (safe from a signal handler on the loop)."""
        self.stopping.set()

    async def _loop(self) -> None:
        while not self.stopping.is_set():
            await self.poll_once()

    # -- idleness (what `stream_jobs.runtime.idle` reads) -----------------------------------

    def busy(self) -> bool:
        return False  # each record is counted as it is fetched: nothing stays in memory

    def intake(self) -> int:
        return self.taken_in

    async def drained(self) -> bool:
        """Every lane read to its end, and committed (by the polls)."""
        return await self.caught_up()

    def report(self, *, final: bool = False) -> ShadowReport:
        return ShadowReport(
            job_type=self.policy.job_type, worker_id=self.worker_id, at_ms=now_ms(),
            started_at_ms=self._started_at_ms, lanes=self.seen(),
            # Plain strings: orjson refuses the Reason enum as a dict key.
            undecodable_reasons={str(k): v for k, v in self.undecodable_reasons.items()},
            final=final,
            interval_s=self.report_interval_s)

    async def _report_every(self) -> None:
        await publish_every(self.settings, self.producer, self.worker_id, self.report,
                            self.report_interval_s)

    async def _report(self, *, final: bool = False) -> None:
        await publish(self.settings, self.producer, self.worker_id, self.report(final=final))


# ---------------------------------------------------------------------------------------
# The comparison `stream-jobs stats` shows (pure).


@dataclass(frozen=True)
class ShadowLane:
    """One lane as the shadow group sees it: its lag, and what the shadows counted."""

    name: str
    topic: str
    lag: int  # end offset minus the shadow group's committed offset
    valid: int
    undecodable: int


@dataclass(frozen=True)
class ShadowStats:
    """The shadow group of a type next to its real group.

    `window_seen` (records the shadows read in the window) is comparable with
    `worker_processed` (jobs the real workers finished in the same window, every outcome):
    both count each delivery through a lane, retries included. Lane counts are the sums
    of each reporting shadow's counters since it started.
    """

    group: str
    lanes: tuple[ShadowLane, ...]
    window_seen: int
    window_undecodable: int
    worker_processed: int
    shadows: tuple[str, ...]  # shadows alive (reported recently, not their final report)
    undecodable_reasons: Mapping[str, int]

    @property
    def lag(self) -> int:
        return sum(lane.lag for lane in self.lanes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "lag": self.lag,
            "alive": len(self.shadows),
            "ids": list(self.shadows),
            "window": {"seen": self.window_seen, "undecodable": self.window_undecodable,
                       "worker_processed": self.worker_processed},
            "lanes": {lane.name: {"topic": lane.topic, "lag": lane.lag, "valid": lane.valid,
                                  "undecodable": lane.undecodable} for lane in self.lanes},
            "undecodable_reasons": dict(self.undecodable_reasons),
        }


def _totals(report: ShadowReport) -> tuple[int, int]:
    return report.valid + report.undecodable, report.undecodable


def shadow_window(reports: Iterable[ShadowReport], *, now_ms: int,
                  window_s: float) -> tuple[int, int]:
    """(records seen, of them undecodable) by the shadows in the window ending at `now_ms`.

    Per shadow, as for worker rates: its latest report minus its latest report at or
    before the window's start (zero if it started inside the window, else its oldest).
    """
    start_ms = now_ms - int(window_s * 1000)
    by_shadow: dict[str, list[ShadowReport]] = {}
    for report in reports:
        by_shadow.setdefault(report.worker_id, []).append(report)
    seen = bad = 0
    for own in by_shadow.values():
        own.sort(key=lambda r: r.at_ms)
        latest = _totals(own[-1])
        before = [r for r in own if r.at_ms <= start_ms]
        if before:
            base = _totals(before[-1])
        elif own[-1].started_at_ms >= start_ms:
            base = (0, 0)
        else:
            base = _totals(own[0])
        seen += max(0, latest[0] - base[0])
        bad += max(0, latest[1] - base[1])
    return seen, bad


def shadow_stats(group: str, lanes: Mapping[str, tuple[str, int]],
                 reports: Iterable[ShadowReport], *, worker_processed: int, now_ms: int,
                 window_s: float, alive_intervals: int = 3) -> ShadowStats:
    """The comparison for one type. `lanes`: lane -> (topic, shadow group's lag)."""
    reports = list(reports)
    latest: dict[str, ShadowReport] = {}
    for report in reports:
        if report.worker_id not in latest or report.at_ms >= latest[report.worker_id].at_ms:
            latest[report.worker_id] = report
    valid: Counter[str] = Counter()
    bad: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for report in latest.values():
        for lane, parts in report.lanes.items():
            valid[lane] += sum(s.valid for s in parts.values())
            bad[lane] += sum(s.undecodable for s in parts.values())
        reasons.update(report.undecodable_reasons)
    seen, undecodable = shadow_window(reports, now_ms=now_ms, window_s=window_s)
    alive = sorted(r.worker_id for r in latest.values() if not r.final
                   and now_ms - r.at_ms <= alive_intervals * r.interval_s * 1000)
    return ShadowStats(
        group=group,
        lanes=tuple(ShadowLane(name, topic, lag, valid[name], bad[name])
                    for name, (topic, lag) in lanes.items()),
        window_seen=seen, window_undecodable=undecodable, worker_processed=worker_processed,
        shadows=tuple(alive), undecodable_reasons=dict(reasons))


__all__ = ["Shadow", "ShadowLane", "ShadowStats", "shadow_stats", "shadow_window"]
