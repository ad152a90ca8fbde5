"""What `ctx.fencing_token` costs: side by side on one backlog, a no-op handler (the token
never read), one that awaits the token and does nothing else, and one that awaits it and
makes a fenced write outside `ctx.once()` (docs/fencing.md's pattern), with the same
write through `ctx.once()` for reference.

Every contender drains the same backlog in every run, the order rotating between runs;
the worker group is rewound between drains. Rates run from the first handler call to the
last, as in the processing section. Each run checks its own work: every job read a
token (the sequence moved by exactly N), and a writing contender left exactly N rows.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import asyncpg

from ops.bench.backlog import new_backlog, rewind_worker_group
from ops.bench.common import Bench, BenchError, Tally, rotated, run_async
from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.dedup.store import DedupStore
from stream_jobs.postgres.names import FENCING_SEQUENCE
from stream_jobs.settings import Settings

JOB_TYPE = "bench.fence"
TABLE = "bench_fenced"
# The fenced write of docs/fencing.md, one row per job.
FENCED_WRITE = (f"INSERT INTO {TABLE} AS d (doc_id, n, token) VALUES ($1, $2, $3) "
                "ON CONFLICT (doc_id) DO UPDATE SET n = EXCLUDED.n, token = EXCLUDED.token "
                "WHERE d.token <= EXCLUDED.token")
STORE_POOL = 16  # the fenced store's own connections (the dedup pool is the worker's)
CONTENDERS = ["noop", "pause", "token", "fenced", "once"]


async def _sql(settings: Settings, statement: str) -> Any:
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    try:
        return await conn.fetchval(statement)
    finally:
        await conn.close()


async def _tokens_issued(settings: Settings) -> int:
    """The sequence's position: how many tokens were ever handed out in the schema."""
    row = await _sql(settings, f"SELECT CASE WHEN is_called THEN last_value ELSE 0 END "
                               f"FROM {FENCING_SEQUENCE}")
    return int(row)


async def _drain(settings: Settings, kind: str, n: int) -> dict[str, float]:
    """One drain of the backlog by contender `kind`: its rate, tokens per round trip, and
    the checks' counts."""
    app = App(settings)
    tally = Tally()
    store = await asyncpg.create_pool(
        settings.database_url, min_size=1, max_size=STORE_POOL,
        server_settings={"search_path": settings.database_schema}) if kind == "fenced" else None

    if kind == "noop":
        @app.job(JOB_TYPE)
        async def noop(job: dict[str, Any], ctx: JobContext) -> None:
            tally.hit()
    elif kind == "pause":
        # What any await of I/O costs a job, without the I/O: the handler suspends once on
        # a future another callback resolves on the loop's next turn, as a token's await
        # does when its fetch returns.
        @app.job(JOB_TYPE)
        async def pause(job: dict[str, Any], ctx: JobContext) -> None:
            loop = asyncio.get_running_loop()
            resumed: asyncio.Future[None] = loop.create_future()
            loop.call_soon(resumed.set_result, None)
            await resumed
            tally.hit()
    elif kind == "token":
        @app.job(JOB_TYPE)
        async def token_only(job: dict[str, Any], ctx: JobContext) -> None:
            await ctx.fencing_token
            tally.hit()
    elif kind == "fenced":
        assert store is not None

        @app.job(JOB_TYPE)
        async def fenced(job: dict[str, Any], ctx: JobContext) -> None:
            token = await ctx.fencing_token
            await store.execute(FENCED_WRITE, ctx.job_id, job["n"], token)
            tally.hit()
    else:
        @app.job(JOB_TYPE)
        async def once(job: dict[str, Any], ctx: JobContext) -> None:
            async with ctx.once() as conn:
                await conn.execute(FENCED_WRITE, ctx.job_id, job["n"], 0)
            tally.hit()

    worker = app.worker(JOB_TYPE)
    assert isinstance(worker.dedup, DedupStore)
    before = await _tokens_issued(settings)
    try:
        await asyncio.wait_for(worker.run(until_idle=True), 900)
        round_trips = worker.dedup.fencing_round_trips
    finally:
        if store is not None:
            await store.close()
    if tally.count != n:
        raise BenchError(f"fencing ({kind}): {tally.count} handler calls for {n} jobs")
    issued = await _tokens_issued(settings) - before
    wanted = n if kind in ("token", "fenced") else 0
    if issued != wanted:
        raise BenchError(f"fencing ({kind}): {issued} tokens handed out for {wanted} reads")
    rows = int(await _sql(settings, f"SELECT count(*) FROM {TABLE}"))
    if rows != (n if kind in ("fenced", "once") else 0):
        raise BenchError(f"fencing ({kind}): {rows} rows written for {n} jobs")
    return {"rate": tally.rate(), "round_trips": round_trips, "tokens": issued}


async def _prepare(settings: Settings) -> None:
    await _sql(settings, f"CREATE TABLE IF NOT EXISTS {TABLE} (doc_id text PRIMARY KEY, "
                         "n int NOT NULL, token bigint NOT NULL)")
    await _sql(settings, f"TRUNCATE {TABLE}, stream_jobs_done")


def fencing(b: Bench) -> None:
    s = b.settings()
    n = b.scale.backlog_n // 4
    new_backlog(b, JOB_TYPE, n)
    rates: dict[str, list[float]] = {kind: [] for kind in CONTENDERS}
    # Tokens per round trip, per contender that reads them: how well requests coalesce.
    per_trip: dict[str, list[float]] = {"token": [], "fenced": []}
    for run in range(b.scale.runs):
        for kind in rotated(CONTENDERS, run):
            run_async(_prepare(s), 60)
            t0 = time.monotonic()
            result = run_async(_drain(s, kind, n), 960)
            rates[kind].append(result["rate"])
            if kind in per_trip:
                per_trip[kind].append(result["tokens"] / max(1, result["round_trips"]))
            print(f"[bench] fencing {kind}: {result['rate']:,.0f} jobs/s "
                  f"({time.monotonic() - t0:.0f} s)", flush=True)
            run_async(rewind_worker_group(s, JOB_TYPE), 60)
    b.results.details["fencing_tokens_per_round_trip"] = per_trip
    note = f"{n:,} jobs backlog, concurrency 64, ordering=key"
    r = b.results
    r.add("ours.fence_noop", "no-op, the fencing token never read (fencing section)", "jobs/s",
          rates["noop"], note)
    r.add("ours.fence_pause", "the handler suspends once on a future resolved on the "
          "loop's next turn (any await of I/O, without the I/O)", "jobs/s", rates["pause"],
          note)
    r.add("ours.fence_token", "await ctx.fencing_token, nothing else", "jobs/s",
          rates["token"], f"{note}; {statistics.median(per_trip['token']):.1f} tokens per "
          "round trip (median)")
    r.add("ours.fence_write", "token + one fenced upsert outside ctx.once() (a commit per "
          "job, the store's own pool)", "jobs/s", rates["fenced"],
          f"{note}; pool of {STORE_POOL}; {statistics.median(per_trip['fenced']):.1f} tokens "
          "per round trip (median)")
    r.add("ours.fence_once", "the same upsert through ctx.once() (group commit), for "
          "reference", "jobs/s", rates["once"], note)
