"""The results trial's verdict (ops/chaos/results_verdict.py): each broken promise is
named, and a clean run has none."""

from __future__ import annotations

from dataclasses import replace

from ops.chaos.results_verdict import KeptRow, ResultsEvidence, WaitRow, judge

EXPECTED = {f"j{n}": {"n": n, "square": n * n} for n in range(4)}
WITH_EFFECT = frozenset({"j0", "j1"})


def _clean() -> ResultsEvidence:
    return ResultsEvidence(
        EXPECTED, WITH_EFFECT, {j: KeptRow("succeeded", v) for j, v in EXPECTED.items()},
        dict.fromkeys(WITH_EFFECT, 1),
        (WaitRow("j0", True, EXPECTED["j0"], timeouts=2, unavailable=3),
         WaitRow("j2", True, EXPECTED["j2"])))


def test_a_clean_run_breaks_no_promise() -> None:
    verdict = judge(_clean())
    assert verdict.ok, verdict.problems
    assert (verdict.jobs, verdict.lost, verdict.wrong, verdict.duplicate_effects) == (4, 0, 0, 0)
    assert (verdict.waited, verdict.waits_answered) == (2, 2)
    assert (verdict.timeouts_retried, verdict.unavailable_retried) == (2, 3)


def test_lost_wrong_failed_and_unknown_results_are_named() -> None:
    kept = {"j0": KeptRow("succeeded", {"n": 0, "square": 1}), "j1": KeptRow("failed", None),
            "j2": KeptRow("succeeded", EXPECTED["j2"]), "x": KeptRow("succeeded", 1)}
    verdict = judge(replace(_clean(), kept=kept))
    assert (verdict.lost, verdict.wrong) == (1, 1)
    assert "1 jobs have no kept result (e.g. j3)" in verdict.problems
    assert "1 jobs ended failed instead of succeeding" in verdict.problems
    assert any(p.startswith("1 kept results differ from the handler's return value (e.g. j0")
               for p in verdict.problems)
    assert "1 kept results belong to no enqueued job" in verdict.problems


def test_doubled_stray_and_missing_effects_are_named() -> None:
    verdict = judge(replace(_clean(), effects={"j0": 2, "j2": 1}))
    assert verdict.duplicate_effects == 1
    assert "1 effects happened twice" in verdict.problems
    assert "1 effect rows belong to jobs that write none" in verdict.problems
    assert ("1 jobs have a kept result and no effect: the result committed without its "
            "effects") in verdict.problems


def test_waiters_that_got_nothing_another_value_or_an_unclear_error_are_named() -> None:
    waits = (WaitRow("j0", False, errors=("InternalClientError: cannot switch",)),
             WaitRow("j1", True, {"n": 9}), WaitRow("j2", True, EXPECTED["j2"]))
    verdict = judge(replace(_clean(), waits=waits))
    assert verdict.waits_answered == 2
    assert "1 waiting clients never got their result (e.g. j0)" in verdict.problems
    assert ("1 waiting clients got another value than the handler returned (e.g. j1: "
            "{'n': 9})") in verdict.problems
    assert ("1 waits ended in an error other than ResultTimeout or DatabaseUnavailable "
            "(e.g. j0: InternalClientError: cannot switch)") in verdict.problems
