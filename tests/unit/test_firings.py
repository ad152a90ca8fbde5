"""Firing job IDs and the missed policy: which due firings run."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_jobs.job_ids import MAX_JOB_ID_CHARS, job_id_time_ms
from stream_jobs.periodic import MISSED_POLICIES, ScheduleSpec
from stream_jobs.schedules.firings import LATE_S, MAX_CATCH_UP, due_firings, firing_job_id
from stream_jobs.schedules.timing import fire_times

LATE_MS = int(LATE_S * 1000)
UUID7 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


# -- job IDs ------------------------------------------------------------------------------


def test_a_firing_has_one_job_id_whoever_computes_it() -> None:
    one = firing_job_id("jobs", "digest.send", "nightly", 1_774_745_400_000)
    assert one == firing_job_id("jobs", "digest.send", "nightly", 1_774_745_400_000)
    assert UUID7.match(one)
    assert len(one) == 36 <= MAX_JOB_ID_CHARS
    # The UUIDv7 time is the fire time: IDs sort by it and lookups narrow their scan by it.
    assert job_id_time_ms(one) == 1_774_745_400_000


@given(st.text(min_size=1, max_size=20), st.text(min_size=1, max_size=20),
       st.text(min_size=1, max_size=20), st.integers(0, 2**48 - 1), st.integers(0, 3))
def test_different_parts_give_different_ids(prefix: str, job_type: str, name: str,
                                            fire_ms: int, which: int) -> None:
    base = firing_job_id(prefix, job_type, name, fire_ms)
    assert UUID7.match(base)
    changed = [(prefix + "x", job_type, name, fire_ms), (prefix, job_type + "x", name, fire_ms),
               (prefix, job_type, name + "x", fire_ms),
               (prefix, job_type, name, (fire_ms + 1) % 2**48)][which]
    assert firing_job_id(*changed) != base


def test_the_parts_cannot_run_into_each_other() -> None:
    assert firing_job_id("a", "b.c", "d", 5) != firing_job_id("a", "b", "c.d", 5)


def test_a_fire_time_a_uuid7_cannot_hold_is_refused() -> None:
    with pytest.raises(ValueError, match="outside what a UUIDv7 can hold"):
        firing_job_id("p", "t", "n", -1)


# -- the missed policy --------------------------------------------------------------------

MINUTE = 60_000


def every_minute(missed: str) -> ScheduleSpec:
    return ScheduleSpec("n", every_s=60.0, missed=missed)  # type: ignore[arg-type]


def test_on_time_exactly_the_due_firing_runs_under_every_policy() -> None:
    for missed in MISSED_POLICIES:
        due = due_firings(every_minute(missed), 10 * MINUTE, 11 * MINUTE + 5)
        assert (due.fire_ms, due.horizon_ms, due.dropped) == ((11 * MINUTE,), 11 * MINUTE, 0)


def test_nothing_is_due_before_the_next_fire_time() -> None:
    due = due_firings(every_minute("latest"), 10 * MINUTE, 11 * MINUTE - 1)
    assert (due.fire_ms, due.horizon_ms, due.dropped) == ((), 10 * MINUTE, 0)


def test_after_downtime_latest_runs_the_newest_missed_firing_once() -> None:
    # Down from 10:00 to 15:40: 11:00 ... 15:00 were missed (and are more than 30 s old).
    due = due_firings(every_minute("latest"), 10 * MINUTE, 15 * MINUTE + 40_000)
    assert (due.fire_ms, due.horizon_ms, due.dropped) == ((15 * MINUTE,), 15 * MINUTE, 4)


def test_after_downtime_skip_runs_none_and_all_runs_each() -> None:
    skip = due_firings(every_minute("skip"), 10 * MINUTE, 15 * MINUTE + 40_000)
    assert (skip.fire_ms, skip.horizon_ms, skip.dropped) == ((), 15 * MINUTE, 5)
    every = due_firings(every_minute("all"), 10 * MINUTE, 15 * MINUTE + 40_000)
    assert every.fire_ms == tuple(m * MINUTE for m in range(11, 16))
    assert every.dropped == 0


def test_all_is_capped_at_the_newest_hundred() -> None:
    due = due_firings(every_minute("all"), 0, 1000 * MINUTE)
    assert len(due.fire_ms) == MAX_CATCH_UP
    assert due.fire_ms[0] == 901 * MINUTE
    assert due.fire_ms[-1] == 1000 * MINUTE
    assert due.dropped == 900


def test_a_firing_up_to_thirty_seconds_late_is_late_not_missed() -> None:
    spec = ScheduleSpec("n", every_s=10.0, missed="skip")
    due = due_firings(spec, 0, 100_000 + LATE_MS)
    # At 130 s, the firings of 100 s ... 130 s are at most 30 s overdue: they run even
    # under skip; 10 s ... 90 s were missed.
    assert due.fire_ms == (100_000, 110_000, 120_000, 130_000)
    assert due.dropped == 9


pass_gaps = st.lists(st.integers(1, LATE_MS), min_size=1, max_size=40)
policies = st.sampled_from(MISSED_POLICIES)
periods = st.sampled_from([1.0, 2.5, 10.0, 60.0])


@settings(max_examples=200, deadline=None)
@given(periods, policies, st.integers(0, 10**12), pass_gaps)
def test_passes_never_more_than_late_s_apart_run_every_firing_once(
        period: float, missed: str, start: int, gaps: list[int]) -> None:
    # However a leader's passes fall (a slow machine, a failover shorter than LATE_S),
    # every fire time runs exactly once and in order, whatever the policy.
    spec = ScheduleSpec("n", every_s=period, missed=missed)  # type: ignore[arg-type]
    horizon, now, ran = start, start, []
    for gap in gaps:
        now += gap
        due = due_firings(spec, horizon, now)
        ran += due.fire_ms
        assert due.dropped == 0
        horizon = due.horizon_ms
    expected, _ = fire_times(spec, start, now, newest=10**6)
    assert ran == expected


@settings(max_examples=200, deadline=None)
@given(periods, policies, st.integers(0, 10**12), st.integers(0, 10**9))
def test_what_runs_is_due_in_order_and_a_second_look_finds_nothing(
        period: float, missed: str, horizon: int, span: int) -> None:
    spec = ScheduleSpec("n", every_s=period, missed=missed)  # type: ignore[arg-type]
    now = horizon + span
    due = due_firings(spec, horizon, now)
    times, total = fire_times(spec, horizon, now, newest=10**6) if span < 10**7 else \
        fire_times(spec, horizon, now, newest=MAX_CATCH_UP)
    assert set(due.fire_ms) <= set(times) or span >= 10**7
    assert list(due.fire_ms) == sorted(due.fire_ms)
    assert len(due.fire_ms) <= MAX_CATCH_UP
    assert len(due.fire_ms) + due.dropped == total
    assert all(now - t > LATE_MS for t in times if t not in due.fire_ms)
    if total and missed == "latest":
        assert due.fire_ms[-1] == times[-1]
    # The horizon moves to the newest due firing, so a second scheduler (or this one a
    # moment later) that reads it finds nothing more to do.
    assert due_firings(spec, due.horizon_ms, now).fire_ms == ()
