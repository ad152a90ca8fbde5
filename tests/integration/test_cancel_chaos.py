"""Cancels racing runs while a worker is killed, at CI size: real `stream-jobs worker`
processes, SIGKILL, and the verdict of `make chaos`'s `cancels` trial (which runs 20,000
jobs and five kills): every job exactly one of done or cancelled, none lost, no effect
twice, every cancel's answer matching the tables.
"""

from __future__ import annotations

from pathlib import Path

from ops.chaos.cancels import cancel_trial
from stream_jobs.settings import Settings

from ..conftest import Stack


async def test_cancels_racing_runs_and_a_kill_leave_each_job_done_or_cancelled(
        stack: Stack, tmp_path: Path) -> None:
    base = Settings(kafka_bootstrap=stack.kafka_bootstrap, database_url=stack.database_url)
    result = await cancel_trial(base, tmp_path, jobs=1_500, kills=1, workers=2)
    print(f"\n[cancel chaos] {result}")
    assert result.ok, result.problems
    assert result.kills == 1
    assert result.lost == 0
    assert result.duplicate_effects == 0
