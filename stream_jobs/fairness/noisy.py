"""Which tenants are noisy: SQS fair queues' two measures, from one worker's view. Pure.

A tenant is noisy while it holds more than `noisy_share` of the jobs this worker has in
flight (fetched and not finished, in the lanes and the overflow lane) with at least
`noisy_min_jobs` of its own, or more than `noisy_time_share` of the processing time its
handlers took over about the last `noisy_window` (an exponentially decaying sum, so old
work fades instead of dropping off a cliff). A noisy tenant's further jobs read from a
lane move to the overflow lane (`stream_jobs.fairness.overflow`); once neither measure
holds it is quiet again.

Each worker judges from what it holds: its partitions are its share of the type's
traffic, and a flood fills them first. A job without a tenant counts as the tenant `""`.
"""

from __future__ import annotations

import math

from stream_jobs.tenants import FairnessSpec

# Processing time below this many seconds in the window never makes a tenant noisy: a
# handful of short jobs is not a flood, whatever its share.
MIN_BUSY_S = 1.0


class NoisyJudge:
    """Counts in flight by tenant and decaying processing time; says who is noisy."""

    __slots__ = ("_busy", "_busy_at", "_min_jobs", "_share", "_time_share", "_total_busy",
                 "_total_busy_at", "_window_s", "in_flight", "total")

    def __init__(self, spec: FairnessSpec) -> None:
        self._share = spec.noisy_share
        self._min_jobs = spec.noisy_min_jobs
        self._time_share = spec.noisy_time_share
        self._window_s = spec.noisy_window_s
        self.in_flight: dict[str, int] = {}
        self.total = 0
        # Decayed seconds of processing per tenant, and when each was last decayed.
        self._busy: dict[str, float] = {}
        self._busy_at: dict[str, float] = {}
        self._total_busy = 0.0
        self._total_busy_at = 0.0

    def took(self, tenant: str) -> None:
        """A job of `tenant` was fetched (it is in flight until `finished`)."""
        self.in_flight[tenant] = self.in_flight.get(tenant, 0) + 1
        self.total += 1

    def finished(self, tenant: str) -> None:
        """A job of `tenant` is no longer in flight (run, forwarded or screened out)."""
        left = self.in_flight.get(tenant, 0) - 1
        if left > 0:
            self.in_flight[tenant] = left
        else:
            self.in_flight.pop(tenant, None)
        self.total = max(0, self.total - 1)

    def ran(self, tenant: str, seconds: float, now: float) -> None:
        """`tenant`'s handler ran for `seconds`, ending at `now` (monotonic seconds)."""
        self._busy[tenant] = self._decayed(tenant, now) + seconds
        self._busy_at[tenant] = now
        self._total_busy = self._total_decayed(now) + seconds
        self._total_busy_at = now

    def is_noisy(self, tenant: str, now: float) -> bool:
        """Whether `tenant` holds more than its share of jobs in flight or of time."""
        mine = self.in_flight.get(tenant, 0)
        if mine >= self._min_jobs and mine > self._share * self.total:
            return True
        if tenant not in self._busy:
            return False
        total = self._total_decayed(now)
        if total < MIN_BUSY_S:
            return False
        return self._decayed(tenant, now) > self._time_share * total

    def noisy(self, now: float) -> list[str]:
        """Every noisy tenant now (for reports: O(tenants))."""
        return sorted(t for t in self.tenants_seen() if self.is_noisy(t, now))

    def tenants_seen(self) -> set[str]:
        """The tenants the judge keeps anything of (in flight, or time not yet forgotten)."""
        return set(self.in_flight) | set(self._busy)

    def forget_idle(self, now: float) -> None:
        """Drop tenants with nothing in flight whose time has decayed to nothing (call
        now and then: keeps the maps as small as the tenants seen lately)."""
        for tenant in [t for t in self._busy if t not in self.in_flight]:
            if self._decayed(tenant, now) < 1e-3:
                del self._busy[tenant]
                del self._busy_at[tenant]

    def _decayed(self, tenant: str, now: float) -> float:
        busy = self._busy.get(tenant)
        if busy is None:
            return 0.0
        return busy * math.exp(-max(0.0, now - self._busy_at[tenant]) / self._window_s)

    def _total_decayed(self, now: float) -> float:
        return self._total_busy * math.exp(-max(0.0, now - self._total_busy_at)
                                           / self._window_s)


__all__ = ["MIN_BUSY_S", "NoisyJudge"]
