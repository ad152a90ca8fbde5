"""A rate-limited type whose handler notes when each job started, run as two worker
processes by tests/integration/test_flow_control.py:
`stream-jobs worker tests.apps.paced:app --type rate.capped`.

The test creates `starts(job_id text, pid int, part int, at double precision)` in its schema
(`STREAM_JOBS_DATABASE_SCHEMA`). Each job inserts one row: the wall-clock second its
handler started, the worker process it ran in and its partition, so the test counts
starts across both processes on one clock. The handler does nothing else.
"""

from __future__ import annotations

import os
import time
from typing import Any

from stream_jobs.app import App
from stream_jobs.context import JobContext
from tests.apps.bookkeeping import BookkeepingPool

app = App()

_starts = BookkeepingPool(app)  # rows written outside the dedup transaction


@app.job("rate.capped", concurrency=8, ordering="unordered")
async def capped(job: dict[str, Any], ctx: JobContext) -> None:
    at = time.time()  # taken first: the row's insert time is not the start
    pool = await _starts.get()
    await pool.execute("INSERT INTO starts (job_id, pid, part, at) VALUES ($1, $2, $3, $4)",
                       ctx.job_id, os.getpid(), ctx.partition, at)
