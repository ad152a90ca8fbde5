"""`stream-jobs worker --processes 2` on the real stack: a supervisor and its two children.

The ledger app of tests/integration/test_worker_processes.py (a delivery row outside the
dedup transaction, the effect row inside it) shows that a child killed with SIGKILL is
restarted and every job still has its effect exactly once, and that SIGTERM to the
supervisor drains both children: no job started after it beyond the slots, the group
committed exactly what finished, and nothing finished is delivered again.
Nothing waits by sleeping: every wait polls a condition against a deadline.
"""

# ruff: noqa: F811 - `db` and `workers` are test_worker_processes' fixtures, imported here

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from stream_jobs.app import App
from stream_jobs.settings import Settings

from .conftest import Declare
from .test_worker_processes import (  # noqa: F401
    GRACE_S,
    JOBS,
    LEDGER,
    SIGTERM_CONCURRENCY,
    Workers,
    assert_commits_cover_what_finished,
    assert_exactly_once,
    db,
    effects_count,
    effects_reach,
    enqueue_ledger,
    report,
    wait_until,
    workers,
)

TWO = ("--processes", "2")


def children_of(pid: int) -> set[int]:
    """The live child processes of `pid` (zombies, dead but not reaped, left out)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(entry.name))
    return found


def exists(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


async def running_pids(db: Any) -> set[int]:
    return {r["pid"] for r in await db.fetch("SELECT DISTINCT pid FROM deliveries")}


async def test_a_killed_child_is_restarted_and_every_job_finishes_once(
        app: App, declare: Declare, db: Any, workers: Workers) -> None:
    await declare(LEDGER, partitions=4, retry_tiers=["1s"])
    ids = await enqueue_ledger(app)
    began = time.monotonic()
    supervisor = workers.start("supervisor", options=TWO)

    async def both_children_work() -> bool:
        return len(await running_pids(db) & children_of(supervisor.pid)) == 2

    await wait_until(both_children_work, 90, "both children running jobs", workers)
    victim = min(children_of(supervisor.pid))
    os.kill(victim, signal.SIGKILL)
    at_kill = await effects_count(db)
    assert at_kill < JOBS, "the children finished before the kill: slow the handler down"

    async def restarted() -> bool:
        now = children_of(supervisor.pid)
        return len(now) == 2 and victim not in now

    await wait_until(restarted, 30, "a new child in the killed one's place", workers)
    await effects_reach(db, JOBS, 120, workers)
    supervisor.signal(signal.SIGTERM)
    assert await supervisor.exited(GRACE_S + 30) == 0, supervisor.tail()
    figures = await assert_exactly_once(db, ids)
    log = supervisor.log.read_text()
    assert "was killed by SIGKILL after" in log, supervisor.tail()
    assert "run 2)" in log, supervisor.tail()
    # Each child's own lines name it.
    assert "process=worker-1" in log, supervisor.tail()
    assert "process=worker-2" in log, supervisor.tail()
    report("--processes 2, one child SIGKILLed", {
        "effects_at_kill": at_kill, **figures,
        "processes_that_ran_jobs": len(await running_pids(db)),
        "seconds": round(time.monotonic() - began, 1)})


async def test_sigterm_to_the_supervisor_drains_both_children(
        app: App, declare: Declare, db: Any, workers: Workers, settings: Settings) -> None:
    await declare(LEDGER, partitions=4, retry_tiers=["1s"])
    # Unkeyed, so hundreds of jobs per child wait for one of its 16 slots while 16 run
    # (each holding its transaction for 50 ms): a drain must start none of them.
    ids = await enqueue_ledger(app, keyed=False)
    supervisor = workers.start("supervisor", options=TWO, LEDGER_SLEEP_MS="50",
                               LEDGER_CONCURRENCY=str(SIGTERM_CONCURRENCY))

    async def both_children_work() -> bool:
        return len(await running_pids(db) & children_of(supervisor.pid)) == 2

    await wait_until(both_children_work, 90, "both children running jobs", workers)
    await effects_reach(db, 500, 60, workers)
    children = children_of(supervisor.pid)
    sigterm_at = await db.fetchval("SELECT clock_timestamp()")
    supervisor.signal(signal.SIGTERM)
    t0 = time.monotonic()
    assert await supervisor.exited(GRACE_S + 30) == 0, supervisor.tail()
    drain_s = time.monotonic() - t0
    assert not [pid for pid in children if exists(pid)], "a child outlived its supervisor"
    started_after = int(await db.fetchval(
        "SELECT count(*) FROM deliveries WHERE at > $1", sigterm_at))
    assert started_after <= 2 * 2 * SIGTERM_CONCURRENCY, (
        f"{started_after} jobs started after the SIGTERM\n{supervisor.tail()}")
    assert drain_s < GRACE_S, f"the drain took {drain_s:.1f} s\n{supervisor.tail()}"

    finished, committed = await assert_commits_cover_what_finished(db, settings)
    assert "stopped: succeeded" in supervisor.log.read_text(), supervisor.tail()

    second = workers.start("second", until_idle=True)
    assert await second.exited(120) == 0, second.tail()
    figures = await assert_exactly_once(db, ids)
    counts = {r["job_id"]: r["n"] for r in await db.fetch(
        "SELECT job_id, count(*) AS n FROM deliveries GROUP BY job_id")}
    again = [job for job in finished if counts[job] != 1]
    assert not again, (
        f"{len(again)} jobs finished before the SIGTERM were delivered again: {again[:5]}")
    report("--processes 2, SIGTERM to the supervisor", {
        "finished_before_exit": len(finished), "committed_total": sum(committed.values()),
        "jobs_started_after_sigterm": started_after, "drain_seconds": round(drain_s, 2),
        **figures})
