"""The fault-injection suite's verdict logic (ops/chaos/checks.py): pure, no services."""

from __future__ import annotations

from ops.chaos.checks import judge, recovery_times
from ops.chaos.evidence import (
    CommitSample,
    Delivery,
    Effect,
    Evidence,
    Fault,
    Forwarded,
    LaneRecord,
)


def evidence(**changes: object) -> Evidence:
    """Two jobs on partition 0, each delivered and done once, committed to the end."""
    base = Evidence(
        enqueued=["a", "b"],
        lane=[LaneRecord(0, 0, "a", 1), LaneRecord(0, 1, "b", 1)],
        effects=[Effect("a", 10, 0, 0, 1, 1.0), Effect("b", 10, 0, 1, 1, 2.0)],
        deliveries=[Delivery("a", 1, 0, 0, 10, 0.5), Delivery("b", 1, 0, 1, 10, 1.5)],
        forwarded=[],
        commit_samples=[CommitSample(3.0, {0: 2})],
        final_committed={0: 2}, lane_ends={0: 2}, relay_committed={}, tier_ends={},
        throughput=[], faults=[])
    for name, value in changes.items():
        setattr(base, name, value)
    return base


def test_a_clean_run_passes() -> None:
    verdict = judge(evidence())
    assert verdict.ok, verdict.problems
    assert (verdict.lost, verdict.duplicate_effects, verdict.duplicate_deliveries) == (0, 0, 0)


def test_a_job_without_effect_or_dead_letter_is_lost() -> None:
    verdict = judge(evidence(effects=[Effect("a", 10, 0, 0, 1, 1.0)],
                             commit_samples=[]))
    assert verdict.lost == 1
    assert not verdict.ok


def test_a_dead_lettered_job_is_not_lost() -> None:
    verdict = judge(evidence(effects=[Effect("a", 10, 0, 0, 1, 1.0)],
                             forwarded=[Forwarded("b", 1, 1.6, dead_letter=True)]))
    assert verdict.lost == 0
    assert verdict.dead_lettered == 1


def test_a_second_effect_row_is_a_duplicate_effect() -> None:
    verdict = judge(evidence(effects=[Effect("a", 10, 0, 0, 1, 1.0),
                                      Effect("b", 10, 0, 1, 1, 2.0),
                                      Effect("b", 11, 0, 1, 1, 2.5)]))
    assert verdict.duplicate_effects == 1
    assert not verdict.ok


def test_redeliveries_count_per_attempt() -> None:
    again = [Delivery("a", 1, 0, 0, 10, 0.5), Delivery("a", 1, 0, 0, 11, 0.7),
             Delivery("a", 2, 0, 5, 11, 3.0), Delivery("b", 1, 0, 1, 10, 1.5)]
    assert judge(evidence(deliveries=again)).duplicate_deliveries == 1


def test_a_commit_before_the_effect_is_past_unfinished_work() -> None:
    # Offset 1 ("b") was committed at t=1.8, its effect inserted only at t=2.0.
    verdict = judge(evidence(commit_samples=[CommitSample(1.8, {0: 2})]))
    assert verdict.commits_past_unfinished == 1
    assert not verdict.ok


def test_a_commit_after_the_retry_write_is_fine() -> None:
    # "b" failed its first attempt; its retry record (attempt 2) was written at t=1.7.
    verdict = judge(evidence(
        lane=[LaneRecord(0, 0, "a", 1), LaneRecord(0, 1, "b", 1), LaneRecord(0, 2, "b", 2)],
        forwarded=[Forwarded("b", 2, 1.7, dead_letter=False)],
        effects=[Effect("a", 10, 0, 0, 1, 1.0), Effect("b", 10, 0, 2, 2, 5.0)],
        commit_samples=[CommitSample(1.8, {0: 2})], final_committed={0: 3},
        lane_ends={0: 3}))
    assert verdict.commits_past_unfinished == 0, verdict.problems


def test_committed_short_of_the_end_is_unfinished() -> None:
    assert judge(evidence(final_committed={0: 1})).unfinished_at_end == 1


def test_a_job_in_flight_on_a_killed_worker_must_run_again() -> None:
    killed = Fault("kill -9", 1.0, 1.0, pids=(10,))
    # Worker 10 started "b" and died before its effect; nobody ran "b" again.
    verdict = judge(evidence(
        faults=[killed], effects=[Effect("a", 10, 0, 0, 1, 0.8)], commit_samples=[],
        forwarded=[Forwarded("b", 1, 2.0, dead_letter=True)]))
    assert verdict.in_flight_at_faults == 1
    assert verdict.not_redelivered == 1
    # Worker 11 ran it again afterwards: fine.
    verdict = judge(evidence(
        faults=[killed], effects=[Effect("a", 10, 0, 0, 1, 0.8), Effect("b", 11, 0, 1, 1, 3.0)],
        deliveries=[Delivery("a", 1, 0, 0, 10, 0.5), Delivery("b", 1, 0, 1, 10, 0.9),
                    Delivery("b", 1, 0, 1, 11, 2.5)], commit_samples=[]))
    assert (verdict.in_flight_at_faults, verdict.not_redelivered) == (1, 0)


def test_recovery_is_measured_from_the_healing_to_half_the_rate_before() -> None:
    # 100 jobs/s, a fault from t=10 to t=12 with nothing done, then 100/s again.
    series = [(t / 4, int(t / 4 * 100)) for t in range(0, 41)]
    series += [(10 + t / 4, 1000) for t in range(1, 9)]
    series += [(12 + t / 4, 1000 + int(t / 4 * 100)) for t in range(1, 41)]
    [recovery] = recovery_times(series, [Fault("x", 10.0, 12.0)], total=10_000)
    assert 1.0 <= recovery <= 1.5
