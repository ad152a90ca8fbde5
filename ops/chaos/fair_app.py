"""The app of the fairness trial (ops/chaos/fairness.py): `stream-jobs worker
ops.chaos.fair_app:app --type chaos.fair`.

`chaos.fair` is declared with a `[fairness]` table and runs with `ordering = "key"`. Each
job carries its tenant, its key and the key's sequence number in its payload; its effect
is a row of `fair_effects` written through `ctx.once()`, the transaction held open
`FAIR_HOLD_MS` so kills land inside it. The table has no unique constraint: an effect
that happened twice shows as a second row, and the rows' insert times give each key's
order of effects (under `ordering = "key"` a key's next job starts only once the previous
one committed).
"""

from __future__ import annotations

import asyncio
import os

from stream_jobs.app import App
from stream_jobs.context import JobContext

FAIR_TYPE = "chaos.fair"
HOLD_MS_ENV = "FAIR_HOLD_MS"
TABLES = (
    "CREATE TABLE fair_effects (job_id text NOT NULL, tenant text NOT NULL, "
    "key text NOT NULL, seq int NOT NULL, pid int NOT NULL, attempt int NOT NULL, "
    "at timestamptz NOT NULL DEFAULT clock_timestamp())",
)

app = App()

_HOLD_S = int(os.environ.get(HOLD_MS_ENV, "2")) / 1000


@app.job(FAIR_TYPE, timeout=30, concurrency=32, ordering="key")
async def fair(job: dict[str, object], ctx: JobContext) -> None:
    async with ctx.once() as tx:
        await tx.execute("INSERT INTO fair_effects (job_id, tenant, key, seq, pid, attempt) "
                         "VALUES ($1, $2, $3, $4, $5, $6)", ctx.job_id, job["tenant"],
                         job["key"], job["seq"], os.getpid(), ctx.attempt)
        if _HOLD_S:
            await asyncio.sleep(_HOLD_S)
