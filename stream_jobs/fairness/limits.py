"""Per-tenant limits across the fleet: the rules, without I/O (docs/fairness.md).

A tenant of a type with `tenant_concurrency` holds one **slot** per running job; a slot is
a lease that its holder renews every `renew_interval_s(ttl)` and that lapses `ttl` after
the last renewal, so a killed worker's slots come back at most `ttl` after it died. A
tenant with `tenant_rate` spends one token per start from a **bucket** shared by the fleet:
tokens accrue at the rate up to `bucket_capacity(rate)` (a quarter second of it, at least
one), so over any window of `w` seconds the fleet starts at most `rate * w + capacity` of
the tenant's jobs. The store (`limit_store`) does this arithmetic in Postgres, on
Postgres' clock; `Bucket` is the same arithmetic in Python, for the tests that prove it.

A refused ask is told when asking again is worth it, never at once: the time to the next
token, or for a full tenant a backoff growing from `FIRST_BACKOFF_S` to `MAX_BACKOFF_S`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stream_jobs.ratelimit import BURST_S

# A slot not renewed for this long is free again: the bound on a killed worker's slots.
LEASE_TTL_S = 10.0
# Renewals per lease time: one lost renewal (a slow statement, a hiccup) loses nothing.
RENEWALS_PER_TTL = 3
# How often a gate reads the operators' overrides (`stream-jobs throttle T --tenant`).
OVERRIDE_REFRESH_S = 1.0
# A full tenant's backoff: the first refusal, then doubling up to the cap.
FIRST_BACKOFF_S = 0.02
MAX_BACKOFF_S = 1.0
# The shortest wait a refusal names: "ask again now" would be a busy loop.
MIN_WAIT_S = 0.001
# Float slack: a wait computed for the next token must find it there.
TOKEN_EPSILON = 1e-9


def renew_interval_s(ttl_s: float) -> float:
    """How often a holder renews its slots so that they never lapse while it lives."""
    if not ttl_s > 0:
        raise ValueError(f"a lease lasts longer than zero, not {ttl_s!r}")
    return ttl_s / RENEWALS_PER_TTL


def bucket_capacity(rate_per_s: float) -> float:
    """The tokens a tenant's bucket holds at most: its burst above the rate."""
    return max(1.0, rate_per_s * BURST_S)


def refilled(tokens: float, elapsed_s: float, rate_per_s: float) -> float:
    """The tokens after `elapsed_s` more seconds at `rate_per_s`, capped at the capacity."""
    return min(bucket_capacity(rate_per_s), tokens + max(0.0, elapsed_s) * rate_per_s)


def token_wait_s(tokens: float, rate_per_s: float) -> float:
    """Seconds until a bucket holding `tokens` has one to give (at least `MIN_WAIT_S`)."""
    if tokens >= 1.0 - TOKEN_EPSILON:
        return MIN_WAIT_S
    return max(MIN_WAIT_S, (1.0 - tokens) / rate_per_s)


def full_backoff_s(refusals: int, jitter: float = 1.0) -> float:
    """The wait after the `refusals`-th refusal in a row for want of a slot: doubling from
    `FIRST_BACKOFF_S` to `MAX_BACKOFF_S`, scaled by `jitter` (in [0.5, 1]) so that the
    fleet's waiters do not ask in step. No slot frees on a clock, so it is a guess."""
    if refusals < 1:
        raise ValueError(f"a backoff follows a refusal, not {refusals!r} of them")
    if not 0.5 <= jitter <= 1.0:
        raise ValueError(f"jitter is between 0.5 and 1, not {jitter!r}")
    doubled = FIRST_BACKOFF_S * 2.0 ** min(refusals - 1, 32)
    return max(MIN_WAIT_S, min(MAX_BACKOFF_S, doubled) * jitter)


def slot_return_bound_s(ttl_s: float) -> float:
    """The longest a killed worker's slot stays taken for a waiter: the lease lapses at
    most `ttl_s` after the kill (its last renewal was before it), and a waiter asks again
    within `MAX_BACKOFF_S`."""
    return ttl_s + MAX_BACKOFF_S


@dataclass(frozen=True)
class Answer:
    """What one ask of the store found: whether it was granted (and which slot, when the
    tenant has a concurrency limit), whether a slot was free (True without a limit), and
    the tenant's bucket then (rate None: unrated)."""

    granted: bool
    slot: int | None
    slot_free: bool
    tokens: float | None
    rate_per_s: float | None

    @property
    def bucket_empty(self) -> bool:
        return (self.rate_per_s is not None and self.tokens is not None
                and self.tokens < 1.0 - TOKEN_EPSILON)

    def wait_s(self, refusals: int, jitter: float = 1.0) -> float:
        """When a refused ask is worth repeating: the next token's time if the bucket was
        empty, a backoff if the slots were full, the longer if both."""
        waits = []
        if self.rate_per_s is not None and self.tokens is not None and self.bucket_empty:
            waits.append(token_wait_s(self.tokens, self.rate_per_s))
        if not self.slot_free or not waits:
            waits.append(full_backoff_s(max(1, refusals), jitter))
        return max(waits)


@dataclass(frozen=True)
class TenantRate:
    """The rate a tenant runs under and where it comes from: "throttle" (an operator's
    override), "toml" (its `[fairness]` table) or "none"."""

    per_s: float | None
    source: str

    def spelt(self) -> str:
        limit = "no limit" if self.per_s is None else f"{self.per_s:g}/s"
        return f"{limit} ({self.source})"


def rate_in_force(toml_per_s: float | None, overridden: bool,
                  override_per_s: float | None) -> TenantRate:
    """An override wins over the TOML until it is reset; an override of None lifts it."""
    if overridden:
        return TenantRate(override_per_s, "throttle")
    if toml_per_s is not None:
        return TenantRate(toml_per_s, "toml")
    return TenantRate(None, "none")


class Bucket:
    """One tenant's token bucket, as the store keeps it, on a clock the caller passes."""

    __slots__ = ("rate_per_s", "refilled_at", "tokens")

    def __init__(self, rate_per_s: float, now: float) -> None:
        if not rate_per_s > 0 or math.isinf(rate_per_s):
            raise ValueError(f"a bucket's rate is positive, not {rate_per_s!r}")
        self.rate_per_s = rate_per_s
        self.tokens = 1.0  # a fresh tenant starts one job at once, no burst beyond it
        self.refilled_at = now

    def take(self, now: float) -> bool:
        """Take a token if there is one (what the store's acquire does in one statement)."""
        self.tokens = refilled(self.tokens, now - self.refilled_at, self.rate_per_s)
        self.refilled_at = max(self.refilled_at, now)
        if self.tokens >= 1.0 - TOKEN_EPSILON:
            self.tokens = max(0.0, self.tokens - 1.0)
            return True
        return False


__all__ = [
    "FIRST_BACKOFF_S",
    "LEASE_TTL_S",
    "MAX_BACKOFF_S",
    "MIN_WAIT_S",
    "OVERRIDE_REFRESH_S",
    "TOKEN_EPSILON",
    "Answer",
    "Bucket",
    "TenantRate",
    "bucket_capacity",
    "full_backoff_s",
    "rate_in_force",
    "refilled",
    "renew_interval_s",
    "slot_return_bound_s",
    "token_wait_s",
]
