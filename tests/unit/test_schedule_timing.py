"""Fire times: cron on a timezone's wall clock across DST changes, every in elapsed time,
and the properties every scheduler relies on (any start gives the same fire times)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import given, settings
from hypothesis import strategies as st

from stream_jobs.periodic import ScheduleSpec
from stream_jobs.schedules.timing import fire_times, local_time, next_fire_ms

BERLIN = ZoneInfo("Europe/Berlin")


def ms(text: str) -> int:
    """An ISO time with its offset, as Unix ms."""
    return round(datetime.fromisoformat(text).timestamp() * 1000)


def day_of(spec: ScheduleSpec, day: str) -> list[str]:
    """Every firing during one local calendar day, as ISO times with offsets."""
    start = datetime.fromisoformat(day).replace(tzinfo=spec.zone)
    end = start + timedelta(days=1)
    times, _ = fire_times(spec, ms(start.isoformat()) - 1, ms(end.isoformat()) - 1,
                          newest=1000)
    return [local_time(spec, t).isoformat() for t in times]


# -- Europe/Berlin springs forward on 2026-03-29 (02:00 CET -> 03:00 CEST) ------------------


def test_a_firing_in_the_skipped_hour_fires_once_just_after_the_gap() -> None:
    spec = ScheduleSpec("n", cron="30 2 * * *", timezone="Europe/Berlin")
    assert day_of(spec, "2026-03-28") == ["2026-03-28T02:30:00+01:00"]
    assert day_of(spec, "2026-03-29") == ["2026-03-29T03:00:00+02:00"]
    assert day_of(spec, "2026-03-30") == ["2026-03-30T02:30:00+02:00"]
    # From just before the gap, the next firing is the moved one, 01:00 UTC.
    assert next_fire_ms(spec, ms("2026-03-29T01:59:00+01:00")) == ms("2026-03-29T01:00:00+00:00")


def test_on_the_spring_forward_day_an_hourly_schedule_fires_23_times() -> None:
    spec = ScheduleSpec("n", cron="0 * * * *", timezone="Europe/Berlin")
    fired = day_of(spec, "2026-03-29")
    assert len(fired) == 23
    assert "2026-03-29T01:00:00+01:00" in fired
    assert "2026-03-29T03:00:00+02:00" in fired
    assert not any("T02:" in t for t in fired)


def test_a_quarter_hourly_schedule_skips_the_missing_hour() -> None:
    spec = ScheduleSpec("n", cron="*/15 * * * *", timezone="Europe/Berlin")
    fired = day_of(spec, "2026-03-29")
    at = fired.index("2026-03-29T01:45:00+01:00")
    assert fired[at + 1] == "2026-03-29T03:00:00+02:00"
    assert len(fired) == 23 * 4


# -- Europe/Berlin falls back on 2026-10-25 (03:00 CEST -> 02:00 CET) -----------------------


def test_a_firing_in_the_repeated_hour_fires_once_at_its_first_occurrence() -> None:
    spec = ScheduleSpec("n", cron="30 2 * * *", timezone="Europe/Berlin")
    assert day_of(spec, "2026-10-25") == ["2026-10-25T02:30:00+02:00"]
    # Starting inside the second 02:xx (CET), the firing of that day is already past.
    second_copy = ms("2026-10-25T02:10:00+01:00")
    assert next_fire_ms(spec, second_copy) == ms("2026-10-26T02:30:00+01:00")
    assert fire_times(spec, ms("2026-10-25T00:00:00+02:00"), second_copy, newest=10)[0] == \
        [ms("2026-10-25T02:30:00+02:00")]


def test_on_the_fall_back_day_an_hourly_schedule_fires_25_times_both_two_oclocks() -> None:
    spec = ScheduleSpec("n", cron="0 * * * *", timezone="Europe/Berlin")
    fired = day_of(spec, "2026-10-25")
    assert len(fired) == 25
    assert fired.count("2026-10-25T02:00:00+02:00") == 1
    assert fired.count("2026-10-25T02:00:00+01:00") == 1


def test_new_york_moves_the_same_way_on_its_own_days() -> None:
    # New York springs forward at 02:00 and falls back at 02:00 EDT to 01:00 EST.
    spec = ScheduleSpec("n", cron="30 2 * * *", timezone="America/New_York")
    assert day_of(spec, "2026-03-08") == ["2026-03-08T03:00:00-04:00"]
    repeated = ScheduleSpec("n", cron="30 1 * * *", timezone="America/New_York")
    assert day_of(repeated, "2026-11-01") == ["2026-11-01T01:30:00-04:00"]


def test_every_counts_elapsed_time_and_ignores_the_clock_change() -> None:
    spec = ScheduleSpec("n", every_s=3600.0)
    start = ms("2026-03-29T00:00:00+01:00")
    times, total = fire_times(spec, start, start + 6 * 3_600_000, newest=100)
    assert total == 6
    assert [b - a for a, b in itertools.pairwise(times)] == [3_600_000] * 5
    assert all(t % 3_600_000 == 0 for t in times)


def test_fire_times_keep_the_newest_and_count_them_all() -> None:
    spec = ScheduleSpec("n", every_s=1.0)
    times, total = fire_times(spec, 0, 10_000, newest=3)
    assert (times, total) == ([8000, 9000, 10_000], 10)
    cron = ScheduleSpec("n", cron="* * * * *")
    times, total = fire_times(cron, 0, 10 * 60_000, newest=2)
    assert (times, total) == ([9 * 60_000, 10 * 60_000], 10)
    assert fire_times(spec, 5000, 5000, newest=3) == ([], 0)


# -- properties ---------------------------------------------------------------------------

ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata",
         "America/Sao_Paulo", "Pacific/Chatham"]
EXPRESSIONS = ["30 2 * * *", "0 * * * *", "*/15 * * * *", "30 1-3 * * *", "0 0 * * *",
               "45 23 * * 0", "0 2 1 * *", "*/7 2 * * *", "0 3 29 3 *"]
YEAR_START = ms("2026-01-01T00:00:00+00:00")
# The days around Berlin's and New York's changes, where the bugs would be.
CHANGES = [ms(t) for t in ("2026-03-08T07:00:00+00:00", "2026-03-29T01:00:00+00:00",
                           "2026-10-25T01:00:00+00:00", "2026-11-01T06:00:00+00:00")]

instants = st.one_of(
    st.integers(YEAR_START, YEAR_START + 365 * 86_400_000),
    st.builds(lambda at, off: at + off, st.sampled_from(CHANGES),
              st.integers(-6 * 3_600_000, 6 * 3_600_000)))
cron_specs = st.builds(lambda expr, zone: ScheduleSpec("p", cron=expr, timezone=zone),
                       st.sampled_from(EXPRESSIONS), st.sampled_from(ZONES))
every_specs = st.builds(lambda s: ScheduleSpec("p", every_s=float(s)),
                        st.sampled_from([1, 7, 60, 300, 3600, 86_400]))
specs = st.one_of(cron_specs, every_specs)


@settings(max_examples=300, deadline=None)
@given(specs, instants)
def test_the_next_firing_is_later_and_nothing_fires_in_between(spec: ScheduleSpec,
                                                               after: int) -> None:
    nxt = next_fire_ms(spec, after)
    assert nxt is not None
    assert nxt > after
    assert fire_times(spec, after, nxt - 1, newest=5) == ([], 0)
    assert fire_times(spec, after, nxt, newest=5) == ([nxt], 1)


@settings(max_examples=300, deadline=None)
@given(specs, instants, st.floats(0, 1))
def test_any_start_before_a_firing_finds_that_same_firing(spec: ScheduleSpec, after: int,
                                                          where: float) -> None:
    # Two schedulers that started at different moments agree on every fire time, so
    # they derive the same job IDs.
    nxt = next_fire_ms(spec, after)
    assert nxt is not None
    other_start = after + int((nxt - 1 - after) * where)
    assert next_fire_ms(spec, other_start) == nxt


@settings(max_examples=300, deadline=None)
@given(specs, instants, st.integers(1, 3 * 86_400_000))
def test_a_span_holds_exactly_the_firings_stepped_through_one_by_one(
        spec: ScheduleSpec, until: int, length: int) -> None:
    # The span ends anywhere, inside a repeated hour too (that end is where a catch-up
    # after downtime starts counting back from).
    after = until - length
    stepped = []
    at = after
    while True:
        nxt = next_fire_ms(spec, at)
        assert nxt is not None
        if nxt > until or len(stepped) > 400:
            break
        stepped.append(nxt)
        at = nxt
    times, total = fire_times(spec, after, until, newest=500)
    if len(stepped) <= 400:
        assert times == stepped
        assert total == len(stepped)
    assert times == sorted(set(times))


def test_local_time_is_the_wall_clock_of_the_zone() -> None:
    spec = ScheduleSpec("n", cron="30 2 * * *", timezone="Europe/Berlin")
    moment = local_time(spec, ms("2026-10-25T00:30:00+00:00"))
    assert moment.isoformat() == "2026-10-25T02:30:00+02:00"
    assert moment.astimezone(UTC).hour == 0


def stepped(spec: ScheduleSpec, after: int, until: int) -> list[int]:
    found = []
    at = after
    while (nxt := next_fire_ms(spec, at)) is not None and nxt <= until:
        found.append(nxt)
        at = nxt
    return found


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]),
       st.sampled_from(["30 2 * * *", "30 1 * * *", "0 2 * * *", "15,45 1-2 * * *",
                        "0 * * * *", "*/20 * * * *"]),
       st.sampled_from([*CHANGES, ms("2026-04-05T15:00:00+00:00"),
                        ms("2026-10-04T15:30:00+00:00")]),
       st.integers(-3 * 3_600_000, 3 * 3_600_000), st.integers(1, 12 * 3_600_000))
def test_spans_ending_inside_a_clock_change_hold_the_same_firings(
        zone: str, expr: str, change: int, offset: int, length: int) -> None:
    spec = ScheduleSpec("p", cron=expr, timezone=zone)
    until = change + offset
    times, _ = fire_times(spec, until - length, until, newest=1000)
    assert times == stepped(spec, until - length, until)
