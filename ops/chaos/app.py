"""The app the chaos workers run: `stream-jobs worker ops.chaos.app:app --type chaos.work`,
and the schedulers of the failover scenario: `stream-jobs scheduler ops.chaos.app:app
--type chaos.tick` (see `ops/chaos/failover.py`).

Each delivery is appended to a per-process log (`CHAOS_DELIVERIES_DIR/<pid>.log`, one
line per handler call, written before anything else and outside any transaction), so
redeliveries are countable even across kill -9 and while Postgres is down. The job's
effect is a row in `chaos_effects`, written through `ctx.once_deferred()` (odd jobs) or
`ctx.once()` (even ones): that table has no unique constraint, so a duplicate effect
would show as a second row.

A payload with `"fail_first": true` fails its first attempt (after logging the delivery),
so the worker must write it to a delay tier before its offset may be committed.
"""

from __future__ import annotations

import asyncio
import os
import time

from pydantic import BaseModel

from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.job_ids import job_id_time_ms

JOB_TYPE = "chaos.work"
EFFECTS_TABLE = "chaos_effects"
# The failover scenario's type: a 1 s schedule whose firings each write one row.
TICK_TYPE = "chaos.tick"
TICK_EFFECTS_TABLE = "chaos_tick_effects"
DELIVERIES_DIR_ENV = "CHAOS_DELIVERIES_DIR"
HOLD_MS_ENV = "CHAOS_HOLD_MS"
TIMEOUT_S_ENV = "CHAOS_HANDLER_TIMEOUT_S"

app = App()

_HOLD_S = int(os.environ.get(HOLD_MS_ENV, "1")) / 1000


class Work(BaseModel):
    n: int
    fail_first: bool = False


class InjectedFailure(Exception):
    """The first attempt of a `fail_first` job fails on purpose."""


class DeliveryLog:
    """One append-only file per worker process; a line is in the kernel once written, so
    it survives kill -9 of the process."""

    def __init__(self, folder: str | None) -> None:
        self._fd: int | None = None
        if folder:
            path = os.path.join(folder, f"{os.getpid()}.log")
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, ctx: JobContext) -> None:
        if self._fd is None:
            return
        line = (f"{ctx.job_id} {ctx.attempt} {ctx.partition} {ctx.offset} "
                f"{time.time():.6f}\n")
        os.write(self._fd, line.encode())


_log = DeliveryLog(os.environ.get(DELIVERIES_DIR_ENV))


@app.job(JOB_TYPE, timeout=float(os.environ.get(TIMEOUT_S_ENV, "30")), concurrency=32,
         ordering="unordered")
async def work(job: Work, ctx: JobContext) -> None:
    _log.write(ctx)
    if job.fail_first and ctx.attempt == 1:
        raise InjectedFailure(f"job {job.n}: first attempt fails on purpose")
    # Odd jobs record their effect (ctx.once_deferred), even ones write it on a live
    # connection (ctx.once): the faults meet both forms of the guarantee.
    once = ctx.once_deferred() if job.n % 2 else ctx.once()
    async with once as tx:
        await tx.execute(
            f"INSERT INTO {EFFECTS_TABLE} (job_id, pid, part, pos, attempt) "
            "VALUES ($1, $2, $3, $4, $5)",
            ctx.job_id, os.getpid(), ctx.partition, ctx.offset, ctx.attempt)
        if _HOLD_S:
            # Keep the transaction open a moment, so kills land while effects are uncommitted.
            await asyncio.sleep(_HOLD_S)


@app.job(TICK_TYPE, concurrency=8, ordering="unordered")
async def tick(job: dict[str, object], ctx: JobContext) -> None:
    # No unique constraint: a firing whose effect happened twice shows as a second row.
    async with ctx.once() as tx:
        await tx.execute(f"INSERT INTO {TICK_EFFECTS_TABLE} (job_id, fire_ms) VALUES ($1, $2)",
                         ctx.job_id, job_id_time_ms(ctx.job_id))
