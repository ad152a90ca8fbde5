"""The fairness section's figures from its stamps (ops/bench/fair_app.py). Pure.

A stamp is (tenant index, enqueued, started, ended) in unix seconds; index 0 is the noisy
tenant A, the others are the quiet tenants.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from ops.bench.common import BenchError, percentile

Stamp = tuple[int, float, float, float]
NOISY = 0


def noisy_run_figures(stamps: Sequence[Stamp], released: float) -> dict[str, float]:
    """One noisy-neighbour run whose workers were released at `released`: the quiet
    tenants' dwell (enqueue to start) p50/p99/max in ms, A's completion (release to its
    last job's end) in s, and the type's throughput: jobs that ended from the release to
    A's last end, per second of that window (the time there was a backlog to drain; the
    quiet trickle after it says nothing of throughput)."""
    quiet = [(started - enqueued) * 1000 for tenant, enqueued, started, _ in stamps
             if tenant != NOISY]
    flood_ends = [ended for tenant, _, _, ended in stamps if tenant == NOISY]
    if not quiet or not flood_ends:
        raise BenchError(f"{len(quiet)} quiet and {len(flood_ends)} noisy jobs stamped")
    flood_done = max(flood_ends)
    if flood_done <= released:
        raise BenchError("A's jobs all ended before the workers were released")
    within = sum(1 for _, _, _, ended in stamps if released < ended <= flood_done)
    return {"quiet_p50_ms": percentile(quiet, 50), "quiet_p99_ms": percentile(quiet, 99),
            "quiet_max_ms": max(quiet), "flood_s": flood_done - released,
            "throughput": within / (flood_done - released), "jobs": float(len(stamps))}


def most_running(intervals: Sequence[tuple[float, float]]) -> int:
    """The most intervals (start, end) open at one moment; one ending when another starts
    does not overlap it."""
    events = sorted([(start, 1) for start, _ in intervals]
                    + [(end, -1) for _, end in intervals])
    running = most = 0
    for _, step in events:  # at a tie the end (-1) sorts first
        running += step
        most = max(most, running)
    return most


def most_running_by_tenant(stamps: Iterable[Stamp]) -> dict[int, int]:
    """Per tenant, the most of its jobs running at once across every process: a job runs
    from its start stamp to its end stamp, both inside the slot the runtime gave it, so
    this is at most what the runtime allowed."""
    spans: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for tenant, _, started, ended in stamps:
        spans[tenant].append((started, ended))
    return {tenant: most_running(own) for tenant, own in sorted(spans.items())}
