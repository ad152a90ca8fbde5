"""Read a range of a topic without a consumer group: for the DLQ tools, replay and stats.

A scan takes a snapshot of the end offsets when it starts and stops there, so it
terminates on a topic that is still being written.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from stream_jobs.errors import ConfigError
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.consumer import Consumer
from stream_jobs.record import Record


@dataclass(frozen=True)
class PartitionRange:
    """Offsets [start, end) of one partition."""

    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


async def partitions_of(consumer: Consumer, topic: str) -> list[int]:
    """The partitions of `topic`; ConfigError when it does not exist."""
    # The whole cluster's metadata: once a reader has assigned partitions, its own metadata
    # covers only the topics it reads, so other topics would look missing.
    found = await consumer.cluster_partitions(topic)
    if not found:
        raise ConfigError(f"Topic {topic!r} does not exist: check the name with "
                          "`stream-jobs topics list`.")
    return sorted(found)


async def ranges(consumer: Consumer, topic: str, *, partitions: Sequence[int] | None = None,
                 from_offset: int | None = None, to_offset: int | None = None,
                 from_time_ms: int | None = None, to_time_ms: int | None = None,
                 ) -> list[PartitionRange]:
    """The offset range to read per partition, checked against what the topic holds.

    Offsets are per partition; times select by record timestamp. An offset outside what
    the partition holds is a ConfigError naming the range that exists.
    """
    existing = await partitions_of(consumer, topic)
    chosen = existing if partitions is None else list(partitions)
    for p in chosen:
        if p not in existing:
            raise ConfigError(f"Topic {topic!r} has partitions 0-{existing[-1]}; there is no "
                              f"partition {p}.")
    tps = [TopicPartition(topic, p) for p in chosen]
    firsts = await consumer.beginning_offsets(tps)
    ends = await consumer.end_offsets(tps)
    starts_by_time = await _offsets_at(consumer, tps, from_time_ms)
    ends_by_time = await _offsets_at(consumer, tps, to_time_ms)
    result = []
    for tp in tps:
        first, end = firsts[tp], ends[tp]
        start = first
        if from_offset is not None:
            if not first <= from_offset <= end:
                raise ConfigError(f"Offset {from_offset} is out of range for {topic} partition "
                                  f"{tp.partition}, which holds offsets {first} to {end - 1}.")
            start = from_offset
        stop = end
        if to_offset is not None:
            if to_offset < start:
                raise ConfigError(f"--to-offset {to_offset} is before the start {start}.")
            stop = min(end, to_offset + 1)  # inclusive, as operators say it
        if tp in starts_by_time:
            start = max(start, starts_by_time[tp])
        if tp in ends_by_time:
            stop = min(stop, ends_by_time[tp])
        result.append(PartitionRange(tp.partition, start, max(start, stop)))
    return result


async def _offsets_at(consumer: Consumer, tps: list[TopicPartition],
                      time_ms: int | None) -> dict[TopicPartition, int]:
    """The first offset at or after `time_ms` per partition (the end when none is)."""
    if time_ms is None:
        return {}
    found = await consumer.offsets_for_times({tp: time_ms for tp in tps})
    ends = await consumer.end_offsets(tps)
    return {tp: (at if (at := found.get(tp)) is not None else ends[tp]) for tp in tps}


async def scan(consumer: Consumer, topic: str, selected: Sequence[PartitionRange]
               ) -> AsyncIterator[Record]:
    """Every record in the ranges, partition by partition, in offset order."""
    for part in selected:
        if part.size == 0:
            continue
        tp = TopicPartition(topic, part.partition)
        consumer.assign([tp])
        consumer.seek(tp, part.start)
        done = False
        while not done:
            batches = await consumer.getmany(tp, timeout_ms=10_000, max_records=500)
            if not batches:
                raise ConfigError(f"{topic} partition {part.partition} returned nothing for "
                                  "10 s before the end of the range; is the broker healthy?")
            for record in batches.get(tp, []):
                if record.offset >= part.end:
                    done = True
                    break
                yield record
            if await consumer.position(tp) >= part.end:
                done = True
