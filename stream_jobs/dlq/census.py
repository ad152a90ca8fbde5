"""Counting DLQs in jobs and letters for `stats` and the gateway, read once and kept.

`stream-jobs stats` reads each DLQ once, from its first letter to its end. The gateway
samples stats every few seconds, so it keeps one `DlqCensus` for its lifetime: a
reading then reads only the letters written since the last one. The counts restart
from the first letter when a partition lost letters (a purge, retention) or was
recreated, and after a reading that did not finish.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from stream_jobs.dlq.letters import read_letter
from stream_jobs.dlq.tally import DlqCounts, LetterTally
from stream_jobs.kafka.consumer import Consumer
from stream_jobs.kafka.scan import PartitionRange, scan

# Counting judges no payload (a letter's job ID is in its headers): no size limit applies.
_ANY_PAYLOAD = 2**62


@dataclass
class _Counted:
    tally: LetterTally = field(default_factory=LetterTally)
    began: dict[int, int] = field(default_factory=dict)  # partition -> first offset read
    read_to: dict[int, int] = field(default_factory=dict)  # partition -> next offset
    finished: bool = True


class DlqCensus:
    """Per DLQ topic: its letters folded into jobs so far, and where reading stopped."""

    def __init__(self) -> None:
        self._topics: dict[str, _Counted] = {}

    def to_read(self, topic: str, spans: Sequence[PartitionRange]) -> list[PartitionRange]:
        """What to read of `topic` now that it holds `spans` (first to end offsets)."""
        held = self._topics.get(topic)
        if held is None or not held.finished or any(
                s.start > held.began.get(s.partition, s.start)
                or s.end < held.read_to.get(s.partition, s.start) for s in spans):
            held = self._topics[topic] = _Counted(began={s.partition: s.start for s in spans})
        held.finished = False
        return [PartitionRange(s.partition, held.read_to.get(s.partition, s.start), s.end)
                for s in spans]

    def read(self, topic: str, spans: Sequence[PartitionRange]) -> None:
        """`spans` (from `to_read`) were read to their ends."""
        held = self._topics[topic]
        for s in spans:
            held.began.setdefault(s.partition, s.start)
            held.read_to[s.partition] = s.end
        held.finished = True

    def tally(self, topic: str) -> LetterTally:
        return self._topics[topic].tally

    def counts(self, topic: str) -> DlqCounts | None:
        held = self._topics.get(topic)
        return None if held is None or not held.finished else held.tally.counts

    async def count(self, consumer: Consumer, topic: str, job_type: str,
                    spans: Sequence[PartitionRange]) -> DlqCounts:
        """Read what is new in `topic` with `consumer` (a group-less reader) and count."""
        todo = self.to_read(topic, spans)
        tally = self.tally(topic)
        async for record in scan(consumer, topic, todo):
            tally.add(read_letter(record, job_type, _ANY_PAYLOAD))
        self.read(topic, todo)
        return tally.counts


__all__ = ["DlqCensus"]
