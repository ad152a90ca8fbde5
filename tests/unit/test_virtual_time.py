"""Where a JobTester moves its clock next (`next_stop`, pure) and the clock itself."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_jobs import clock
from stream_jobs.errors import ConfigError
from stream_jobs.testing.virtual_time import VirtualClock, next_stop, start_ms_of

times = st.lists(st.integers(min_value=0, max_value=10_000), max_size=6)


@given(now=st.integers(min_value=0, max_value=10_000), held=times, firings=times,
       until=st.none() | st.integers(min_value=0, max_value=10_000))
def test_the_clock_never_moves_back_nor_past_the_limit(
        now: int, held: list[int], firings: list[int], until: int | None) -> None:
    stop = next_stop(now, held, firings, until)
    if stop is None:
        return
    assert stop > now
    if until is not None:
        assert stop <= until
        assert stop == until or stop in held + firings
    else:
        assert stop in held + firings


@given(now=st.integers(min_value=0, max_value=10_000), held=times, firings=times)
def test_run_until_idle_goes_on_exactly_while_records_are_held_later(
        now: int, held: list[int], firings: list[int]) -> None:
    later = [at for at in held if at > now]
    stop = next_stop(now, held, firings, None)
    assert (stop is None) == (not later)
    if later:
        # Nothing due before the stop is skipped: a firing before the hold comes first.
        assert stop == min(later + [at for at in firings if at > now])


@given(now=st.integers(min_value=0, max_value=10_000), held=times, firings=times,
       step=st.integers(min_value=0, max_value=10_000))
def test_advance_visits_every_due_time_in_order_then_the_limit(
        now: int, held: list[int], firings: list[int], step: int) -> None:
    until = now + step
    visited = []
    at = now
    while (stop := next_stop(at, held, firings, until)) is not None:
        visited.append(stop)
        at = stop
    due = sorted({t for t in held + firings if now < t <= until})
    expected = due if until in due or until == now else [*due, until]
    assert visited == expected


def test_the_virtual_clock_only_moves_forward() -> None:
    virtual = VirtualClock(1_000)
    virtual.move_to(2_500)
    assert virtual.now_ms() == 2_500
    assert virtual.now == datetime(1970, 1, 1, 0, 0, 2, 500_000, tzinfo=UTC)
    with pytest.raises(ConfigError, match="only moves forward"):
        virtual.move_to(2_000)


def test_a_start_time_is_read_as_utc_when_naive() -> None:
    assert start_ms_of(None, 42) == 42
    assert start_ms_of(datetime(2026, 3, 1, 2, 0), 0) == \
        start_ms_of(datetime(2026, 3, 1, 3, 0, tzinfo=timezone(timedelta(hours=1))), 0)


def test_the_stream_jobs_clock_reads_one_virtual_clock_at_a_time() -> None:
    virtual = VirtualClock(123)
    with clock.reading(virtual):
        assert clock.now_ms() == 123
        with pytest.raises(ConfigError, match="Another virtual clock"), \
                clock.reading(VirtualClock(0)):
            pass
        assert clock.now_ms() == 123
    assert clock.now_ms() > 1_600_000_000_000
