"""What one window holds: jobs by outcome, and handler durations and dwell times as
fixed-bucket histograms. Pure.

A `Tally` is what a worker counts per slot of time (its reports carry one per slot,
cumulative within the slot), what the history process adds up per window, and what the
readers turn into rates and percentiles. Adding and subtracting tallies is exact; a
percentile is read off the buckets, so it is exact to the bucket it falls in (the bucket's
upper bound is reported, as Prometheus' `histogram_quantile` would interpolate inside it).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stream_jobs.histogram import DURATION_BUCKETS_S

# How long a job waited between being due (enqueued, or its delay over) and its run's
# start: from no wait to a day-old backlog.
DWELL_BUCKETS_S: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
    900.0, 3600.0, 4 * 3600.0, 86400.0,
)

# Outcomes that count as a failed attempt in a window's failure ratio.
FAILED = ("retried", "dead_lettered")


def _buckets(bounds: tuple[float, ...]) -> list[int]:
    return [0] * (len(bounds) + 1)  # the last one is +Inf


@dataclass
class Tally:
    """Counts of one window (or one slot of one worker)."""

    outcomes: dict[str, int] = field(default_factory=dict)
    durations: list[int] = field(default_factory=lambda: _buckets(DURATION_BUCKETS_S))
    dwells: list[int] = field(default_factory=lambda: _buckets(DWELL_BUCKETS_S))

    # -- counting (a worker's slot) ------------------------------------------------------------

    def observe(self, duration_s: float, dwell_s: float) -> None:
        """One run's handler duration and the time its job waited before it."""
        self.durations[bisect_left(DURATION_BUCKETS_S, duration_s)] += 1
        self.dwells[bisect_left(DWELL_BUCKETS_S, max(dwell_s, 0.0))] += 1

    # -- arithmetic ----------------------------------------------------------------------------

    def plus(self, other: Tally) -> Tally:
        return Tally(_add(self.outcomes, other.outcomes, 1),
                     [a + b for a, b in zip(self.durations, other.durations, strict=True)],
                     [a + b for a, b in zip(self.dwells, other.dwells, strict=True)])

    def minus(self, earlier: Tally) -> Tally:
        """What was counted since `earlier`. A worker's counts never go down, so a count
        smaller than before adds nothing (an older report read again)."""
        return Tally({k: n for k, n in _add(self.outcomes, earlier.outcomes, -1).items() if n > 0},
                     [max(a - b, 0) for a, b in zip(self.durations, earlier.durations,
                                                    strict=True)],
                     [max(a - b, 0) for a, b in zip(self.dwells, earlier.dwells, strict=True)])

    @property
    def empty(self) -> bool:
        return not any(self.outcomes.values()) and not any(self.durations) \
            and not any(self.dwells)

    # -- reading -------------------------------------------------------------------------------

    @property
    def finished(self) -> int:
        return sum(self.outcomes.values())

    @property
    def failed(self) -> int:
        return sum(self.outcomes.get(name, 0) for name in FAILED)

    def duration_s(self, q: float) -> float | None:
        """The `q` quantile (0 < q <= 1) of handler durations, or None without runs."""
        return quantile(self.durations, DURATION_BUCKETS_S, q)

    def dwell_s(self, q: float) -> float | None:
        return quantile(self.dwells, DWELL_BUCKETS_S, q)

    # -- the wire (JSON in reports, the history topic and the table) ---------------------------

    def to_obj(self) -> dict[str, Any]:
        return {"outcomes": {k: v for k, v in self.outcomes.items() if v},
                "durations": self.durations, "dwells": self.dwells}

    @classmethod
    def from_obj(cls, raw: object) -> Tally:
        """The tally in `raw`; ValueError for anything that is not one."""
        if not isinstance(raw, Mapping):
            raise ValueError(f"a tally is an object, not {type(raw).__name__}")
        outcomes = raw.get("outcomes", {})
        if not isinstance(outcomes, Mapping):
            raise ValueError("a tally's outcomes are an object")
        return cls({str(k): _count(v) for k, v in outcomes.items()},
                   _counts(raw.get("durations"), DURATION_BUCKETS_S),
                   _counts(raw.get("dwells"), DWELL_BUCKETS_S))


def quantile(counts: Sequence[int], bounds: tuple[float, ...], q: float) -> float | None:
    """The upper bound of the bucket holding the `q` quantile (the last finite bound for
    the +Inf bucket), or None for no observations."""
    if not 0 < q <= 1:
        raise ValueError(f"a quantile is in (0, 1], not {q}")
    total = sum(counts)
    if total == 0:
        return None
    rank, running = q * total, 0
    for index, n in enumerate(counts):
        running += n
        if running >= rank:
            return bounds[min(index, len(bounds) - 1)]
    return bounds[-1]


def _add(a: Mapping[str, int], b: Mapping[str, int], sign: int) -> dict[str, int]:
    out = dict(a)
    for key, n in b.items():
        out[key] = out.get(key, 0) + sign * n
    return {k: v for k, v in out.items() if v}


def _count(raw: object) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise ValueError(f"a count is a whole number >= 0, not {raw!r}")
    return raw


def _counts(raw: object, bounds: tuple[float, ...]) -> list[int]:
    if raw is None:
        return _buckets(bounds)
    if not isinstance(raw, list) or len(raw) != len(bounds) + 1:
        raise ValueError(f"a histogram has {len(bounds) + 1} buckets")
    return [_count(n) for n in raw]


def total(tallies: Sequence[Tally]) -> Tally:
    out = Tally()
    for tally in tallies:
        out = out.plus(tally)
    return out


__all__ = ["DWELL_BUCKETS_S", "FAILED", "Tally", "quantile", "total"]
