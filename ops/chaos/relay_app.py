"""The app of the outbox-relay trial (ops/chaos/relay_trial.py): `stream-jobs worker
ops.chaos.relay_app:app`, run with `STREAM_JOBS_OUTBOX_RELAY=false` so that only the
trial's `stream-jobs outbox relay` processes move the outbox's rows.

`chaos.relayed`: one effect row per job in `relay_effects`, through `ctx.once()` (the
transaction held open `RELAY_HOLD_MS`). The table has no unique constraint: a job sent
twice by a killed relay and run twice would show as a second row.
"""

from __future__ import annotations

import asyncio
import os

from stream_jobs.app import App
from stream_jobs.context import JobContext

RELAYED_TYPE = "chaos.relayed"
HOLD_MS_ENV = "RELAY_HOLD_MS"
TABLES = (
    "CREATE TABLE relay_effects (job_id text NOT NULL, n int NOT NULL, pid int NOT NULL, "
    "at timestamptz NOT NULL DEFAULT clock_timestamp())",
)

app = App()

_HOLD_S = int(os.environ.get(HOLD_MS_ENV, "2")) / 1000


@app.job(RELAYED_TYPE, timeout=30, concurrency=32, ordering="unordered")
async def relayed(job: dict[str, int], ctx: JobContext) -> None:
    async with ctx.once() as tx:
        await tx.execute("INSERT INTO relay_effects (job_id, n, pid) VALUES ($1, $2, $3)",
                         ctx.job_id, job["n"], os.getpid())
        if _HOLD_S:
            await asyncio.sleep(_HOLD_S)
