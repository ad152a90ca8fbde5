"""Which priority lane starts the next job: smooth weighted round robin. Pure.

A worker serves a type's lanes (`high`, `default`, `low`) by weight of dispatch slots:
while every lane has jobs ready, starts go 6:3:1 by default, interleaved rather than in
runs (high, default, high, high, low, ... never six highs and then a gap). A lane with
nothing ready is skipped and gains no credit while it waits, so it cannot burst when it
comes back. While lanes stay ready, each gets `weight` of every `sum(weights)` picks,
so `low` never starves while it has jobs.
"""

from __future__ import annotations

from collections.abc import Sequence, Sized

# Dispatch slots per lane while all of them have work (`lane_weights` in topics/T.toml).
DEFAULT_LANE_WEIGHTS: dict[str, int] = {"high": 6, "default": 3, "low": 1}


class LanePicker:
    """Smooth weighted round robin over lanes that have something ready.

    Each pick adds every eligible lane's weight to its credit, takes the lane with the
    most credit (the earlier lane on a tie) and charges it the eligible weights' sum.
    Credits always sum to zero, so no lane's credit runs away. O(lanes) per pick, and
    nothing is allocated.
    """

    __slots__ = ("_credit", "weights")

    def __init__(self, weights: Sequence[int]) -> None:
        if not weights or any(w < 1 for w in weights):
            raise ValueError(f"lane weights must be whole numbers of 1 or more: {weights!r}")
        self.weights = tuple(weights)
        self._credit = [0] * len(self.weights)

    def pick(self, ready: Sequence[Sized]) -> int | None:
        """The index of the lane to start from next, or None when no lane has anything.

        `ready[i]` is lane i's queue of ready work (anything with a length).
        """
        credit = self._credit
        best = -1
        total = 0
        for lane, weight in enumerate(self.weights):
            if not len(ready[lane]):
                continue
            credit[lane] += weight
            total += weight
            if best < 0 or credit[lane] > credit[best]:
                best = lane
        if best < 0:
            return None
        credit[best] -= total
        return best


__all__ = ["DEFAULT_LANE_WEIGHTS", "LanePicker"]
