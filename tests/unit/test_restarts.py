"""The supervisor's restart policy: backoff, streaks and giving up. Pure."""

from __future__ import annotations

import os
import signal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_jobs.runtime.restarts import (
    Restart,
    RestartPolicy,
    after_exit,
    describe_exit,
    exit_code_of,
    restart_delay_s,
    should_give_up,
    streak_now,
)

PROPERTY = settings(max_examples=300, deadline=None)
POLICY = RestartPolicy()
QUICK = 2.0  # seconds: well within stable_after_s
LONG = POLICY.stable_after_s + 1

policies = st.builds(
    lambda first, factor, stable, give_up: RestartPolicy(first, first * factor, stable, give_up),
    st.floats(0.01, 10.0), st.floats(1.0, 1000.0), st.floats(0.1, 3600.0), st.integers(0, 20))


def test_a_child_that_keeps_dying_waits_twice_as_long_each_time_up_to_the_cap() -> None:
    delays, streak = [], 0
    for _ in range(9):
        decision = after_exit(POLICY, quick_deaths=streak, lived_s=QUICK)
        delays.append(decision.delay_s)
        streak = decision.quick_deaths
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert streak == 9


def test_a_long_run_forgets_the_streak() -> None:
    decision = after_exit(POLICY, quick_deaths=7, lived_s=LONG)
    assert decision == Restart(POLICY.first_delay_s, 0)


def test_the_supervisor_gives_up_only_when_every_child_keeps_dying() -> None:
    limit = POLICY.give_up_after
    assert should_give_up(POLICY, [limit, limit])
    assert not should_give_up(POLICY, [limit, limit - 1])
    assert not should_give_up(POLICY, [])
    assert not should_give_up(RestartPolicy(give_up_after=0), [99, 99])
    # A child up for a minute is past its streak, however long it was.
    assert streak_now(POLICY, limit, alive_s=LONG) == 0
    assert streak_now(POLICY, limit, alive_s=QUICK) == limit
    assert streak_now(POLICY, limit, alive_s=None) == limit  # waiting for its restart


@PROPERTY
@given(policies, st.integers(0, 10_000))
def test_delays_stay_within_the_bounds_and_never_shrink_along_a_streak(
        policy: RestartPolicy, streak: int) -> None:
    delay = restart_delay_s(policy, streak)
    assert policy.first_delay_s <= delay <= policy.max_delay_s
    assert restart_delay_s(policy, streak + 1) >= delay


@PROPERTY
@given(policies, st.integers(0, 1000), st.floats(0.0, 10_000.0))
def test_every_exit_is_restarted_and_the_streak_moves_by_one_or_resets(
        policy: RestartPolicy, streak: int, lived_s: float) -> None:
    decision = after_exit(policy, quick_deaths=streak, lived_s=lived_s)
    quick = lived_s < policy.stable_after_s
    assert decision.quick_deaths == (streak + 1 if quick else 0)
    assert decision.delay_s == restart_delay_s(policy, decision.quick_deaths)


@PROPERTY
@given(policies, st.lists(st.integers(0, 40), max_size=8))
def test_giving_up_means_every_streak_reached_the_limit(policy: RestartPolicy,
                                                        streaks: list[int]) -> None:
    expected = (policy.give_up_after > 0 and bool(streaks)
                and min(streaks) >= policy.give_up_after)
    assert should_give_up(policy, streaks) == expected


def test_exits_are_described_as_a_person_reads_them() -> None:
    assert describe_exit(0) == "exited with code 0"
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(-signal.SIGKILL) == "was killed by SIGKILL"
    assert describe_exit(-99) == "was killed by signal 99"


def test_wait_statuses_become_return_codes() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    _, status = os.waitpid(pid, 0)
    assert exit_code_of(status) == 7
    pid = os.fork()
    if pid == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert exit_code_of(status) == -signal.SIGKILL


@pytest.mark.parametrize("bad", [dict(first_delay_s=0), dict(first_delay_s=5, max_delay_s=1),
                                 dict(stable_after_s=0), dict(give_up_after=-1)])
def test_a_policy_that_cannot_work_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        RestartPolicy(**bad)  # type: ignore[arg-type]
