"""`ctx.once()` in a worker: a failing body rolls its optimistic batch back, and the jobs
that shared it run again at once, in savepoints of their own, not as new attempts."""

from __future__ import annotations

import asyncio
from collections import Counter

from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.context import JobContext
from stream_jobs.settings import Settings
from tests.integration.conftest import Declare
from tests.integration.database import connect


async def test_a_failing_body_costs_the_others_a_rerun_not_an_attempt(
        app: App, declare: Declare, settings: Settings) -> None:
    # One open batch at a time (16 jobs at once, a second batch opens only past 48),
    # held open for 300 ms, so a failing job meets others in its batch. (`app` made the
    # schema and the dedup table.)
    app = App(settings.model_copy(update={"dedup_linger_ms": 300.0}))
    await declare("ledger.live", partitions=2, retry_tiers=["1s"], max_attempts=2)
    conn = await connect(settings)
    await conn.execute("CREATE TABLE live_effects (job_id text NOT NULL, attempt int)")
    runs: Counter[str] = Counter()
    careful_runs: list[str] = []
    wrote = asyncio.Event()  # some job's body has run

    @app.job("ledger.live", ordering="unordered", concurrency=16)
    async def post(job: dict[str, int], ctx: JobContext) -> None:
        runs[ctx.job_id] += 1
        if ctx._careful:
            careful_runs.append(ctx.job_id)
        failing = job["n"] % 50 == 7 and ctx.attempt == 1
        if failing:
            await wrote.wait()  # behind another body in the open batch
        async with ctx.once() as db:
            # Reads inside the block see its own writes.
            await db.execute("INSERT INTO live_effects VALUES ($1, $2)", ctx.job_id,
                             ctx.attempt)
            mine = await db.fetchval("SELECT count(*) FROM live_effects WHERE job_id = $1",
                                     ctx.job_id)
            assert mine == 1
            if failing:
                raise RuntimeError("this job's body fails on its first attempt")
            wrote.set()

    n = 400
    async with app.client() as client:
        await client.enqueue_many([Job("ledger.live", {"n": i}, job_id=f"live-{i}")
                                   for i in range(n)])
    worker = app.worker("ledger.live")
    await worker.run(until_idle=True)
    try:
        rows = await conn.fetch("SELECT job_id, attempt FROM live_effects")
    finally:
        await conn.close()
    failing = {f"live-{i}" for i in range(n) if i % 50 == 7}
    # Every job's effect once; the failing ones from their second attempt, every other
    # job from its first (a rerun after a rollback is not an attempt).
    assert Counter(r["job_id"] for r in rows) == Counter({f"live-{i}": 1 for i in range(n)})
    assert {r["job_id"] for r in rows if r["attempt"] == 2} == failing
    assert worker.outcomes["succeeded"] == n
    assert worker.outcomes["retried"] == len(failing)
    # The failures took others down with them, and those ran again, carefully.
    assert careful_runs, "no job shared a batch with a failing one: the test shows nothing"
    assert set(careful_runs).isdisjoint(failing)
    assert all(runs[job_id] == 2 for job_id in careful_runs)
