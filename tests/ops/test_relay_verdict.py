"""The outbox-relay trial's verdict (ops/chaos/relay_verdict.py): each broken promise is
named, copies in Kafka are counted and allowed, and a clean run has none."""

from __future__ import annotations

from dataclasses import replace

from ops.chaos.relay_verdict import RelayEvidence, judge

COMMITTED = frozenset({"a", "b", "c"})


def _clean() -> RelayEvidence:
    # "b" went twice: a relay killed between the broker's ack and its commit.
    return RelayEvidence(COMMITTED, frozenset({"r"}), ("a", "b", "c", "b"),
                         dict.fromkeys(COMMITTED, 1), 0)


def test_a_clean_run_breaks_no_promise_and_copies_are_allowed() -> None:
    verdict = judge(_clean())
    assert verdict.ok, verdict.problems
    assert (verdict.committed, verdict.lost, verdict.copies_in_kafka) == (3, 0, 1)
    assert (verdict.missing_effects, verdict.duplicate_effects) == (0, 0)


def test_lost_rolled_back_and_unknown_records_are_named() -> None:
    verdict = judge(replace(_clean(), in_kafka=("a", "b", "r", "z")))
    assert verdict.lost == 1
    assert "1 committed jobs never reached Kafka (e.g. c)" in verdict.problems
    assert "1 jobs of rolled-back transactions reached Kafka (e.g. r)" in verdict.problems
    assert "1 job IDs in Kafka were never written (e.g. z)" in verdict.problems


def test_missing_doubled_and_unwanted_effects_and_rows_left_are_named() -> None:
    verdict = judge(replace(_clean(), effects={"a": 2, "b": 1, "r": 1}, left_in_outbox=4))
    assert (verdict.missing_effects, verdict.duplicate_effects) == (1, 1)
    assert "1 committed jobs have no effect (e.g. c)" in verdict.problems
    assert "1 effects happened twice" in verdict.problems
    assert "1 effect rows belong to no committed job" in verdict.problems
    assert "4 rows still wait in the outbox" in verdict.problems
