"""Heartbeats through every partition of a type's lanes, and how late is stuck.

With `heartbeat_interval = "5s"` in `topics/T.toml`, every worker of T writes a small
heartbeat record into every partition of every lane of T once per interval. Workers
acknowledge a heartbeat as soon as it is fetched (no handler, no concurrency slot, no
rate-limit token, no outcome) and note, per partition, the write time of the newest one
they processed; their reports to `P._stats` carry it. `stream-jobs stats` then calls a
partition **stuck** when the newest heartbeat processed on it is older than
`STUCK_INTERVALS` intervals: nobody is fetching it (a hung or stopped worker, or none at
all), or it is so far behind that records written two intervals ago are still waiting.
An idle partition keeps its heartbeats fresh, so it is never stuck.

Every worker sends (no election): a stopped worker then takes only its own partitions'
heartbeats with it, and the cost is workers x partitions x lanes small records per
interval. Workers report at least every quarter interval while heartbeats are on, so a
report's age never makes a healthy partition look late. Pure, apart from `send_heartbeats`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from stream_jobs.errors import StreamJobsError
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.clients import Producer

log = logging.getLogger("stream_jobs.heartbeats")

HEARTBEAT_KEY = b"sj-heartbeat"
HEADER_HEARTBEAT = "sj-heartbeat"
# A heartbeat older than this many intervals means the partition is stuck.
STUCK_INTERVALS = 2
# While heartbeats are on, a worker reports at least this many times per interval.
REPORTS_PER_INTERVAL = 4


def is_heartbeat(key: bytes | None, headers: Sequence[tuple[str, bytes]]) -> bool:
    """Whether a lane record is a heartbeat rather than a job (the key is checked first:
    one comparison for a job). Garbled headers (not pairs, not a list) make it a bad
    record, never an error here."""
    return key == HEARTBEAT_KEY and any(
        isinstance(item, tuple) and len(item) == 2 and item[0] == HEADER_HEARTBEAT
        for item in headers or ())


def heartbeat_value(sender: str, now_ms: int) -> bytes:
    return orjson.dumps({"heartbeat": sender, "at_ms": now_ms})


def report_interval_s(report_interval_s: float, heartbeat_interval_s: float | None) -> float:
    """How often a worker reports: its own period, shortened while heartbeats are on."""
    if heartbeat_interval_s is None:
        return report_interval_s
    return min(report_interval_s, heartbeat_interval_s / REPORTS_PER_INTERVAL)


@dataclass(frozen=True)
class PartitionBeat:
    """One lane partition's heartbeat: when the newest one processed was written, and
    what that says (`state`): "idle" or "busy" (heartbeats on time; nothing has waited
    longer than `STUCK_INTERVALS` intervals / something has), "stuck" (late), or
    "unknown" (none seen, nothing waiting)."""

    topic: str
    partition: int
    last_ms: int | None
    age_s: float | None
    state: str


def beat_state(*, now_ms: int, last_ms: int | None, interval_s: float, lag: int,
               oldest_age_s: float | None = None) -> str:
    """The `PartitionBeat.state` of a partition (see there). `lag` and `oldest_age_s` are
    what waits behind the worker group (heartbeats written since its last commit count)."""
    if last_ms is None:
        # No worker reported a heartbeat here: with records waiting, nobody is on it.
        return "stuck" if lag > 0 else "unknown"
    if now_ms - last_ms > STUCK_INTERVALS * interval_s * 1000:
        return "stuck"
    # Heartbeats written since the worker's last commit are lag too: lag younger than
    # the stuck threshold is idle.
    if lag == 0 or (oldest_age_s is not None
                    and oldest_age_s <= STUCK_INTERVALS * interval_s):
        return "idle"
    return "busy"


@dataclass(frozen=True)
class HeartbeatStats:
    """A type's heartbeats as `stream-jobs stats` shows them."""

    interval_s: float
    partitions: tuple[PartitionBeat, ...]

    @property
    def stuck(self) -> tuple[PartitionBeat, ...]:
        return tuple(p for p in self.partitions if p.state == "stuck")

    def to_dict(self, *, per_partition: bool) -> dict[str, Any]:
        def beat(p: PartitionBeat) -> dict[str, Any]:
            return {"topic": p.topic, "partition": p.partition, "state": p.state,
                    "age_s": None if p.age_s is None else round(p.age_s, 3)}

        out: dict[str, Any] = {
            "interval_s": self.interval_s,
            "stuck_after_s": STUCK_INTERVALS * self.interval_s,
            "stuck": [beat(p) for p in self.stuck],
        }
        if per_partition:
            out["partitions"] = [beat(p) for p in self.partitions]
        return out


def heartbeat_stats(*, interval_s: float,
                    lanes: Sequence[tuple[str, int, int, float | None]],
                    reported: Sequence[Sequence[tuple[str, int, int]]],
                    now_ms: int) -> HeartbeatStats:
    """Every lane partition's `PartitionBeat`: `lanes` holds (topic, partition, lag,
    oldest age in seconds),
    `reported` the `heartbeats` of each worker's latest report (live or not: a stopped
    worker's last word is the newest news of its partitions)."""
    newest = newest_beats(reported)
    beats = []
    for topic, partition, lag, oldest_age_s in lanes:
        last = newest.get((topic, partition))
        beats.append(PartitionBeat(
            topic, partition, last, None if last is None else max(0, now_ms - last) / 1000,
            beat_state(now_ms=now_ms, last_ms=last, interval_s=interval_s, lag=lag,
                       oldest_age_s=oldest_age_s)))
    return HeartbeatStats(interval_s, tuple(beats))


def newest_beats(entries: Sequence[Sequence[tuple[str, int, int]]]
                 ) -> dict[tuple[str, int], int]:
    """The newest heartbeat per (topic, partition) over several workers' reports."""
    newest: dict[tuple[str, int], int] = {}
    for report in entries:
        for topic, partition, at_ms in report:
            if at_ms > newest.get((topic, partition), -1):
                newest[(topic, partition)] = at_ms
    return newest


async def send_heartbeats(producer: Producer, partitions: Sequence[TopicPartition],
                          sender: str, now_ms: int) -> int:
    """Write one heartbeat into each partition, pipelined; how many the broker took."""
    value = heartbeat_value(sender, now_ms)
    headers = [(HEADER_HEARTBEAT, sender.encode())]
    results = await asyncio.gather(
        *(producer.send_raw(tp.topic, HEARTBEAT_KEY, value, headers, partition=tp.partition)
          for tp in partitions), return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    for error in failed[:1]:
        if not isinstance(error, StreamJobsError):
            raise error
        log.warning("%d heartbeats not written: %s", len(failed), error)
    return len(results) - len(failed)


__all__ = [
    "HEADER_HEARTBEAT",
    "HEARTBEAT_KEY",
    "STUCK_INTERVALS",
    "HeartbeatStats",
    "PartitionBeat",
    "beat_state",
    "heartbeat_stats",
    "heartbeat_value",
    "is_heartbeat",
    "newest_beats",
    "report_interval_s",
    "send_heartbeats",
]
