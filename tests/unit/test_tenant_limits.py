"""The rules of per-tenant limits (stream_jobs.fairness.limits): a tenant's bucket never
grants more than rate * w + capacity in any window, refusals always name a wait above zero,
leases are renewed well inside their lifetime, and an operator's rate wins over the TOML."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_jobs.fairness.limits import (
    FIRST_BACKOFF_S,
    LEASE_TTL_S,
    MAX_BACKOFF_S,
    MIN_WAIT_S,
    Answer,
    Bucket,
    TenantRate,
    bucket_capacity,
    full_backoff_s,
    rate_in_force,
    refilled,
    renew_interval_s,
    slot_return_bound_s,
    token_wait_s,
)

rates = st.floats(min_value=0.1, max_value=5000.0)
gaps = st.lists(st.floats(min_value=0.0, max_value=2.0), min_size=1, max_size=200)


def _grant_times(rate: float, gaps_s: list[float]) -> list[float]:
    bucket = Bucket(rate, now=0.0)
    now, granted = 0.0, []
    for gap in gaps_s:
        now += gap
        if bucket.take(now):
            granted.append(now)
    return granted


@given(rates, gaps)
def test_a_bucket_never_grants_more_than_rate_times_window_plus_its_capacity(
        rate: float, gaps_s: list[float]) -> None:
    granted = _grant_times(rate, gaps_s)
    capacity = bucket_capacity(rate)
    for i, first in enumerate(granted):
        for j in range(i, len(granted)):
            window_s = granted[j] - first
            assert j - i + 1 <= rate * window_s + capacity + 1e-6


@given(rates, st.floats(min_value=0.0, max_value=1.0))
def test_a_refused_ask_finds_its_token_after_the_wait_it_was_told(
        rate: float, start_tokens: float) -> None:
    wait = token_wait_s(start_tokens, rate)
    assert wait >= MIN_WAIT_S
    assert refilled(start_tokens, wait, rate) >= 1.0 - 1e-9


def test_a_fresh_tenant_starts_one_job_then_waits_for_the_rate() -> None:
    bucket = Bucket(5.0, now=10.0)
    assert bucket.take(10.0)
    assert not bucket.take(10.1)
    assert bucket.take(10.2)
    # An idle minute saves a quarter second of the rate, at least one token.
    assert bucket_capacity(200.0) == 50.0
    assert bucket_capacity(2.0) == 1.0
    assert refilled(0.0, 60.0, 200.0) == 50.0


@given(st.integers(min_value=1, max_value=10_000), st.floats(min_value=0.5, max_value=1.0))
def test_a_full_tenant_backs_off_above_zero_and_at_most_the_cap(refusals: int,
                                                                 jitter: float) -> None:
    wait = full_backoff_s(refusals, jitter)
    assert MIN_WAIT_S <= wait <= MAX_BACKOFF_S
    assert full_backoff_s(refusals + 1, jitter) >= wait


def test_backoff_doubles_from_the_first_refusal() -> None:
    assert full_backoff_s(1) == FIRST_BACKOFF_S
    assert full_backoff_s(2) == 2 * FIRST_BACKOFF_S
    assert full_backoff_s(50) == MAX_BACKOFF_S
    with pytest.raises(ValueError, match="follows a refusal"):
        full_backoff_s(0)
    with pytest.raises(ValueError, match="jitter"):
        full_backoff_s(1, 0.1)


def test_leases_are_renewed_three_times_a_lifetime_and_a_killed_workers_come_back() -> None:
    assert renew_interval_s(LEASE_TTL_S) == pytest.approx(LEASE_TTL_S / 3)
    assert slot_return_bound_s(LEASE_TTL_S) == LEASE_TTL_S + MAX_BACKOFF_S
    with pytest.raises(ValueError, match="longer than zero"):
        renew_interval_s(0)


def test_a_refusal_waits_for_the_token_or_backs_off_for_a_slot_the_longer_if_both() -> None:
    empty_bucket = Answer(granted=False, slot=None, slot_free=True, tokens=0.5, rate_per_s=5.0)
    assert empty_bucket.wait_s(1) == pytest.approx(0.1)
    full = Answer(granted=False, slot=None, slot_free=False, tokens=1.0, rate_per_s=None)
    assert full.wait_s(1) == FIRST_BACKOFF_S
    both = Answer(granted=False, slot=None, slot_free=False, tokens=0.0, rate_per_s=1.0)
    assert both.wait_s(1) == pytest.approx(1.0)


def test_an_operators_rate_wins_over_the_toml_until_reset() -> None:
    assert rate_in_force(50.0, False, None) == TenantRate(50.0, "toml")
    assert rate_in_force(50.0, True, 5.0) == TenantRate(5.0, "throttle")
    assert rate_in_force(50.0, True, None) == TenantRate(None, "throttle")
    assert rate_in_force(None, False, None) == TenantRate(None, "none")
    assert TenantRate(5.0, "throttle").spelt() == "5/s (throttle)"
    assert TenantRate(None, "none").spelt() == "no limit (none)"


def test_a_bucket_refuses_a_rate_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Bucket(0.0, now=0.0)
