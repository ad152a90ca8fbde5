"""The app of the unique-keys trial (ops/chaos/unique_trial.py): `stream-jobs worker
ops.chaos.unique_app:app`.

`chaos.unique`: each job carries its unique key, and the producer and call that enqueued
it. Its effect is a row of `unique_effects` through `ctx.once()`, with the time its
attempt started (epoch seconds, the worker's clock) beside the row's insert time; the
handler holds the transaction `UNIQUE_HOLD_MS`, so a key stays held a while and kills
and the Postgres restart land inside runs. No unique constraint: a job that ran twice
shows twice.
"""

from __future__ import annotations

import asyncio
import os
import time

from stream_jobs.app import App
from stream_jobs.context import JobContext

UNIQUE_TYPE = "chaos.unique"
HOLD_MS_ENV = "UNIQUE_HOLD_MS"
TABLES = (
    "CREATE TABLE unique_effects (job_id text NOT NULL, key text NOT NULL, "
    "producer int NOT NULL, call int NOT NULL, started float8 NOT NULL, "
    "at float8 NOT NULL DEFAULT extract(epoch FROM clock_timestamp()))",
)

app = App()

_HOLD_S = int(os.environ.get(HOLD_MS_ENV, "20")) / 1000


@app.job(UNIQUE_TYPE, timeout=30, concurrency=32, ordering="unordered")
async def unique(job: dict[str, object], ctx: JobContext) -> None:
    started = time.time()
    async with ctx.once() as tx:
        if _HOLD_S:
            await asyncio.sleep(_HOLD_S)  # the key stays held; kills land inside the run
        await tx.execute("INSERT INTO unique_effects (job_id, key, producer, call, started) "
                         "VALUES ($1, $2, $3, $4, $5)", ctx.job_id, job["key"],
                         job["producer"], job["call"], started)
