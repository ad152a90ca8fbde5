"""The token bucket and the partition share: starts never beat the rate by more than the
burst, and the shares of a group add up to the type's rate."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_jobs.ratelimit import BURST_S, TokenBucket, partition_share


def test_a_fresh_bucket_starts_one_job_then_waits_for_the_next_token() -> None:
    bucket = TokenBucket(50, now=100.0)
    assert bucket.try_take(100.0)
    assert not bucket.try_take(100.0)
    assert bucket.wait_s(100.0) == pytest.approx(0.02)
    assert not bucket.has_token(100.019)
    assert bucket.try_take(100.02)


def test_unused_tokens_are_capped_at_a_quarter_second() -> None:
    bucket = TokenBucket(200, now=0.0)
    taken = 0
    while bucket.try_take(60.0):  # a minute idle
        taken += 1
    assert taken == int(200 * BURST_S)


def test_a_slow_rate_still_keeps_one_token() -> None:
    bucket = TokenBucket(0.5, now=0.0)
    assert bucket.capacity == 1.0
    assert bucket.try_take(0.0)
    assert bucket.wait_s(0.0) == pytest.approx(2.0)


def test_rate_zero_never_refills() -> None:
    bucket = TokenBucket(0, now=0.0)
    assert bucket.try_take(0.0)  # every fresh bucket holds one token
    assert not bucket.has_token(1e9)
    assert bucket.wait_s(1e9) == math.inf


def test_a_new_rate_applies_from_now_and_keeps_saved_tokens_within_the_new_cap() -> None:
    bucket = TokenBucket(100, now=0.0)
    bucket.set_rate(20, now=1.0)  # 1 s at 100/s accrued up to 25 tokens; 20/s keeps 5
    assert bucket.tokens == pytest.approx(5.0)
    bucket.set_rate(1, now=1.0)
    assert bucket.tokens == pytest.approx(1.0)
    assert bucket.try_take(1.0)
    assert bucket.wait_s(1.0) == pytest.approx(1.0)


def test_negative_rates_are_refused() -> None:
    with pytest.raises(ValueError, match="zero or more"):
        TokenBucket(-1, now=0.0)


@given(st.floats(1, 5000), st.lists(st.floats(0, 0.05), min_size=1, max_size=400))
def test_starts_over_any_run_stay_within_rate_times_time_plus_capacity(
        rate: float, gaps: list[float]) -> None:
    bucket = TokenBucket(rate, now=0.0)
    now = 0.0
    taken = 0
    for gap in gaps:
        now += gap
        while bucket.try_take(now):
            taken += 1
    assert taken <= rate * now + bucket.capacity + 1e-6


def test_shares_follow_partition_ownership() -> None:
    assert partition_share(60, 6, 18) == pytest.approx(20)
    assert partition_share(60, 18, 18) == 60
    assert partition_share(60, 0, 18) == 0  # a member with nothing assigned starts nothing
    assert partition_share(60, 3, 0) == 0  # no metadata yet: nothing starts


@given(st.floats(0.1, 10_000), st.integers(1, 200), st.integers(1, 20))
def test_a_groups_shares_add_up_to_the_rate(rate: float, partitions: int,
                                            members: int) -> None:
    # Round robin: member i owns every members-th partition.
    owned = [len(range(i, partitions, members)) for i in range(members)]
    shares = [partition_share(rate, n, partitions) for n in owned]
    assert sum(shares) == pytest.approx(rate)
