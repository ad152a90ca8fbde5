"""The LISTEN trial's checker (ops/chaos/listen_verdict.py) finds each failure it guards."""

from __future__ import annotations

from ops.chaos.listen_verdict import INTERRUPT_BOUND_S, ListenEvidence, judge

HEALED = 1_000.0


def evidence(**change: object) -> ListenEvidence:
    base: dict[str, object] = {
        "healed_at": HEALED, "cancelled": {"h1": 990.0, "h2": 991.0},
        "interrupts": {"h1": HEALED + 0.4, "h2": HEALED + 2.0},
        "work": {"w1": 1, "w2": 2}, "effects": ["w1", "w2"], "waited": {"w1": 2}}
    base.update(change)
    return ListenEvidence(**base)  # type: ignore[arg-type]


def test_a_clean_run_passes_with_its_worst_interrupt() -> None:
    v = judge(evidence())
    assert v.problems == []
    assert v.worst_interrupt_s == 2.0


def test_a_cancel_never_heard_or_heard_late_fails() -> None:
    assert judge(evidence(interrupts={"h1": HEALED})).not_interrupted == 1
    late = judge(evidence(interrupts={"h1": HEALED, "h2": HEALED + INTERRUPT_BOUND_S + 1}))
    assert late.interrupted_late == 1
    assert late.problems


def test_a_lost_or_doubled_effect_and_a_wrong_result_fail() -> None:
    assert judge(evidence(effects=["w1"])).lost == 1
    assert judge(evidence(effects=["w1", "w2", "w2"])).duplicate_effects == 1
    assert judge(evidence(waited={"w1": 3})).wrong_results == 1


def test_a_run_that_sent_no_cancel_into_the_silence_proved_nothing() -> None:
    assert judge(evidence(cancelled={}, interrupts={})).problems
