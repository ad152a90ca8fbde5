"""How dead letters count: jobs, letters and repeats. Pure.

A job that dies leaves a letter, and one job can leave several: a worker killed after
writing a letter but before committing the job's offset runs the job again, and it dies
again; a requeued job that dies again adds one more. So the DLQ is counted three ways:

- **letters**: records in the DLQ;
- **jobs**: distinct job IDs among them (a letter without a readable ID is its own job);
- **repeats**: letters minus jobs, the letters beyond each job's first.

A job's *newest* letter (`Letter.rank`: most requeued, then latest failure) is the one
listed, shown and requeued. `LetterTally` folds letters in any order into these counts;
`LatestJobs` picks the rows `dlq list` shows. Every reader of the DLQ (`dlq list`, `dlq
requeue`, `stats`, the gateway's dashboard and metrics) counts through this module.
"""

from __future__ import annotations

import heapq
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Generic, TypeVar

from stream_jobs.dlq.letters import Letter

Rank = tuple[int, int, int, int]
Position = tuple[int, int]  # (partition, offset)
Row = TypeVar("Row")


def job_key(letter: Letter) -> str:
    """What makes two letters the same job: the job ID; a letter without one is its own."""
    return letter.job_id or f"\0{letter.partition}/{letter.offset}"


@dataclass(frozen=True)
class DlqCounts:
    """A DLQ, or part of one, counted: `letters` records of `jobs` distinct jobs."""

    letters: int = 0
    jobs: int = 0

    @property
    def repeats(self) -> int:
        """Letters beyond each job's first (a killed worker's, or a requeued job's)."""
        return self.letters - self.jobs

    def to_dict(self) -> dict[str, int]:
        return {"letters": self.letters, "jobs": self.jobs, "repeats": self.repeats}


@dataclass(slots=True)
class JobLetters:
    """One job's letters so far: how many, and its newest (rank, place and reason)."""

    letters: int
    rank: Rank
    position: Position
    reason: str

    @property
    def failed_at_ms(self) -> int:
        return self.rank[1]


class LetterTally:
    """Letters folded into per-job counts. The result does not depend on the read order.

    Holds a few fields per job, never a letter's payload, so a large DLQ fits.
    """

    def __init__(self) -> None:
        self.jobs: dict[str, JobLetters] = {}
        self.letters = 0

    def add(self, letter: Letter) -> bool:
        """Count `letter`; True when it is, so far, the newest letter of its job."""
        self.letters += 1
        key = job_key(letter)
        held = self.jobs.get(key)
        place = (letter.partition, letter.offset)
        if held is None:
            # Reasons repeat across many letters: one string each, not one per job.
            self.jobs[key] = JobLetters(1, letter.rank, place, sys.intern(letter.reason))
            return True
        held.letters += 1
        if (letter.rank, place) <= (held.rank, held.position):
            return False
        held.rank, held.position, held.reason = letter.rank, place, sys.intern(letter.reason)
        return True

    @property
    def counts(self) -> DlqCounts:
        return DlqCounts(self.letters, len(self.jobs))

    def reasons(self) -> dict[str, int]:
        """Jobs per reason of their newest letter, most common first (sums to `jobs`)."""
        return dict(Counter(job.reason for job in self.jobs.values()).most_common())

    def newest(self) -> set[Position]:
        """Where each job's newest letter is."""
        return {job.position for job in self.jobs.values()}


class LatestJobs(Generic[Row]):
    """The `limit` jobs (all with None) whose newest offered letter failed last.

    Offer every letter with `is_newest` from `LetterTally.add`; a job's row is replaced
    when a newer letter of it comes. With `per_letter`, every letter is its own row.
    """

    def __init__(self, limit: int | None, *, per_letter: bool = False) -> None:
        self.limit = limit
        self.per_letter = per_letter
        self._kept: dict[str, tuple[tuple[int, int, int], Row]] = {}
        self._heap: list[tuple[tuple[int, int, int], str]] = []  # may hold stale entries

    def offer(self, letter: Letter, is_newest: bool, row: Row) -> None:
        if self.limit == 0:
            return
        key = f"\0{letter.partition}/{letter.offset}" if self.per_letter else job_key(letter)
        if not (is_newest or self.per_letter):
            return
        order = (letter.failed_at_ms, letter.partition, letter.offset)
        if key not in self._kept and self.limit is not None and len(self._kept) >= self.limit:
            if order <= self._lowest():
                return
            _, evicted = heapq.heappop(self._heap)
            del self._kept[evicted]
        self._kept[key] = (order, row)
        heapq.heappush(self._heap, (order, key))
        if len(self._heap) > 2 * len(self._kept) + 16:
            self._heap = [(order, k) for k, (order, _) in self._kept.items()]
            heapq.heapify(self._heap)

    def _lowest(self) -> tuple[int, int, int]:
        """The order of the least recent kept row, dropping stale heap entries above it."""
        while True:
            order, key = self._heap[0]
            kept = self._kept.get(key)
            if kept is not None and kept[0] == order:
                return order
            heapq.heappop(self._heap)

    def rows(self) -> list[Row]:
        """The kept rows, least recent failure first."""
        return [row for _, row in sorted(self._kept.values(), key=lambda kept: kept[0])]


__all__ = ["DlqCounts", "JobLetters", "LatestJobs", "LetterTally", "Position", "Rank",
           "job_key"]
