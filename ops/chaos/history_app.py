"""The app of the history trial (ops/chaos/history_trial.py): `stream-jobs worker
ops.chaos.history_app:app`.

`chaos.counted`: a fifth of the jobs fail for good (`PermanentError`: dead-lettered at
once; the type's other failures, while Postgres restarts, retry), each such run first
writing a row of
`history_failures` outside any transaction; the others write their effect, a row of
`history_effects`, through `ctx.once()`. Both rows carry the worker's pid and their
insert time, so the runner can tell which outcomes a killed worker had not reported yet.
No unique constraints: an effect that happened twice shows twice.
"""

from __future__ import annotations

import os

from ops.chaos.side_rows import SideRows
from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.errors import PermanentError

COUNTED_TYPE = "chaos.counted"
FAIL_EVERY = 5
TABLES = (
    "CREATE TABLE history_effects (job_id text NOT NULL, pid int NOT NULL, "
    "at float8 NOT NULL DEFAULT extract(epoch FROM clock_timestamp()))",
    "CREATE TABLE history_failures (job_id text NOT NULL, pid int NOT NULL, "
    "at float8 NOT NULL DEFAULT extract(epoch FROM clock_timestamp()))",
)

app = App()


_failures = SideRows(app, "history_failures")


@app.job(COUNTED_TYPE, timeout=30, concurrency=32, ordering="unordered")
async def counted(job: dict[str, int], ctx: JobContext) -> None:
    if job["n"] % FAIL_EVERY == 0:
        await _failures.record(ctx.job_id)
        raise PermanentError(f"job {job['n']} fails for good, on purpose")
    async with ctx.once() as tx:
        await tx.execute("INSERT INTO history_effects (job_id, pid) VALUES ($1, $2)",
                         ctx.job_id, os.getpid())
