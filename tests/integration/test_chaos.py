"""The fault-injection suite at small N (the full run is `make chaos`, ops/chaos/).

Each test drives jobs through real `stream-jobs worker ops.chaos.app:app` processes while
one kind of fault is injected, then asserts what the suite promises: nothing lost, no
effect twice, no commit past unfinished work (ops/chaos/checks.py says how each is
counted). Small N and few faults keep the file near a minute and a half.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from ops.chaos import scenarios
from ops.chaos.trial import Inject, Stack, TrialResult, run_trial
from stream_jobs.settings import Settings
from stream_jobs.stack import PostgresServer

from ..conftest import Stack as ServiceStack

JOBS = 1_500
WORKERS = 2


@pytest.fixture
def chaos_stack(stack: ServiceStack) -> Stack:
    base = Settings(kafka_bootstrap=stack.kafka_bootstrap, database_url=stack.database_url)
    return Stack(base, PostgresServer(Settings()))


async def trial(chaos_stack: Stack, tmp_path: Path, name: str, inject: Inject,
                jobs: int = JOBS, workers: int = WORKERS,
                handler_timeout_s: float = 30.0,
                enqueue_over_s: float | None = None, hold_ms: int = 1) -> TrialResult:
    result = await run_trial(chaos_stack, scenario=name, run=1, jobs=jobs, inject=inject,
                             out_dir=tmp_path, workers=workers,
                             handler_timeout_s=handler_timeout_s, drain_timeout_s=90,
                             enqueue_over_s=enqueue_over_s, hold_ms=hold_ms)
    v = result.verdict
    print(f"\n[{name}] lost={v.lost} dup_effects={v.duplicate_effects} "
          f"dup_deliveries={v.duplicate_deliveries} in_flight_at_faults="
          f"{v.in_flight_at_faults} recovery_max_s={v.recovery_max_s} "
          f"seconds={result.seconds:.1f}")
    assert v.faults > 0, "no fault was injected"
    assert v.lost == 0, v.problems + result.notes
    assert v.unlogged == 0, v.problems
    assert v.duplicate_effects == 0, v.problems
    assert v.ok, v.problems + result.notes
    return result


async def test_kill_9_and_a_zombie_lose_nothing_and_double_no_effect(
        chaos_stack: Stack, tmp_path: Path) -> None:
    # Side by side (separate topics, groups and schemas) to keep the file short.
    killed, zombie = await asyncio.gather(
        # The jobs arrive over 4 s, so the kills (0.3-0.6 s apart) land while there is
        # work, and each holds its transaction 50 ms (1 ms by default), so a worker has
        # jobs in flight at any moment: fast workers otherwise finished every job
        # between two kills, and a kill met nothing in flight.
        trial(chaos_stack, tmp_path, "kill9",
              scenarios.kill_nine(kills=3, low_s=0.3, high_s=0.6), jobs=2_000,
              enqueue_over_s=4.0, hold_ms=50),
        # Past the 10 s session timeout: the group moves on without it; and past the
        # handler timeout, so its handlers are cancelled mid-transaction when it wakes.
        trial(chaos_stack, tmp_path, "zombie",
              scenarios.zombie(pause_s=scenarios.SESSION_TIMEOUT_S + 2),
              handler_timeout_s=8.0))
    assert killed.verdict.in_flight_at_faults > 0, "no kill landed on a job in flight"
    # The group gave the paused worker's partitions to the other, which ran its jobs again
    # (their dedup rows, committed by the zombie once resumed, kept the effects single).
    assert zombie.verdict.duplicate_deliveries > 0, "the pause made no job run twice"


async def test_a_rolling_clean_restart_delivers_nothing_twice(
        chaos_stack: Stack, tmp_path: Path) -> None:
    result = await trial(chaos_stack, tmp_path, "rolling", scenarios.rolling_restart())
    # A clean stop commits what it finished before it leaves: nothing runs twice.
    assert result.verdict.duplicate_deliveries == 0


@pytest.mark.exclusive  # the Postgres it restarts is every other test's too
async def test_a_postgres_restart_loses_nothing(chaos_stack: Stack, tmp_path: Path) -> None:
    server = chaos_stack.postgres
    if server.running_pid() is None or urlsplit(server.dsn).port != urlsplit(
            chaos_stack.settings.database_url).port:
        pytest.skip("Postgres is not the local stack's, so this test cannot restart it")
    # One worker is enough: every job in flight fails at once and must come back.
    await trial(chaos_stack, tmp_path, "pg-restart", scenarios.postgres_restart(), workers=1)
