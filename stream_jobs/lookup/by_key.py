"""`stream-jobs job --key K --type T`: the jobs whose records carry the Kafka key `K` in a
type's lanes, delay tiers and DLQ.

A bounded scan like the lookup's: at most `max_records_per_topic` records per topic,
shared between its partitions, and the newest ones (a key asked about is most often a
recent job's). When a topic holds more, the answer says so (`complete` is False): older
jobs with the key may exist. Each job is listed once, with the first and latest time a
record of it was written and the topic of its latest record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from stream_jobs.job_types import JobTypePolicy
from stream_jobs.kafka import scan
from stream_jobs.kafka.consumer import open_reader
from stream_jobs.lookup.locate import DEFAULT_MAX_RECORDS_PER_TOPIC, topics_of
from stream_jobs.record import HEADER_JOB_ID
from stream_jobs.settings import Settings

MAX_KEY_BYTES = 4_096


@dataclass(frozen=True)
class KeyedJob:
    """One job whose records carry the key."""

    job_id: str
    first_ms: int
    latest_ms: int
    latest_topic: str
    records: int


@dataclass(frozen=True)
class KeyMatches:
    """The jobs found with a key, oldest first, and how much was read."""

    key: str
    job_type: str
    jobs: tuple[KeyedJob, ...] = ()
    scanned_records: int = 0
    complete: bool = True  # False: a topic held more than the cap, older jobs may be missed
    max_records_per_topic: int = DEFAULT_MAX_RECORDS_PER_TOPIC
    notes: tuple[str, ...] = field(default=())

    def summary(self) -> str:
        found = len(self.jobs)
        jobs = "no job" if not found else ("1 job" if found == 1 else f"{found:,} jobs")
        head = (f"{jobs} of type {self.job_type} with key {self.key!r} in "
                f"{self.scanned_records:,} records read")
        if self.complete:
            return head + "."
        return (head + f"; the scan read only the newest {self.max_records_per_topic:,} "
                "records of a topic that holds more, so older jobs with this key may be "
                "missing.")

    def to_dict(self) -> dict[str, object]:
        return {"key": self.key, "job_type": self.job_type, "complete": self.complete,
                "scanned_records": self.scanned_records, "summary": self.summary(),
                "jobs": [vars(job) for job in self.jobs]}


def newest(ranges: Sequence[scan.PartitionRange], max_records: int
           ) -> tuple[list[scan.PartitionRange], bool]:
    """The ranges cut to their newest records, `max_records` shared between partitions,
    and whether anything was cut."""
    if not ranges:
        return [], False
    each = max(1, max_records // len(ranges))
    cut = [scan.PartitionRange(r.partition, max(r.start, r.end - each), r.end) for r in ranges]
    return cut, any(c.start > r.start for c, r in zip(cut, ranges, strict=True))


async def find_by_key(settings: Settings, policy: JobTypePolicy, key: str, *,
                      max_records_per_topic: int = DEFAULT_MAX_RECORDS_PER_TOPIC
                      ) -> KeyMatches:
    """The jobs of `policy`'s type whose records carry the Kafka key `key` (UTF-8)."""
    wanted = key.encode()
    seen: dict[str, KeyedJob] = {}
    scanned, complete = 0, True
    async with open_reader(settings) as consumer:
        await consumer.refresh_metadata()
        plans = []
        for topic, _, _, _ in topics_of(settings.topic_prefix, policy):
            if not consumer.partitions_for_topic(topic):
                continue  # never applied: nothing to find there
            ranges, cut = newest(await scan.ranges(consumer, topic), max_records_per_topic)
            complete = complete and not cut
            plans.append((topic, ranges))
        for topic, ranges in plans:
            async for record in scan.scan(consumer, topic, ranges):
                scanned += 1
                if record.key != wanted:
                    continue
                job_id = _job_id(record.headers)
                if job_id is None:
                    continue
                before = seen.get(job_id)
                at = int(record.timestamp)
                seen[job_id] = (KeyedJob(job_id, at, at, topic, 1) if before is None else
                                KeyedJob(job_id, min(before.first_ms, at),
                                         max(before.latest_ms, at),
                                         topic if at >= before.latest_ms else before.latest_topic,
                                         before.records + 1))
    jobs = tuple(sorted(seen.values(), key=lambda job: (job.first_ms, job.job_id)))
    return KeyMatches(key, policy.job_type, jobs, scanned, complete, max_records_per_topic)


def _job_id(headers: Sequence[tuple[str, bytes]] | None) -> str | None:
    for name, value in headers or ():
        if name == HEADER_JOB_ID and isinstance(value, bytes):
            return value.decode(errors="replace")
    return None


__all__ = ["MAX_KEY_BYTES", "KeyMatches", "KeyedJob", "find_by_key", "newest"]
