"""Handler durations as a fixed-bucket histogram, cheap enough for every job. Pure.

A worker with metrics on records each handler run here (a bisect and two additions);
`stream_jobs.runtime.metrics` turns the counts into a Prometheus histogram when scraped, so the
job path never touches a lock or a label lookup.
"""

from __future__ import annotations

from bisect import bisect_left

# Upper bounds in seconds, from a no-op handler (well under a millisecond) to the
# default 30 s timeout and past it.
DURATION_BUCKETS_S: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0,
)


class DurationHistogram:
    """Counts of durations per bucket (`le` semantics: a duration equal to a bound
    counts in that bound's bucket), their sum, and how many there were."""

    __slots__ = ("bounds", "counts", "sum_s")

    def __init__(self, bounds: tuple[float, ...] = DURATION_BUCKETS_S) -> None:
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError("bucket bounds must be distinct and increasing")
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum_s = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.sum_s += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or under it) per bucket, ending with +Inf."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


__all__ = ["DURATION_BUCKETS_S", "DurationHistogram"]
