"""The ledger app: `stream-jobs worker tests.apps.ledger:app --type ledger.post`.

Used by tests/integration/test_worker_processes.py, which creates the tables in the test's
schema (`STREAM_JOBS_DATABASE_SCHEMA`):

- `deliveries(job_id, pid, part, pos, at)`: one row per delivery, written outside the dedup
  transaction, so redeliveries show up here (duplicates allowed);
- `effects(id bigserial, job_id, account, seq)`: the job's effect, written through
  `ctx.once()`; no unique constraint, so a duplicate effect would be countable.

Inside the dedup transaction the handler sleeps `LEDGER_SLEEP_MS` (default 2) after writing
its effect, so a kill tends to land while transactions are open. `LEDGER_CONCURRENCY`
(default 32) is the handler's concurrency.
"""

from __future__ import annotations

import asyncio
import os

from pydantic import BaseModel

from stream_jobs.app import App
from stream_jobs.context import JobContext
from tests.apps.bookkeeping import BookkeepingPool

app = App()

SLEEP_S = int(os.environ.get("LEDGER_SLEEP_MS", "2")) / 1000
CONCURRENCY = int(os.environ.get("LEDGER_CONCURRENCY", "32"))


class Posting(BaseModel):
    account: str
    amount: int
    seq: int


_deliveries = BookkeepingPool(app)  # rows written outside the dedup transaction


@app.job("ledger.post", timeout=30, concurrency=CONCURRENCY)
async def post(job: Posting, ctx: JobContext) -> None:
    pool = await _deliveries.get()
    await pool.execute("INSERT INTO deliveries (job_id, pid, part, pos) VALUES ($1, $2, $3, $4)",
                       ctx.job_id, os.getpid(), ctx.partition, ctx.offset)
    async with ctx.once() as conn:
        await conn.execute("INSERT INTO effects (job_id, account, seq) VALUES ($1, $2, $3)",
                           ctx.job_id, job.account, job.seq)
        await asyncio.sleep(SLEEP_S)
