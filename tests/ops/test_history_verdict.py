"""The history trial's verdict (ops/chaos/history_verdict.py): the history must say
exactly what the workers reported, through its own kills; what happened may exceed that
only by what the killed workers ended just before they died."""

from __future__ import annotations

from dataclasses import replace

from ops.chaos.history_verdict import HistoryEvidence, judge

REPORTED = {"succeeded": 95, "dead_lettered": 24, "duplicate": 3}


def _clean() -> HistoryEvidence:
    # 5 successes and 1 dead letter ended by killed workers after their last report.
    return HistoryEvidence({"succeeded": 100, "dead_lettered": 25},
                           {"succeeded": 7, "dead_lettered": 2}, dict(REPORTED),
                           dict(REPORTED), dict(REPORTED), dict(REPORTED), (40, 90))


def test_a_clean_run_breaks_no_promise() -> None:
    verdict = judge(_clean(), history_kills=2)
    assert verdict.ok, verdict.problems
    assert verdict.short == {"succeeded": 5, "dead_lettered": 1}
    assert verdict.history_kills_mid_stream == 2


def test_views_that_disagree_are_named() -> None:
    verdict = judge(replace(_clean(), hours={**REPORTED, "succeeded": 94}))
    assert verdict.problems == [
        "the hour windows say {'succeeded': 94, 'dead_lettered': 24, 'duplicate': 3}, the "
        "running total {'succeeded': 95, 'dead_lettered': 24, 'duplicate': 3}"]


def test_a_history_that_lost_or_doubled_a_report_is_named() -> None:
    for counted in (94, 96):  # one report's job lost, or folded twice
        views = {**REPORTED, "succeeded": counted}
        verdict = judge(replace(_clean(), totals=views, minutes=views, hours=views))
        assert len(verdict.problems) == 1
        assert verdict.problems[0].startswith(f"the history counts {{'succeeded': {counted}")


def test_reports_short_of_what_happened_beyond_the_killed_workers_last_moments() -> None:
    verdict = judge(replace(_clean(), allowance={"succeeded": 4, "dead_lettered": 2}))
    assert verdict.problems == [
        "the workers reported 95 succeeded of 100: 5 short, more than the 4 the killed "
        "workers ended just before they died"]
    over = judge(replace(_clean(), truth={"succeeded": 90, "dead_lettered": 25}))
    assert "the workers reported 95 succeeded, 5 more than happened (90)" in over.problems


def test_history_kills_before_it_counted_or_after_it_had_counted_all_tested_nothing() -> None:
    verdict = judge(replace(_clean(), counted_at_history_kills=(0, 122)), history_kills=2)
    assert verdict.history_kills_mid_stream == 0
    assert verdict.problems == [
        "only 0 of 2 kills of the history process came while it had counted some jobs and "
        "not all: the others tested nothing"]


def test_doubled_effects_are_named() -> None:
    assert judge(replace(_clean(), duplicate_effects=2)).problems == [
        "2 effects happened twice"]
