"""The history's pure parts: tallies, a worker's slots, and folding reports into windows.

The property that makes the history exact: however a worker's reports arrive (some lost,
some read twice, in order), adding each report's `slot_deltas` to what came before gives
the worker's own counts, each in the slot its end was recorded in.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_jobs.history.reports import ReportSlots
from stream_jobs.history.tally import DWELL_BUCKETS_S, Tally, quantile, total
from stream_jobs.history.windows import SlotTallies, Windows, slot_deltas, window_start
from stream_jobs.histogram import DURATION_BUCKETS_S
from stream_jobs.runtime.reports import WorkerReport

OUTCOMES = ("succeeded", "retried", "dead_lettered", "cancelled", "expired")

tallies = st.builds(
    Tally,
    outcomes=st.dictionaries(st.sampled_from(OUTCOMES), st.integers(0, 1000)),
    durations=st.lists(st.integers(0, 50), min_size=len(DURATION_BUCKETS_S) + 1,
                       max_size=len(DURATION_BUCKETS_S) + 1),
    dwells=st.lists(st.integers(0, 50), min_size=len(DWELL_BUCKETS_S) + 1,
                    max_size=len(DWELL_BUCKETS_S) + 1),
)


@given(tallies, tallies)
def test_subtracting_what_was_added_gives_back_the_tally(a: Tally, b: Tally) -> None:
    assert a.plus(b).minus(a).to_obj() == b.to_obj()
    assert a.plus(b).finished == a.finished + b.finished


@given(tallies)
def test_a_tally_reads_back_from_its_json_object(a: Tally) -> None:
    assert Tally.from_obj(a.to_obj()).to_obj() == a.to_obj()


@pytest.mark.parametrize("bad", [
    [], {"outcomes": []}, {"outcomes": {"succeeded": -1}}, {"outcomes": {"x": True}},
    {"durations": [1, 2]}, {"dwells": "many"},
])
def test_what_is_not_a_tally_is_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        Tally.from_obj(bad)


@given(st.lists(st.integers(0, 20), min_size=4, max_size=4),
       st.floats(0.01, 1.0), st.floats(0.01, 1.0))
def test_a_quantile_is_a_bucket_bound_and_grows_with_q(counts: list[int], q1: float,
                                                       q2: float) -> None:
    bounds = (1.0, 2.0, 3.0)
    low, high = sorted((q1, q2))
    a, b = quantile(counts, bounds, low), quantile(counts, bounds, high)
    if sum(counts) == 0:
        assert a is None and b is None
    else:
        assert a in bounds and b in bounds and a is not None and b is not None and a <= b


def test_percentiles_of_runs_read_off_their_buckets() -> None:
    tally = Tally()
    for seconds in (0.0004, 0.0004, 0.0004, 0.3):
        tally.observe(seconds, 2.0)
    assert tally.duration_s(0.5) == 0.0005
    assert tally.duration_s(1.0) == 0.5
    assert tally.dwell_s(0.95) == 2.5
    assert Tally().duration_s(0.5) is None


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000_000_000  # a whole minute, in Unix ms


def test_a_job_ending_after_a_boundary_counts_once_in_the_window_it_ended_in() -> None:
    totals: Counter[str] = Counter()
    slots = SlotTallies(totals, 60)
    start = 1_800_000_000_000 - 1_000  # 1 s before a minute's end: the run starts here
    slots.tick(start)
    ended = start + 1_500  # and ends 0.5 s into the next minute
    slots.tick(ended)
    totals["succeeded"] += 1
    slots.observe(1.5, 0.0)
    seen = slots.slots(ended)
    assert {s: t.outcomes for s, t in seen.items()} == {1_800_000_000_000: {"succeeded": 1}}
    assert sum(t.finished for t in seen.values()) == 1


steps = st.lists(st.tuples(st.integers(0, 40_000), st.sampled_from(OUTCOMES),
                           st.sampled_from(("report", "lost", "twice", "none"))),
                 max_size=80)


@given(steps)
def test_folding_reports_however_they_arrive_gives_the_workers_counts(
        plan: list[tuple[int, str, str]]) -> None:
    totals: Counter[str] = Counter()
    slots = SlotTallies(totals, 10, kept=1_000)
    now = 1_000_000
    seen: dict[int, Tally] = {}
    windows: dict[int, Tally] = {}

    def deliver(report: dict[int, Tally]) -> None:
        nonlocal seen
        for start, delta in slot_deltas(seen, report):
            minute = window_start(start, 60)
            windows[minute] = windows.get(minute, Tally()).plus(delta)
        seen = report

    for advance, outcome, delivery in plan:
        now += advance
        slots.tick(now)
        totals[outcome] += 1
        slots.observe(0.001, 0.5)
        report = slots.slots(now)
        if delivery == "report":
            deliver(report)
        elif delivery == "twice":
            deliver(report)
            deliver(report)
    deliver(slots.slots(now))  # the final report
    assert total(list(windows.values())).outcomes == {k: v for k, v in totals.items() if v}
    assert sum(total(list(windows.values())).durations) == len(plan)


def test_slots_older_than_the_kept_ones_are_dropped() -> None:
    totals: Counter[str] = Counter()
    slots = SlotTallies(totals, 1, kept=3)
    for second in range(10):
        slots.tick(second * 1000)
        totals["succeeded"] += 1
    assert sorted(slots.slots(9_000)) == [6_000, 7_000, 8_000, 9_000]


def test_spans_name_their_windows_and_refuse_others() -> None:
    windows = Windows(60)
    assert windows.span("1h") == (60, 3600)
    assert windows.span("24h") == (3600, 86400)
    assert windows.span("7d") == (3600, 7 * 86400)
    with pytest.raises(ValueError, match="unknown history window '2h': one of 1h, 24h, 7d"):
        windows.span("2h")
    with pytest.raises(ValueError):
        Windows(0)


def test_the_history_reads_the_slots_of_a_workers_report() -> None:
    tally = Tally({"succeeded": 3})
    report = WorkerReport(job_type="t", worker_id="w1", at_ms=5, started_at_ms=1,
                          slot_ms=60_000, slots={60_000: tally.to_obj()}, final=True)
    read = ReportSlots.from_json(report.to_json())
    assert read is not None
    assert (read.job_type, read.worker_id, read.at_ms, read.slot_ms, read.final) == \
        ("t", "w1", 5, 60_000, True)
    assert read.slots[60_000].to_obj() == tally.to_obj()
    back = WorkerReport.from_json(report.to_json())
    assert back is not None and back.slots == {60_000: tally.to_obj()}


def test_reports_without_slots_or_with_a_bad_slot_are_not_read() -> None:
    old = WorkerReport(job_type="t", worker_id="w1", at_ms=5, started_at_ms=1)
    assert ReportSlots.from_json(old.to_json()) is None
    assert ReportSlots.from_json(b'{"shadow": true}') is None
    assert ReportSlots.from_json(b"not json") is None
    bad = (b'{"job_type": "t", "worker_id": "w", "at_ms": 1, "slot_ms": 60000, '
           b'"slots": {"0": {"outcomes": {"succeeded": -2}}}}')
    assert ReportSlots.from_json(bad) is None
