"""The order of a page and where the next one starts. Pure.

`PageMerge` merges the partitions of a type's lanes (or tiers) into one page: each
partition is read in offset order, and the next row is always the head, of all the
partitions' heads, that comes first (due time in the tiers, append time in the lanes).
What a page takes of each partition is therefore a run from its cursor on, and the
next page's cursor is simply the offset after it. A partition whose read rows are all
used up must be read further before anything else is taken (its next record may come
first), so the merge says which partitions it needs (`wanting`), and its reader feeds
them (`feed`). Rows of another list (a tier holds both scheduled and retrying jobs) are
passed over: they move the cursor, never onto the page.

`newest_dead` pages the dead jobs, newest failure first, after the last one shown.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Mapping

from stream_jobs.dlq.tally import JobLetters
from stream_jobs.waiting.cursor import Slot
from stream_jobs.waiting.rows import DeadRow, State, WaitingRow


class PageMerge:
    """One page of `size` rows of the list `state`, from `positions` up to `ends`."""

    def __init__(self, state: State, size: int, positions: Mapping[Slot, int],
                 ends: Mapping[Slot, int]) -> None:
        self.state = state
        self.size = size
        self.ends = dict(ends)
        self.read_to = {slot: min(offset, self.ends[slot]) for slot, offset in positions.items()}
        self._next = dict(self.read_to)  # the offset after the last row used, per slot
        self._buffers: dict[Slot, deque[WaitingRow]] = {slot: deque() for slot in self.ends}
        self.rows: list[WaitingRow] = []

    def wanting(self) -> list[Slot]:
        """The slots to read further before the merge can go on."""
        return sorted(slot for slot, rows in self._buffers.items()
                      if not rows and self.read_to[slot] < self.ends[slot])

    def feed(self, slot: Slot, rows: Iterable[WaitingRow], read_to: int) -> None:
        """`rows`, the records of `slot` from its last read to `read_to` (exclusive)."""
        self._buffers[slot].extend(rows)
        self.read_to[slot] = read_to

    @property
    def full(self) -> bool:
        return len(self.rows) >= self.size

    @property
    def exhausted(self) -> bool:
        """Every slot was read to its end, and every row read is used."""
        return not any(self._buffers.values()) and all(
            self.read_to[slot] >= end for slot, end in self.ends.items())

    def take(self) -> None:
        """Take rows onto the page until it is full, or a slot must be read first."""
        while not self.full and not self.wanting():
            heads = [(rows[0].order, slot) for slot, rows in self._buffers.items() if rows]
            if not heads:
                return
            _, slot = min(heads)
            row = self._buffers[slot].popleft()
            self._next[slot] = row.offset + 1
            if row.state == self.state:
                self.rows.append(row)

    def positions(self) -> dict[Slot, int]:
        """Where the next page starts: after each slot's last used row, or, where every
        row read is used, where reading stopped."""
        return {slot: (self._next[slot] if self._buffers[slot] else self.read_to[slot])
                for slot in self.ends}


def newest_dead(jobs: Mapping[str, JobLetters], size: int,
                after: tuple[int, int, int] | None) -> list[DeadRow]:
    """The `size` jobs that failed last, of those that come after `after` (newest first);
    `jobs` as `LetterTally.jobs` holds them. Rows are made for the page's jobs only."""
    def place(item: tuple[str, JobLetters]) -> tuple[int, int, int]:
        job = item[1]
        return (job.failed_at_ms, job.position[0], job.position[1])

    items: Iterable[tuple[str, JobLetters]] = jobs.items()
    if after is not None:
        items = (item for item in items if place(item) < after)
    return [DeadRow.of(key, job) for key, job in heapq.nlargest(size, items, key=place)]


__all__ = ["PageMerge", "newest_dead"]
