"""Which offset of one partition is safe to commit while jobs finish out of order.

Jobs from one partition run concurrently and finish in any order, but a commit says
"everything below this offset is done". So the committable position is the lowest
offset still running; committing the highest finished offset instead would lose the
jobs below it on a crash or rebalance.

The tracker works on the offsets actually delivered, not on `range(lo, hi)`: compaction,
transaction markers and aborted records leave gaps that are never delivered.
"""

from __future__ import annotations

from collections import deque


class OffsetTracker:
    """The committable position of one partition. Every operation is amortised O(1)."""

    __slots__ = ("_committed", "_next", "_order", "_running")

    def __init__(self, position: int) -> None:
        """Start from `position`, the partition's committed offset (the next to read)."""
        if position < 0:
            raise ValueError(f"offset position {position} is negative")
        self._next = position  # one past the highest dispatched offset, or the start
        self._committed = position
        # Dispatched offsets in order; finished ones are dropped once they reach the front.
        self._order: deque[int] = deque()
        self._running: set[int] = set()

    def dispatched(self, offset: int) -> None:
        """Record that `offset` was handed to a handler. Offsets must strictly increase."""
        if offset < self._next:
            raise ValueError(
                f"offset {offset} is below {self._next}, the lowest this tracker accepts; "
                "offsets must strictly increase from the start position"
            )
        self._order.append(offset)
        self._running.add(offset)
        self._next = offset + 1

    def finished(self, offset: int) -> None:
        """Record that the job at `offset` is done (in any order). Each offset finishes once."""
        try:
            self._running.remove(offset)
        except KeyError:
            raise ValueError(f"offset {offset} is not in flight") from None
        order = self._order
        while order and order[0] not in self._running:
            order.popleft()

    @property
    def position(self) -> int:
        """The offset to commit: the lowest unfinished one, or one past everything done."""
        return self._order[0] if self._order else self._next

    @property
    def in_flight(self) -> int:
        """How many dispatched offsets have not finished."""
        return len(self._running)

    @property
    def needs_commit(self) -> bool:
        """Whether `position` has moved since the last `mark_committed`."""
        return self.position != self._committed

    @property
    def committed(self) -> int:
        """The position last passed to `mark_committed` (the start position at first)."""
        return self._committed

    def mark_committed(self, position: int) -> None:
        """Record that the broker accepted a commit of `position` (read from `.position`)."""
        if position > self.position:
            raise ValueError(
                f"commit position {position} is past the lowest unfinished offset {self.position}"
            )
        self._committed = position
