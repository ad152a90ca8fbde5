"""`make chaos`'s one entry point and its RESULTS.md: CHAOS_ONLY picks scenarios and trials
by name, every trial has its section with its verdict, and a partial run keeps the other
trials' last runs. Pure: no services."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ops.chaos import cancels, failover, report
from ops.chaos.checks import judge
from ops.chaos.protocol import row
from ops.chaos.run import TRIALS, chosen
from ops.chaos.scenarios import SCENARIOS
from ops.chaos.trial import TrialResult

from .test_chaos_checks import evidence

META: report.MetaJSON = {"date": "2026-01-01 00:00 UTC", "commit": "abc1234", "jobs": 500,
                         "runs": 1, "minutes": 1.0, "machine": "2 cores", "n_note": ""}


def _cancel_row(run: int, problems: list[str]) -> dict[str, object]:
    return row(run, time.time() - 30, problems, jobs=20_000, kills=5, cancelled=4_369,
               finished_first=2_297, done=15_631, duplicate_effects=0, lost=0)


def test_chaos_only_names_scenarios_and_trials() -> None:
    scenarios, trials = chosen("")
    assert [s.name for s in scenarios] == list(SCENARIOS)
    assert [t.name for t in trials] == ["failover", "batches", "cancels", "outbox",
                                          "fairness", "results", "outbox-relay", "unique",
                                          "history", "listen", "batches@net",
                                          "cancels@net", "fairness@net", "results@net",
                                          "outbox-relay@net", "unique@net", "failover@cluster",
                                          "batches@cluster",
                                          "fairness@cluster", "results@cluster",
                                          "outbox-relay@cluster", "unique@cluster"]
    scenarios, trials = chosen("outbox, kill9,batches")
    assert [s.name for s in scenarios] == ["kill9"]
    assert [t.name for t in trials] == ["batches", "outbox"]
    with pytest.raises(SystemExit, match=r"unknown scenarios \['batch'\].*cancels, outbox"):
        chosen("batch")


def test_every_trial_has_a_section_with_its_verdict() -> None:
    process = TrialResult("baseline", 1, judge(evidence()), 8.0, [], [], time.time())
    text = report.render([report.row(process)], META,
                         [(cancels.TRIAL, [_cancel_row(1, []), _cancel_row(2, ["1 lost"])]),
                          (failover.TRIAL, [])])
    assert "| baseline | 1 |" in text
    assert "## Cancels racing runs" in text
    assert "**Verdict: PROBLEMS in run 2 (see below).**" in text
    assert "| 1 | 20,000 | 5 | 0 | 0 | 4,369 | 2,297 | 15,631 | 0 | 0 | 30 | yes |" in text
    assert "- cancels run 2: 1 lost" in text
    assert "## Scheduler failover" not in text  # no runs, no section
    assert "**Verdict: PROBLEMS FOUND** (see the problems below)." in text
    assert text.rstrip().endswith(report.METHOD.rstrip())


def test_a_trial_alone_has_no_scenario_table() -> None:
    text = report.render([], META, [(cancels.TRIAL, [_cancel_row(1, [])])])
    assert "| scenario | run |" not in text
    assert "**Verdict: 0 lost and 0 duplicate effects in every run**." in text
    assert "**Verdict: every run passed its checks (1 of 1).**" in text


def test_a_partial_run_keeps_the_other_trials_last_runs(tmp_path: Path) -> None:
    previous = tmp_path / "results.json"
    previous.write_text(json.dumps({"trials": {"cancels": [_cancel_row(1, [])],
                                               "failover": [{"run": 9}]}}))
    fresh = {"failover": [{"run": 1}]}
    merged = dict((t.name, rows) for t, rows in
                  report.merged_trials(previous, fresh, list(TRIALS.values())))
    assert merged["failover"] == [{"run": 1}]
    assert [r["run"] for r in merged["cancels"]] == [1]
    assert merged["outbox"] == []


def test_the_header_names_the_commit_each_runs_measured() -> None:
    process = report.row(TrialResult("baseline", 1, judge(evidence()), 8.0, [], [],
                                     time.time()))
    process["commit"] = "abc1234"
    older = {**process, "scenario": "kill9"}
    del older["commit"]  # a run kept from a file written before runs named their commit
    trial = {**_cancel_row(1, []), "commit": "abc1234"}
    text = report.render([process, older], META, [(cancels.TRIAL, [trial])])
    assert "The runs' commits: abc1234: baseline, cancels; unknown: kill9." in text


def test_runs_at_the_full_n_are_kept_apart_from_the_usual_ones() -> None:
    assert report.files(10_000) == ("RESULTS.md", "results.json")
    assert report.files(100_000) == ("RESULTS-100k.md", "results-100k.json")
