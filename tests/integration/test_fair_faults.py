"""Tenants to and from the overflow lane through kill -9, at CI size (the full run:
`CHAOS_ONLY=fairness make chaos`, ops/chaos/fairness.py, 6,000 jobs and eight kills).

Real `stream-jobs worker ops.chaos.fair_app:app` processes run a type with `[fairness]`
and `ordering = "key"` while noisy tenants flood in turn over keys shared with quiet
tenants, and workers are killed with SIGKILL and replaced: no job lost, no effect twice,
each key's effects in its sequence order, and some jobs through the overflow lane
(ops/chaos/fair_verdict.py).
"""

from __future__ import annotations

from pathlib import Path

from ops.chaos.fairness import fair_trial
from stream_jobs.settings import Settings

from ..conftest import Stack


async def test_tenants_through_the_overflow_lane_and_kill_9_lose_nothing_and_keep_key_order(
        stack: Stack, tmp_path: Path) -> None:
    base = Settings(kafka_bootstrap=stack.kafka_bootstrap, database_url=stack.database_url)
    result = await fair_trial(base, tmp_path, jobs=1_500, workers=3, kills=3, waves=4,
                              pause_s=1.0, within_s=120, seed=27)
    v = result.verdict
    print(f"\n[fairness chaos] lost={v.lost} dup_effects={v.duplicate_effects} "
          f"keys_out_of_order={v.keys_out_of_order} overflowed={v.overflowed} "
          f"kills={result.kills} seconds={result.seconds}")
    assert result.kills == 3
    assert v.lost == 0, v.problems + result.notes
    assert v.duplicate_effects == 0, v.problems
    assert v.keys_out_of_order == 0, v.problems
    assert v.overflowed > 0, v.problems
    assert result.ok, v.problems + result.notes
