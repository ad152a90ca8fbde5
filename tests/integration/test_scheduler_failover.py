"""The scheduler failover fault test at CI size (the 60 s run is `make chaos`, trial
failover): two `stream-jobs scheduler` processes on a 1 s schedule, the
leader SIGKILLed twice (a replacement starting each time) and then SIGSTOPped past its
lease. Every firing of the window runs exactly once, and each fault is followed by
another scheduler taking the lock."""

from __future__ import annotations

from pathlib import Path

from ops.chaos.failover import run_failover
from ops.chaos.failover_verdict import summary
from stream_jobs.settings import Settings

from ..conftest import Stack

LEASE_S = 3.0


async def test_killing_and_freezing_the_leader_runs_every_firing_once(
        stack: Stack, tmp_path: Path) -> None:
    base = Settings(kafka_bootstrap=stack.kafka_bootstrap, database_url=stack.database_url)
    result = await run_failover(base, tmp_path, window_s=20.0, kills=2, pause=True,
                                lease_s=LEASE_S)
    v = result.verdict
    print(f"\n[scheduler-failover] {summary(v)} seconds={result.seconds:.1f}")
    assert [f.kind for f in result.faults] == ["kill -9", "kill -9", "SIGSTOP"]
    assert v.firings >= 15, "too short a window to judge"
    assert v.missed == [], v.problems
    assert v.duplicate_effects == 0, v.problems
    assert v.strangers == 0, v.problems
    assert v.ok, v.problems + result.notes
    # Each copy of a firing enqueued twice was counted a duplicate, not run again.
    assert v.duplicate_outcomes == v.enqueued_twice
    kill_takeovers = [f.takeover_s for f in result.faults if f.kind == "kill -9"]
    assert all(t is not None and t < 5.0 for t in kill_takeovers), kill_takeovers
    # A frozen leader keeps its socket open: only the lease (idle_session_timeout) ends its
    # session and hands the lock on, after about LEASE_S.
    frozen = result.faults[-1].takeover_s
    assert frozen is not None, "nobody took over from the frozen leader"
    assert LEASE_S * 0.8 <= frozen <= LEASE_S + 4.0, frozen
