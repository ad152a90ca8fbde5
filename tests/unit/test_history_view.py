"""The readers' view of a span of history (stream_jobs/history/view.py): which windows a
span holds, rows grouped for the table, rates over the time covered, percentiles, the
JSON document and the note for an empty span."""

from __future__ import annotations

import pytest

from stream_jobs.history.store import WindowRow
from stream_jobs.history.tally import Tally
from stream_jobs.history.view import HistoryView, span_bounds, span_name
from stream_jobs.history.windows import Windows

MIN = 60_000
HOUR = 60 * MIN
NOW = 1_796_570_000_000 // HOUR * HOUR + 30 * MIN + 30_000  # 30.5 minutes into an hour


def _tally(outcomes: dict[str, int], runs: list[tuple[float, float]] = ()) -> Tally:
    tally = Tally(dict(outcomes))
    for duration_s, dwell_s in runs:
        tally.observe(duration_s, dwell_s)
    return tally


def _minute(minutes_ago: int, tally: Tally) -> WindowRow:
    start = NOW // MIN * MIN - minutes_ago * MIN
    return WindowRow("t", 60, start, tally)


def test_span_names_are_the_three_spans() -> None:
    assert [span_name(n) for n in ("1h", "24h", "7d")] == ["1h", "24h", "7d"]
    for bad in ("2h", "", "1H", "60m"):
        with pytest.raises(ValueError, match="use one of 1h, 24h, 7d"):
            span_name(bad)


def test_a_span_ends_with_the_window_now_is_in() -> None:
    windows = Windows(60)
    assert span_bounds(windows, "1h", NOW) == (60, NOW // MIN * MIN - 59 * MIN)
    assert span_bounds(windows, "24h", NOW) == (3600, NOW // HOUR * HOUR - 23 * HOUR)
    assert span_bounds(windows, "7d", NOW) == (3600, NOW // HOUR * HOUR - 167 * HOUR)
    # Test-sized windows: a "minute" of 2 s, an "hour" of 120 s.
    assert span_bounds(Windows(2), "24h", NOW)[0] == 120


def test_rows_rates_ratios_and_percentiles() -> None:
    found = [_minute(0, _tally({"succeeded": 30})),  # open: 30 s of its minute passed
             _minute(2, _tally({"succeeded": 80, "retried": 10, "dead_lettered": 10},
                               [(0.02, 0.3)] * 95 + [(2.0, 40.0)] * 5)),
             _minute(90, _tally({"succeeded": 999}))]  # before the span: left out
    view = HistoryView.of("t", "1h", Windows(60), found, now_ms=NOW)
    assert [r.start_ms for r in view.rows] == [found[1].start_ms, found[0].start_ms]
    closed, current = view.rows
    assert not closed.open
    assert current.open
    assert closed.failure_ratio == pytest.approx(0.2)
    assert closed.per_min == 100.0
    assert current.per_min == 60.0  # 30 jobs in the 30 s it has been open
    assert closed.tally.duration_s(0.5) == 0.025
    assert closed.tally.duration_s(0.99) == 2.5
    assert closed.tally.dwell_s(0.95) == 0.5
    assert closed.tally.dwell_s(0.99) == 60.0
    totals = view.totals()
    assert totals.tally.outcomes == {"succeeded": 110, "retried": 10, "dead_lettered": 10}
    assert totals.covered_s == 59 * 60 + 30  # the span so far
    assert view.outcome_names() == ["succeeded", "retried", "dead_lettered"]


def test_the_table_groups_minutes_by_five_and_hours_by_day() -> None:
    found = [_minute(m, _tally({"succeeded": 1, "expired": m})) for m in (0, 1, 4, 5, 6, 20)]
    view = HistoryView.of("t", "1h", Windows(60), found, now_ms=NOW)
    rows = view.table_rows()
    assert all(r.size_s == 300 and r.start_ms % (5 * MIN) == 0 for r in rows)
    assert sum(r.tally.finished for r in rows) == view.totals().tally.finished
    assert [r.open for r in rows] == [False] * (len(rows) - 1) + [True]
    assert view.outcome_names() == ["succeeded", "retried", "dead_lettered", "expired"]
    day = NOW // 86_400_000 * 86_400_000
    hours = [WindowRow("t", 3600, day - h * HOUR, _tally({"succeeded": h})) for h in (1, 30)]
    week = HistoryView.of("t", "7d", Windows(60), hours, now_ms=NOW).table_rows()
    assert [(r.start_ms, r.size_s, r.tally.finished) for r in week] == [
        (day - 2 * 86_400_000, 86_400, 30), (day - 86_400_000, 86_400, 1)]
    with pytest.raises(ValueError, match="at least one window"):
        view.grouped(0)


def test_the_document_and_the_note_of_an_empty_span() -> None:
    view = HistoryView.of("t", "1h", Windows(60), [_minute(3, _tally({"succeeded": 4},
                                                                   [(0.002, 0.0)] * 4))],
                          now_ms=NOW)
    doc = view.to_dict()
    assert doc["note"] is None
    assert doc["window"] == "1h"
    assert doc["size_s"] == 60
    row = doc["rows"][0]
    assert row["start"].endswith(":00.000Z")
    assert row["start_ms"] == view.rows[0].start_ms
    assert row["outcomes"] == {"succeeded": 4}
    assert row["failure_ratio"] == 0.0
    assert row["duration_s"] == {"p50": 0.0025, "p95": 0.0025, "p99": 0.0025}
    assert row["dwell_s"] == {"p50": 0.005, "p95": 0.005}
    empty = HistoryView.of("t", "24h", Windows(60), [], now_ms=NOW)
    assert empty.empty
    assert empty.totals().failure_ratio is None
    assert empty.totals().tally.duration_s(0.95) is None
    note = empty.to_dict()["note"]
    assert "stream-jobs history" in note
    assert "serve --history" in note
