"""Cost when unused (issue 29 §2): the arms of one no-op drain interleaved in rounds, and
the verdict on their ratio, which says when the run could not settle it.

A "costs nothing when unused" goal (>= 0.97x) asks the bench to tell 3% apart, and a
no-op drain on 2 shared cores swings by more than that from one drain to the next (the
cancel rows went from 0.67x at load 5 to 1.07x at load 1). So the arms are measured in
rounds, every arm once per round, the order turned each round (off, on; on, off; ...) so
a drift of the box weighs on both alike; the ratio is taken pair by pair (round by
round), its median reported with a 95% bootstrap interval, and the 1-minute load
average is sampled after every drain.

The verdict (`judge`, pure): above a load of LOAD_LIMIT the run says "not settled"
rather than MET or NOT MET (the report prints the load beside every verdict); an
interval wholly on one side of the target decides; an interval that straddles it
decides by the median only once it is narrow enough (RESOLUTION either side), and
otherwise says how many pairs would.
"""

from __future__ import annotations

import math
import os
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# The 1-minute load average above which a cost-when-unused verdict is not settled: on 2
# cores, past 1.5 the drains queue behind other work and the pairs swing by over 3%.
LOAD_LIMIT = 1.5
# The difference the goals must tell apart: 0.97x, so 3% of the ratio either side.
RESOLUTION = 0.03
CONFIDENCE = 0.95
RESAMPLES = 2_000
# Rounds of a full run: what three rows (cancels, tracing, fairness) fit in about 3
# minutes, at 5 to 7 s a round of 100,000-job no-op drains (a full run on 2026-12-07:
# the whole control section 85 s, tracing 78 s, fills included). A pilot on this box (10
# pairs, cancel watch on and off, load 0.6 to 1.8) had 6 pairs within 0.97x - 1.06x and 4
# with one drain about 1 s slower (ratios 1.2x - 1.8x): the median of the pairs shrugs
# off such drains while they are fewer than a quarter of the pairs; more of them widen
# the interval, and the row says how many pairs would settle it.
PAIRS = 8
QUICK_PAIRS = 2


@dataclass
class Interleaved:
    """Each arm's values, round by round, and the load average after each of them."""

    values: dict[str, list[float]] = field(default_factory=dict)
    loads: dict[str, list[float]] = field(default_factory=dict)


def interleave(arms: Sequence[str], measure: Callable[[str], float], rounds: int,
               label: str) -> Interleaved:
    """Measure every arm once per round for `rounds` rounds, the order turned by one each
    round; `measure(arm)` returns the arm's figure (jobs/s). Prints each value and the
    load as it goes."""
    found = Interleaved({arm: [] for arm in arms}, {arm: [] for arm in arms})
    for run in range(rounds):
        k = run % len(arms)
        for arm in [*arms[k:], *arms[:k]]:
            value = measure(arm)
            load = os.getloadavg()[0]
            found.values[arm].append(value)
            found.loads[arm].append(load)
            print(f"[bench] {label} {arm}, round {run + 1}/{rounds}: {value:,.0f} "
                  f"(load {load:.1f})", flush=True)
    return found


# -- the verdict (pure) ---------------------------------------------------------------------


def median_interval(ratios: Sequence[float], confidence: float = CONFIDENCE,
                    resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """A percentile-bootstrap interval of the median of `ratios` (seeded: the same ratios
    always give the same interval)."""
    if not ratios:
        raise ValueError("no ratios to take an interval of")
    rng = random.Random(seed)
    k = len(ratios)
    medians = sorted(statistics.median(rng.choices(ratios, k=k)) for _ in range(resamples))
    tail = (1 - confidence) / 2
    low = medians[int(tail * (resamples - 1))]
    high = medians[math.ceil((1 - tail) * (resamples - 1))]
    return low, high


def pairs_to_resolve(pairs: int, half_width: float, resolution: float = RESOLUTION) -> int:
    """Pairs that would bring an interval `half_width` wide either side (as a share of the
    ratio, from `pairs` pairs) within `resolution`: an interval narrows as 1/sqrt(pairs)."""
    if half_width <= resolution:
        return pairs
    return math.ceil(pairs * (half_width / resolution) ** 2)


@dataclass(frozen=True)
class Verdict:
    """A cost-when-unused goal judged on interleaved pairs."""

    ratio: float  # the median of the pairs' ratios
    low: float  # its 95% bootstrap interval
    high: float
    pairs: int
    load: float  # the median of the 1-minute load average over the pairs
    load_max: float
    met: bool | None  # None: not settled
    status: str  # "MET", "NOT MET", "not settled" (the load) or "not settled: ±x% ..."
    needed: int  # pairs that resolve RESOLUTION at this spread

    @property
    def half_width(self) -> float:
        return max(self.ratio - self.low, self.high - self.ratio) / self.ratio


def _meets(op: str, value: float, target: float) -> bool:
    return value >= target if op == ">=" else value <= target if op == "<=" else value < target


def judge(num: Sequence[float], den: Sequence[float], num_loads: Sequence[float],
          den_loads: Sequence[float], op: str, target: float,
          load_limit: float = LOAD_LIMIT, resolution: float = RESOLUTION) -> Verdict:
    """The verdict on `num / den`, pair by pair (the i-th value of each is round i), with
    the load average after each value. A pair's load is the higher of its two."""
    if not num or len(num) != len(den) or len(num_loads) != len(num) \
            or len(den_loads) != len(den):
        raise ValueError("interleaved pairs need as many values and loads in each arm")
    ratios = [a / b for a, b in zip(num, den, strict=True)]
    loads = [max(a, b) for a, b in zip(num_loads, den_loads, strict=True)]
    ratio = statistics.median(ratios)
    low, high = median_interval(ratios)
    load = statistics.median(loads)
    half = max(ratio - low, high - ratio) / ratio
    needed = pairs_to_resolve(len(ratios), half, resolution)
    met: bool | None = None
    if load > load_limit:
        status = "not settled"
    elif _meets(op, low, target) == _meets(op, high, target) or half <= resolution:
        # The whole interval on one side of the target, or narrow enough: the median decides.
        met = _meets(op, ratio, target)
        status = "MET" if met else "NOT MET"
    else:
        status = (f"not settled: ±{half * 100:.0f}% with {len(ratios)} pairs, "
                  f"±{resolution * 100:.0f}% needs {needed},")
    return Verdict(ratio, low, high, len(ratios), load, max(loads), met, status, needed)
