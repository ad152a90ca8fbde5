"""The batch-callback trial's verdict (ops/chaos/batch_verdict.py): each broken promise
is named, and a clean run has none."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from ops.chaos.batch_verdict import BatchEvidence, CallbackRow, judge

T0 = datetime(2026, 1, 1, tzinfo=UTC)
MEMBERS = tuple(f"m{i}" for i in range(4))


def _callback(kind: str, at: datetime, **counts: int) -> CallbackRow:
    summary = {"id": "b1", "total": 4, "succeeded": 4, "failed": 0, **counts}
    return CallbackRow(f"cb-{kind}", kind, {"kind": kind, "batch": summary}, at)


def _clean() -> BatchEvidence:
    later = T0 + timedelta(seconds=1)
    return BatchEvidence("b1", MEMBERS, dict.fromkeys(MEMBERS, 1), T0,
                         (_callback("success", later), _callback("complete", later)), 2)


def test_a_clean_run_breaks_no_promise() -> None:
    verdict = judge(_clean())
    assert verdict.ok, verdict.problems
    assert (verdict.lost, verdict.duplicate_effects) == (0, 0)


def test_lost_and_doubled_members_are_named() -> None:
    verdict = judge(replace(_clean(), member_effects={"m0": 1, "m1": 2, "m2": 1, "x": 1}))
    assert verdict.lost == 1
    assert verdict.duplicate_effects == 1
    assert "1 members have no effect" in verdict.problems
    assert "1 effect rows belong to no member of the batch" in verdict.problems


def test_a_callback_early_twice_or_with_wrong_counts_is_named() -> None:
    clean = _clean()
    early = replace(clean, callbacks=(_callback("success", T0 - timedelta(seconds=1)),
                                      clean.callbacks[1], clean.callbacks[1]))
    problems = " | ".join(judge(early).problems)
    assert "on_success callback ran at" in problems
    assert "before the last member's effect" in problems
    assert "the on_complete callback ran 2 times, not 1" in problems
    wrong = replace(clean, callbacks=(clean.callbacks[0],
                                      _callback("complete", T0 + timedelta(1), succeeded=3)))
    assert any("on_complete callback saw" in p for p in judge(wrong).problems)


def test_with_dead_letters_on_success_must_not_run() -> None:
    clean = _clean()
    failing = replace(clean, expected_failed=1, member_effects={m: 1 for m in MEMBERS[:3]},
                      callbacks=(_callback("complete", T0 + timedelta(1), succeeded=3,
                                           failed=1),))
    assert judge(failing).ok, judge(failing).problems
    fired = replace(failing, callbacks=(*failing.callbacks, clean.callbacks[0]))
    assert "the on_success callback ran 1 times, not 0" in judge(fired).problems


def test_the_chaos_report_has_a_line_per_batch_run() -> None:
    from ops.chaos.batches import TRIAL, BatchTrialResult, batch_row
    from ops.chaos.protocol import section

    started = time.time() - 52.0
    result = BatchTrialResult(5_000, 3, 6, 52.0, judge(_clean()))
    lines = section(TRIAL, [batch_row(result, 1, started)])
    assert lines[0] == "## Batch callbacks"
    assert "**Verdict: every run passed its checks (1 of 1).**" in lines
    assert "| 1 | 5,000 | 3 | 6 | 0 | 0 | 0 | 1 | 1 | 2 | 52 | yes |" in lines
    failed = BatchTrialResult(5_000, 3, 6, 52.0, judge(replace(_clean(), callbacks=())),
                              ["FaultError: timed out"])
    text = "\n".join(section(TRIAL, [batch_row(failed, 2, started)]))
    assert "| NO |" in text
    assert "**Verdict: PROBLEMS in run 2 (see below).**" in text
    assert "batches run 2: the on_complete callback ran 0 times, not 1" in text
    assert "batches run 2: FaultError: timed out" in text
