"""Two job types in one app, for tests/integration/test_worker_host.py:
`stream-jobs worker tests.apps.pair:app` runs both in one process (no `--type`).

The test creates `runs(job_type text, job_id text, pid int)` in its schema
(`STREAM_JOBS_DATABASE_SCHEMA`); each job inserts one row saying which type it was and
which process ran it.
"""

from __future__ import annotations

import os
from typing import Any

from stream_jobs.app import App
from stream_jobs.context import JobContext
from tests.apps.bookkeeping import BookkeepingPool

app = App()
TYPES = ("pair.left", "pair.right")

_runs = BookkeepingPool(app)


async def _record(ctx: JobContext) -> None:
    pool = await _runs.get()
    await pool.execute("INSERT INTO runs (job_type, job_id, pid) VALUES ($1, $2, $3)",
                       ctx.job_type, ctx.job_id, os.getpid())


@app.job("pair.left", concurrency=8)
async def left(job: dict[str, Any], ctx: JobContext) -> None:
    await _record(ctx)


@app.job("pair.right", concurrency=4)
async def right(job: dict[str, Any], ctx: JobContext) -> None:
    await _record(ctx)
