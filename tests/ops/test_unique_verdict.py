"""The unique-keys trial's verdict (ops/chaos/unique_verdict.py): two jobs of a key
pending at once, lost, doubled or leaked jobs and wrong answers are named; a clean run,
and a key given back late, are not."""

from __future__ import annotations

from dataclasses import replace

from ops.chaos.unique_verdict import Call, EffectRow, UniqueEvidence, held_spans, judge


def _clean() -> UniqueEvidence:
    # k: a sent (call returns at 1.0, runs 1.5-2.0), then b refused in its favour, then c
    # sent once a finished (c's call returns at 2.5). A failed call (f) whose job ran
    # anyway holds key m; g failed and never ran.
    calls = (Call(0, 0, "k", "a", 0.9, 1.0, "a", True),
             Call(1, 0, "k", "b", 1.2, 1.3, "a", False),
             Call(1, 1, "k", "c", 2.4, 2.5, "c", True),
             Call(2, 0, "m", "f", 1.0, 3.0, error="DatabaseUnavailable: restarting"),
             Call(2, 1, "m", "g", 3.1, 3.2, error="DatabaseUnavailable: restarting"))
    effects = (EffectRow("a", "k", 1.5, 2.0), EffectRow("c", "k", 2.6, 2.7),
               EffectRow("f", "m", 1.1, 1.4))
    return UniqueEvidence(calls, effects)


def test_a_clean_run_breaks_no_promise() -> None:
    verdict = judge(_clean())
    assert verdict.ok, verdict.problems
    assert (verdict.calls, verdict.sent, verdict.refused, verdict.failed) == (5, 2, 1, 2)
    assert (verdict.sent_unanswered, verdict.lost, verdict.overlaps) == (1, 0, 0)


def test_a_job_holds_its_key_from_its_call_or_its_run_until_its_effect() -> None:
    spans = held_spans(_clean())
    assert spans["k"] == [(1.0, 2.0, "a"), (2.5, 2.7, "c")]
    assert spans["m"] == [(1.1, 1.4, "f")]  # no answer: from its run's start


def test_a_second_job_let_through_while_one_was_pending_is_named() -> None:
    evidence = _clean()
    # c's call returned at 2.5, while a (effect at 3.0 now) was still pending.
    effects = (EffectRow("a", "k", 1.5, 3.0), *evidence.effects[1:])
    verdict = judge(replace(evidence, effects=effects))
    assert verdict.overlaps == 1
    assert ("1 times a unique key let a second job through while one was pending (e.g. key "
            "k: a and c)") in verdict.problems


def test_lost_doubled_leaked_and_unknown_jobs_are_named() -> None:
    effects = (EffectRow("a", "k", 1.5, 1.6), EffectRow("a", "k", 1.7, 1.8),
               EffectRow("b", "k", 5.0, 5.1), EffectRow("z", "q", 1.0, 1.1))
    verdict = judge(replace(_clean(), effects=effects))
    assert (verdict.lost, verdict.duplicate_effects) == (1, 1)
    assert "1 jobs told sent never ran (e.g. c)" in verdict.problems
    assert "1 effects happened twice" in verdict.problems
    assert '1 enqueues told "not sent" ran all the same (e.g. b)' in verdict.problems
    assert "1 jobs ran that no call enqueued (e.g. z)" in verdict.problems


def test_a_refusal_naming_no_holder_of_its_key_is_named() -> None:
    evidence = _clean()
    wrong = (*evidence.calls, Call(3, 0, "m", "h", 1.0, 1.05, "c", False))
    verdict = judge(replace(evidence, calls=wrong))
    assert any(p.startswith("1 enqueue answers name the wrong job (e.g. call 3.0 (key m) "
                            "was refused in favour of c") for p in verdict.problems)


def test_a_key_given_back_late_is_not_judged() -> None:
    # b refused at 2.2-2.3, after a's effect (2.0): the key was not given back yet. Allowed.
    evidence = _clean()
    late = (*evidence.calls, Call(3, 0, "k", "d", 2.2, 2.3, "a", False))
    assert judge(replace(evidence, calls=late)).ok
