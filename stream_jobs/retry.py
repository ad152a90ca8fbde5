"""The retry decision: which delay tier a failed job goes to next, or the DLQ. Pure.

A failed job leaves its partition for a delay tier (`jobs.T.retry-5s`, ...) so the jobs
behind it keep moving; attempt `n` goes to the `n`-th tier (the last tier repeats), and
the attempt that reaches `max_attempts` is dead-lettered instead.

Jitter spreads out jobs that failed together (a dependency outage) so they do not all
come back in the same instant. It only ever holds a job longer than its tier's delay,
never shorter, and is capped so a long tier does not gain minutes of noise.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

from stream_jobs.durations import parse_duration
from stream_jobs.errors import ConfigError
from stream_jobs.outcomes import Reason


@dataclass(frozen=True)
class RetryPolicy:
    """A job type's retry policy: `tiers` in escalation order, attempts in all (first included)."""

    tiers: tuple[str, ...]
    max_attempts: int
    jitter_ratio: float = 0.1
    max_jitter_s: float = 30.0
    _delays_ms: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Policies come from TOML, where tiers are a list; a tuple keeps the policy hashable.
        object.__setattr__(self, "tiers", tuple(self.tiers))
        if self.max_attempts < 1:
            raise ConfigError(
                f"max_attempts is {self.max_attempts}; it counts the first run, so use 1 or more."
            )
        if self.max_attempts > 1 and not self.tiers:
            raise ConfigError(
                f"max_attempts is {self.max_attempts} but retry_tiers is empty; "
                "list at least one delay tier such as '5s', or set max_attempts = 1."
            )
        if self.jitter_ratio < 0 or self.max_jitter_s < 0:
            raise ConfigError("Retry jitter cannot be negative; use 0 to turn it off.")
        object.__setattr__(self, "_delays_ms", _tier_delays_ms(self.tiers))

    def delay_ms(self, tier: str) -> int:
        """The delay of one of this policy's tiers, in ms."""
        return self._delays_ms[self.tiers.index(tier)]

    def max_hold_ms(self, tier: str) -> int:
        """The longest a record written to `tier` by `decide` waits: its delay plus the
        largest jitter. The relay holds a tier's head this long before it hops it, so a
        retry is never sent round its tier again just for its jitter."""
        delay = self.delay_ms(tier)
        return delay + int(min(delay * self.jitter_ratio, self.max_jitter_s * 1000))


@dataclass(frozen=True)
class Retry:
    """Send the job to delay tier `tier` as attempt `attempt`, due at `not_before_ms`."""

    tier: str
    attempt: int
    not_before_ms: int


@dataclass(frozen=True)
class DeadLetter:
    """Send the job to the DLQ; `reason` is `Reason.PERMANENT` or `Reason.MAX_ATTEMPTS`."""

    reason: Reason


def decide(
    policy: RetryPolicy, *, attempt: int, permanent: bool, now_ms: int, rand: float
) -> Retry | DeadLetter:
    """What to do with a job whose attempt number `attempt` just failed.

    `rand` in [0, 1) picks the jitter (pass `random.random()`), which keeps this pure:
    `not_before_ms` is `now_ms + delay + rand * min(delay * jitter_ratio, max_jitter_s)`.
    """
    if attempt < 1:
        raise ValueError(f"attempt {attempt} is below 1; the first run is attempt 1")
    if not 0.0 <= rand < 1.0:
        raise ValueError(f"rand {rand} is outside [0, 1)")
    if permanent:
        return DeadLetter(Reason.PERMANENT)
    if attempt >= policy.max_attempts:
        return DeadLetter(Reason.MAX_ATTEMPTS)
    index = min(attempt - 1, len(policy.tiers) - 1)
    delay_ms = policy._delays_ms[index]
    jitter_cap_ms = min(delay_ms * policy.jitter_ratio, policy.max_jitter_s * 1000.0)
    jitter_ms = int(rand * jitter_cap_ms)  # rounding down keeps it within the cap
    return Retry(
        tier=policy.tiers[index],
        attempt=attempt + 1,
        not_before_ms=now_ms + delay_ms + jitter_ms,
    )


def tier_for_delay(tiers: Sequence[str], delay_s: float) -> str:
    """The tier that holds a job which should wait `delay_s` more seconds.

    That is the largest tier whose delay is at most `delay_s`, so no hop overshoots the
    job's not-before time. A delay below every tier uses the smallest tier: the relay
    holds a record until its not-before anyway, so it comes back on time. A delay longer
    than the largest tier uses the largest tier and hops: when the relay takes the record
    from that tier still early, it re-sends it to `next_hop(tiers, remaining_s)`, which
    bounds how long one far-future record sits at the head of a tier topic.
    """
    names = tuple(tiers)
    if not names:
        raise ConfigError("There are no retry tiers to hold a delayed job; list some in topics/.")
    delays = _tier_delays_ms(names)
    delay_ms = delay_s * 1000.0
    best = min(range(len(names)), key=lambda i: delays[i])
    for i, tier_ms in enumerate(delays):
        if delays[best] < tier_ms <= delay_ms:
            best = i
    return names[best]


def next_hop(tiers: Sequence[str], remaining_s: float) -> str:
    """The tier a relayed record goes to when `remaining_s` of its delay are left."""
    return tier_for_delay(tiers, remaining_s)


@functools.lru_cache(maxsize=128)
def _tier_delays_ms(tiers: tuple[str, ...]) -> tuple[int, ...]:
    delays = tuple(round(parse_duration(tier) * 1000) for tier in tiers)
    for tier, delay in zip(tiers, delays, strict=True):
        if delay <= 0:
            raise ConfigError(f"Retry tier {tier!r} is shorter than 1ms; use e.g. '5s'.")
    return delays
