from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_jobs.durations import format_duration, parse_duration
from stream_jobs.errors import ConfigError
from stream_jobs.outcomes import Reason
from stream_jobs.retry import (
    DeadLetter,
    Retry,
    RetryPolicy,
    decide,
    next_hop,
    tier_for_delay,
)

PROPERTY = settings(max_examples=200, deadline=None)
NOW = 1_700_000_000_000
TIERS = ("5s", "1m", "10m")
POLICY = RetryPolicy(tiers=TIERS, max_attempts=4)

rands = st.floats(0.0, 1.0, exclude_max=True)
tier_lists = st.lists(
    st.integers(1, 86_400).map(format_duration), min_size=1, max_size=6, unique=True
)


def test_attempts_escalate_through_the_tiers_then_dead_letter() -> None:
    outcomes = [
        decide(POLICY, attempt=attempt, permanent=False, now_ms=NOW, rand=0.0)
        for attempt in (1, 2, 3, 4)
    ]
    assert outcomes == [
        Retry(tier="5s", attempt=2, not_before_ms=NOW + 5_000),
        Retry(tier="1m", attempt=3, not_before_ms=NOW + 60_000),
        Retry(tier="10m", attempt=4, not_before_ms=NOW + 600_000),
        DeadLetter("max-attempts"),
    ]


def test_a_permanent_failure_is_dead_lettered_at_once() -> None:
    assert decide(POLICY, attempt=1, permanent=True, now_ms=NOW, rand=0.5) == DeadLetter(
        "permanent"
    )


def test_attempts_past_the_maximum_are_dead_lettered() -> None:
    # A record that arrives with a larger attempt (the policy was lowered) must not loop.
    outcome = decide(POLICY, attempt=9, permanent=False, now_ms=NOW, rand=0.0)
    assert outcome == DeadLetter("max-attempts")


def test_the_last_tier_repeats_when_attempts_outnumber_tiers() -> None:
    policy = RetryPolicy(tiers=("5s", "1m"), max_attempts=6)
    tiers = []
    for attempt in range(1, 6):
        outcome = decide(policy, attempt=attempt, permanent=False, now_ms=NOW, rand=0.0)
        assert isinstance(outcome, Retry)
        tiers.append(outcome.tier)
    assert tiers == ["5s", "1m", "1m", "1m", "1m"]


def test_one_attempt_means_no_retry() -> None:
    policy = RetryPolicy(tiers=(), max_attempts=1)
    assert decide(policy, attempt=1, permanent=False, now_ms=NOW, rand=0.0) == DeadLetter(
        "max-attempts"
    )


def test_jitter_is_ten_percent_capped_at_thirty_seconds() -> None:
    almost_one = 0.999_999
    short = decide(POLICY, attempt=1, permanent=False, now_ms=NOW, rand=almost_one)
    assert isinstance(short, Retry)
    assert short.not_before_ms == NOW + 5_000 + 499  # 10% of 5 s, rounded down
    long = decide(POLICY, attempt=3, permanent=False, now_ms=NOW, rand=almost_one)
    assert isinstance(long, Retry)
    assert long.not_before_ms == NOW + 600_000 + 29_999  # capped at 30 s, not 60 s


def test_jitter_can_be_turned_off() -> None:
    policy = RetryPolicy(tiers=TIERS, max_attempts=4, jitter_ratio=0.0)
    outcome = decide(policy, attempt=2, permanent=False, now_ms=NOW, rand=0.9)
    assert outcome == Retry(tier="1m", attempt=3, not_before_ms=NOW + 60_000)


def test_dead_letter_reasons_are_the_reason_codes_letters_carry() -> None:
    # One spelling (stream_jobs.outcomes.Reason) for the decision and the sj-error header.
    permanent = decide(POLICY, attempt=1, permanent=True, now_ms=NOW, rand=0.0)
    exhausted = decide(POLICY, attempt=4, permanent=False, now_ms=NOW, rand=0.0)
    assert permanent == DeadLetter(Reason.PERMANENT)
    assert Reason.PERMANENT == "permanent"
    assert exhausted == DeadLetter(Reason.MAX_ATTEMPTS)
    assert Reason.MAX_ATTEMPTS == "max-attempts"


@pytest.mark.parametrize("rand", [-0.1, 1.0, 2.0, float("nan")])
def test_rand_outside_the_unit_interval_is_a_caller_bug(rand: float) -> None:
    with pytest.raises(ValueError, match="rand"):
        decide(POLICY, attempt=1, permanent=False, now_ms=NOW, rand=rand)


@pytest.mark.parametrize("attempt", [0, -1])
def test_attempts_start_at_one(attempt: int) -> None:
    with pytest.raises(ValueError, match="attempt"):
        decide(POLICY, attempt=attempt, permanent=False, now_ms=NOW, rand=0.0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tiers": TIERS, "max_attempts": 0}, "max_attempts"),
        ({"tiers": (), "max_attempts": 2}, "retry_tiers is empty"),
        ({"tiers": ("5 seconds",), "max_attempts": 2}, "not a duration"),
        ({"tiers": ("0s",), "max_attempts": 2}, "shorter than 1ms"),
        ({"tiers": TIERS, "max_attempts": 2, "jitter_ratio": -0.1}, "negative"),
        ({"tiers": TIERS, "max_attempts": 2, "max_jitter_s": -1.0}, "negative"),
    ],
)
def test_invalid_policies_are_config_errors(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_a_policy_from_toml_lists_is_hashable_and_knows_its_delays() -> None:
    policy = RetryPolicy(tiers=["5s", "1m"], max_attempts=3)  # type: ignore[arg-type]
    assert policy.tiers == ("5s", "1m")
    assert policy == RetryPolicy(tiers=("5s", "1m"), max_attempts=3)
    assert hash(policy) == hash(RetryPolicy(tiers=("5s", "1m"), max_attempts=3))
    assert policy.delay_ms("1m") == 60_000


@PROPERTY
@given(
    tiers=tier_lists,
    max_attempts=st.integers(1, 10),
    attempt=st.integers(1, 12),
    permanent=st.booleans(),
    now_ms=st.integers(0, 2**50),
    rand=rands,
    jitter_ratio=st.floats(0.0, 1.0),
    max_jitter_s=st.floats(0.0, 120.0),
)
def test_decide_properties(
    tiers: list[str],
    max_attempts: int,
    attempt: int,
    permanent: bool,
    now_ms: int,
    rand: float,
    jitter_ratio: float,
    max_jitter_s: float,
) -> None:
    policy = RetryPolicy(
        tiers=tuple(tiers),
        max_attempts=max_attempts,
        jitter_ratio=jitter_ratio,
        max_jitter_s=max_jitter_s,
    )
    outcome = decide(policy, attempt=attempt, permanent=permanent, now_ms=now_ms, rand=rand)
    if permanent:
        assert outcome == DeadLetter("permanent")
    elif attempt >= max_attempts:
        assert outcome == DeadLetter("max-attempts")
    else:
        assert isinstance(outcome, Retry)
        assert outcome.attempt == attempt + 1
        assert outcome.tier == tiers[min(attempt - 1, len(tiers) - 1)]
        delay_ms = round(parse_duration(outcome.tier) * 1000)
        cap_ms = min(delay_ms * jitter_ratio, max_jitter_s * 1000)
        # Jitter only ever holds a job longer, and never by more than its cap.
        assert now_ms + delay_ms <= outcome.not_before_ms <= now_ms + delay_ms + cap_ms


@PROPERTY
@given(attempt=st.integers(1, 3), now_ms=st.integers(0, 2**50), rand=rands)
def test_default_policy_bounds(attempt: int, now_ms: int, rand: float) -> None:
    outcome = decide(POLICY, attempt=attempt, permanent=False, now_ms=now_ms, rand=rand)
    assert isinstance(outcome, Retry)
    delay_ms = {1: 5_000, 2: 60_000, 3: 600_000}[attempt]
    jitter_cap_ms = min(delay_ms // 10, 30_000)
    assert now_ms + delay_ms <= outcome.not_before_ms <= now_ms + delay_ms + jitter_cap_ms


@PROPERTY
@given(attempt=st.integers(1, 3), now_ms=st.integers(0, 2**50), a=rands, b=rands)
def test_more_rand_never_means_earlier(attempt: int, now_ms: int, a: float, b: float) -> None:
    low, high = sorted((a, b))
    first = decide(POLICY, attempt=attempt, permanent=False, now_ms=now_ms, rand=low)
    second = decide(POLICY, attempt=attempt, permanent=False, now_ms=now_ms, rand=high)
    assert isinstance(first, Retry)
    assert isinstance(second, Retry)
    assert first.not_before_ms <= second.not_before_ms


# -- which tier holds a delayed job ----------------------------------------------------


@pytest.mark.parametrize(
    ("delay_s", "tier"),
    [
        (0.0, "5s"),  # below every tier: the smallest, held until not-before
        (3.0, "5s"),
        (5.0, "5s"),
        (59.999, "5s"),
        (60.0, "1m"),
        (599.0, "1m"),
        (600.0, "10m"),
        (86_400.0, "10m"),  # beyond the largest: hops through it
        (-1.0, "5s"),
    ],
)
def test_tier_for_delay(delay_s: float, tier: str) -> None:
    assert tier_for_delay(TIERS, delay_s) == tier
    assert next_hop(list(TIERS), delay_s) == tier


def test_tier_order_in_the_list_does_not_matter() -> None:
    assert tier_for_delay(("10m", "5s", "1m"), 120.0) == "1m"
    assert tier_for_delay(("10m", "5s", "1m"), 1.0) == "5s"


def test_no_tiers_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no retry tiers"):
        tier_for_delay((), 10.0)


@PROPERTY
@given(tiers=tier_lists, delay_s=st.floats(-10.0, 10**7, allow_nan=False))
def test_tier_for_delay_properties(tiers: list[str], delay_s: float) -> None:
    chosen = tier_for_delay(tiers, delay_s)
    assert chosen in tiers
    delays = {tier: parse_duration(tier) for tier in tiers}
    fitting = [d for d in delays.values() if d <= delay_s]
    if fitting:
        # The largest tier that does not overshoot the delay.
        assert delays[chosen] == max(fitting)
    else:
        assert delays[chosen] == min(delays.values())


@PROPERTY
@given(tiers=tier_lists, delay_s=st.floats(0.0, 10**7))
def test_hops_reach_the_due_time_without_overshooting(tiers: list[str], delay_s: float) -> None:
    # The relay re-sends an early record to next_hop(remaining) after each tier's delay.
    smallest = min(parse_duration(t) for t in tiers)
    remaining = delay_s
    for _ in range(200):  # enough to see the pattern; ['1s', '1d'] could take 86,400 hops
        if remaining < smallest:
            break
        tier_s = parse_duration(next_hop(tiers, remaining))
        assert 0 < tier_s <= remaining
        remaining -= tier_s
    else:
        return
    # What is left is shorter than every tier: the last tier holds it until not-before.
    assert 0 <= remaining < smallest
    assert parse_duration(next_hop(tiers, remaining)) == smallest


def test_a_tier_holds_a_record_for_its_delay_plus_the_largest_jitter() -> None:
    from stream_jobs.retry import RetryPolicy

    policy = RetryPolicy(tiers=("5s", "1m", "10m"), max_attempts=4)
    assert policy.max_hold_ms("5s") == 5_500
    assert policy.max_hold_ms("10m") == 600_000 + 30_000  # jitter capped at 30 s
    for attempt, tier in ((1, "5s"), (2, "1m"), (3, "10m")):
        retry = decide(policy, attempt=attempt, permanent=False, now_ms=0, rand=0.999999)
        assert isinstance(retry, Retry)
        assert retry.not_before_ms <= policy.max_hold_ms(tier)
