"""The app of the batch-callback trial (ops/chaos/batches.py): `stream-jobs worker
ops.chaos.batch_app:app` runs both types in each process.

`chaos.member`: one effect row per member in `batch_member_effects`, written through
`ctx.once()` (even members) or `ctx.once_deferred()` (odd ones), so the faults meet both
forms of the finish transaction; `BATCH_FAIL_EVERY` (default 50: 2%) members fail their
first attempt, and the transaction is held `BATCH_HOLD_MS` so kills land inside it.

`chaos.album`: the batch's callbacks. Each delivery is a row of `batch_callback_runs`,
written outside any transaction (so a callback delivered twice shows twice there), and
its effect a row of `batch_callback_effects` through `ctx.once()`, with the payload it
got. No table has a unique constraint: whatever happened twice shows as two rows.
"""

from __future__ import annotations

import asyncio
import os

import orjson

from ops.chaos.side_rows import SideRows
from stream_jobs.app import App
from stream_jobs.context import JobContext

MEMBER = "chaos.member"
ALBUM = "chaos.album"
FAIL_EVERY_ENV = "BATCH_FAIL_EVERY"
HOLD_MS_ENV = "BATCH_HOLD_MS"

TABLES = (
    "CREATE TABLE batch_member_effects (job_id text NOT NULL, n int NOT NULL, "
    "attempt int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())",
    "CREATE TABLE batch_callback_runs (job_id text NOT NULL, pid int NOT NULL, "
    "at timestamptz NOT NULL DEFAULT clock_timestamp())",
    "CREATE TABLE batch_callback_effects (job_id text NOT NULL, kind text NOT NULL, "
    "payload jsonb NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())",
)

app = App()

_FAIL_EVERY = int(os.environ.get(FAIL_EVERY_ENV, "50"))
_HOLD_S = int(os.environ.get(HOLD_MS_ENV, "2")) / 1000


class InjectedFailure(Exception):
    """A member's first attempt fails on purpose."""


@app.job(MEMBER, timeout=30, concurrency=32, ordering="unordered")
async def member(job: dict[str, int], ctx: JobContext) -> None:
    n = job["n"]
    if _FAIL_EVERY and n % _FAIL_EVERY == 0 and ctx.attempt == 1:
        raise InjectedFailure(f"member {n}: first attempt fails on purpose")
    once = ctx.once_deferred() if n % 2 else ctx.once()
    async with once as tx:
        await tx.execute("INSERT INTO batch_member_effects (job_id, n, attempt) "
                         "VALUES ($1, $2, $3)", ctx.job_id, n, ctx.attempt)
        if _HOLD_S and not n % 2:
            await asyncio.sleep(_HOLD_S)  # kills land while the transaction is open


_runs = SideRows(app, "batch_callback_runs")


@app.job(ALBUM, timeout=30, concurrency=4)
async def album(job: dict[str, object], ctx: JobContext) -> None:
    await _runs.record(ctx.job_id)
    async with ctx.once() as conn:
        await conn.execute("INSERT INTO batch_callback_effects (job_id, kind, payload) "
                           "VALUES ($1, $2, $3)", ctx.job_id, str(job["kind"]),
                           orjson.dumps(job).decode())
