"""A batch's callbacks under kill -9, at small N (the full run: `make chaos`, whose batch
scenario is ops/chaos/batches.py with 5,000 members).

Members run on real `stream-jobs worker ops.chaos.batch_app:app` processes, 2% failing
their first attempt, while workers are killed with SIGKILL and replaced: the callbacks
must run once each, after the last member, with the batch's counts in their payloads,
and every member's effect must exist exactly once (ops/chaos/batch_verdict.py).
"""

from __future__ import annotations

from pathlib import Path

from ops.chaos.batches import batch_trial
from stream_jobs.settings import Settings

from ..conftest import Stack


async def test_callbacks_run_once_after_the_last_member_through_kill_9(
        stack: Stack, tmp_path: Path) -> None:
    base = Settings(kafka_bootstrap=stack.kafka_bootstrap, database_url=stack.database_url)
    result = await batch_trial(base, tmp_path, members=1_000, workers=3, kills=3,
                               within_s=180)
    v = result.verdict
    print(f"\n[batch] lost={v.lost} dup_effects={v.duplicate_effects} callbacks={v.callbacks} "
          f"callback_runs={v.callback_runs} kills={result.kills} seconds={result.seconds}")
    assert result.kills == 3
    assert v.lost == 0, v.problems + result.notes
    assert v.duplicate_effects == 0, v.problems
    assert v.callbacks == {"success": 1, "complete": 1}, v.problems
    assert result.ok, v.problems + result.notes
