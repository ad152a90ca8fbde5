"""The scheduler failover verdict (ops/chaos/failover_verdict.py), from hand-made evidence."""

from __future__ import annotations

from ops.chaos.failover_verdict import FailoverEvidence, LeaderFault, judge
from stream_jobs.schedules import firing_job_id

START_MS = 1_780_000_000_000


def fid(i: int) -> str:
    return firing_job_id("p", "chaos.tick", "tick", START_MS + i * 1000)


def evidence(enqueued: list[int], effects: list[int], faults: list[LeaderFault] | None = None,
             extra: list[tuple[str, float]] | None = None) -> FailoverEvidence:
    # Each firing enqueued 20 ms after its fire time.
    return FailoverEvidence("p", "chaos.tick", "tick",
                            [(fid(i), (START_MS + i * 1000 + 20) / 1000) for i in enqueued]
                            + (extra or []), [fid(i) for i in effects], faults or [], 0)


def test_every_firing_once_is_ok_with_its_lateness() -> None:
    v = judge(evidence(list(range(10)), list(range(10))))
    assert v.ok
    assert (v.firings, v.missed, v.duplicate_effects, v.enqueued_twice) == (10, [], 0, 0)
    assert v.late(50) == v.late(99) == 20


def test_a_firing_never_run_is_missed() -> None:
    v = judge(evidence([0, 1, 3, 4], [0, 1, 3, 4]))
    assert not v.ok
    assert v.missed == [START_MS + 2000]


def test_an_effect_twice_is_a_failure_but_an_enqueue_twice_is_not() -> None:
    twice = judge(evidence([0, 1, 1, 2], [0, 1, 2]))
    assert twice.ok
    assert twice.enqueued_twice == 1
    doubled = judge(evidence([0, 1, 2], [0, 1, 1, 2]))
    assert not doubled.ok
    assert doubled.duplicate_effects == 1


def test_records_that_are_not_the_schedules_firings_are_strangers() -> None:
    v = judge(evidence([0, 1], [0, 1], extra=[("01a23395-bd08-7000-8000-000000000000",
                                                START_MS / 1000)]))
    assert not v.ok
    assert v.strangers == 1


def test_the_gap_runs_from_the_fault_to_the_next_firing() -> None:
    death = (START_MS + 3500) / 1000
    fault = LeaderFault("kill -9", death, death + 0.1, 0.05)
    v = judge(evidence([0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5], [fault]))
    assert [round(g, 3) for g in v.gaps_s] == [0.52]  # the 4 s firing, enqueued at 4.02 s
    assert v.takeovers_s == [0.05]


def test_no_firing_at_all_is_not_a_pass() -> None:
    assert not judge(evidence([], [])).ok
