"""A job type's rate limit, split across its workers by partition ownership. Pure.

`rate_limit = "200/s"` holds for the whole consumer group `P.T.worker`, not per process.
Each worker takes the share of the type's lane partitions that Kafka assigned it:
`share = rate * assigned / total`. The group protocol gives every partition to exactly
one member, so the shares add up to the type's rate at every moment, a new or departed
worker changes them at the next rebalance, and no worker has to count the others.

Each worker spends its share through a `TokenBucket`: a job start takes a token, tokens
accrue at the share and at most `capacity` (a quarter second of the share, at least one)
wait unused, so a worker whose loop stalls for less than that catches up afterwards.
Over any window of `w` seconds the group starts at most `rate * w + workers * capacity`
jobs.
"""

from __future__ import annotations

import math

# How much unused share a worker may save up, in seconds of its share (at least one token).
BURST_S = 0.25
# Float slack: a timer set for the next token must find it there when it fires.
_EPSILON = 1e-9


def partition_share(rate_per_s: float, assigned: int, total: int) -> float:
    """This member's part of `rate_per_s`: its fraction of the type's lane partitions.

    With no partitions known yet (`total` 0) nothing may start: a member learns both
    numbers from its first assignment.
    """
    if total <= 0 or assigned <= 0:
        return 0.0
    return rate_per_s * min(assigned, total) / total


class TokenBucket:
    """Tokens accrue at `rate_per_s` up to `capacity`; starting a job takes one.

    Time is whatever monotonic clock the caller passes as `now` (seconds). A rate of 0
    accrues nothing: `wait_s` is then infinite.
    """

    __slots__ = ("_updated", "capacity", "rate_per_s", "tokens")

    def __init__(self, rate_per_s: float, now: float, *, burst_s: float = BURST_S) -> None:
        self.rate_per_s = 0.0
        self.capacity = 1.0
        self.tokens = 0.0
        self._updated = now
        self.set_rate(rate_per_s, now, burst_s=burst_s)
        # A fresh bucket holds one token: the first job starts at once, no burst beyond it.
        self.tokens = min(1.0, self.capacity)

    def set_rate(self, rate_per_s: float, now: float, *, burst_s: float = BURST_S) -> None:
        """Change the rate from `now` on; tokens saved so far are kept up to the new capacity."""
        if rate_per_s < 0 or math.isnan(rate_per_s):
            raise ValueError(f"a rate is zero or more, not {rate_per_s!r}")
        self._refill(now)
        self.rate_per_s = rate_per_s
        self.capacity = max(1.0, rate_per_s * burst_s)
        self.tokens = min(self.tokens, self.capacity)

    def try_take(self, now: float) -> bool:
        """Take one token if there is one."""
        self._refill(now)
        if self.tokens >= 1.0 - _EPSILON:
            self.tokens = max(0.0, self.tokens - 1.0)
            return True
        return False

    def has_token(self, now: float) -> bool:
        self._refill(now)
        return self.tokens >= 1.0 - _EPSILON

    def wait_s(self, now: float) -> float:
        """Seconds until a token is there (0 if one is)."""
        self._refill(now)
        if self.tokens >= 1.0 - _EPSILON:
            return 0.0
        if self.rate_per_s <= 0:
            return math.inf
        return (1.0 - self.tokens) / self.rate_per_s

    def _refill(self, now: float) -> None:
        if now > self._updated:
            self.tokens = min(self.capacity,
                              self.tokens + (now - self._updated) * self.rate_per_s)
            self._updated = now


__all__ = ["BURST_S", "TokenBucket", "partition_share"]
