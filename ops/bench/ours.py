"""stream-jobs itself, through its public API: enqueue, and processing (no-op and
exactly-once). End-to-end latency is latency.py's, retry accuracy retry.py's.

Processing is measured side by side with the raw consume loop on the same backlog: the
backlog is filled once, and each run drains it again (the worker group is rewound to 0).
Rates run from the first handler call to the last, so worker start-up and the
consumer-group join are left out (they are reported separately).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import asyncpg

from ops.bench.backlog import fill, new_backlog, payload, rewind_worker_group
from ops.bench.common import Bench, BenchError, Tally, percentile, rotated, run_async
from ops.bench.cpu import machine_busy_s, postgres_cpu_s, process_cpu_s
from ops.bench.raw import STRONG_NAME, raw_consume, raw_consume_strong, raw_produce
from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.handlers import Ordering
from stream_jobs.settings import Settings
from stream_jobs.stack import KafkaCluster, PostgresServer

EFFECTS_TABLE = "bench_effects"
INSERT_EFFECT = f"INSERT INTO {EFFECTS_TABLE} (job_id, n) VALUES ($1, $2)"
# The anchor users would write by hand: an idempotency key of their own, claimed with the
# effect in one transaction per job on a pool of the worker's size.
KEYS_TABLE = "bench_idempotency_keys"
CLAIM_KEY = f"INSERT INTO {KEYS_TABLE} (key) VALUES ($1) ON CONFLICT DO NOTHING"


# -- enqueue --------------------------------------------------------------------------------


async def awaited_enqueue(settings: Settings, job_type: str, n: int) -> tuple[float, list[float]]:
    """`await enqueue(...)` one by one: jobs per second and each call's latency in ms."""
    latencies: list[float] = []
    async with App(settings).client() as client:
        await client.enqueue(job_type, payload(0))  # metadata and connections warm
        began = time.perf_counter()
        for i in range(n):
            t0 = time.perf_counter()
            await client.enqueue(job_type, payload(i))
            latencies.append((time.perf_counter() - t0) * 1000)
        return n / (time.perf_counter() - began), latencies


def enqueue(b: Bench) -> None:
    s = b.settings()
    for job_type in ("bench.produce-raw", "bench.enqueue-many", "bench.enqueue-awaited"):
        run_async(b.declare(job_type), 60)
    raw_topic = f"{b.prefix}.bench.produce-raw"
    n = b.scale.produce_n
    found: dict[str, list[float]] = {"raw": [], "many": [], "awaited": [], "p50": [],
                                     "p99": []}
    # A warm-up of each, so JIT-less first-call costs (metadata, connections) are not timed.
    run_async(raw_produce(s, raw_topic, min(n, 2_000)), 120)
    run_async(fill(s, "bench.enqueue-many", min(n, 2_000)), 120)
    for run in range(b.scale.runs):
        for kind in rotated(["raw", "many", "awaited"], run):
            if kind == "raw":
                found["raw"].append(run_async(raw_produce(s, raw_topic, n), 600))
            elif kind == "many":
                found["many"].append(run_async(fill(s, "bench.enqueue-many", n), 600))
            else:
                rate, latencies = run_async(
                    awaited_enqueue(s, "bench.enqueue-awaited", b.scale.awaited_n), 600)
                found["awaited"].append(rate)
                found["p50"].append(percentile(latencies, 50))
                found["p99"].append(percentile(latencies, 99))
    r = b.results
    r.add("raw.produce", "raw aiokafka producer (pipelined sends)", "msg/s", found["raw"],
          f"{n:,} records, same bytes and producer settings as ours")
    r.add("ours.enqueue_many", "enqueue_many, batches of 500", "jobs/s", found["many"],
          f"{n:,} jobs")
    r.add("ours.enqueue_awaited", "enqueue, awaited one by one", "jobs/s", found["awaited"],
          f"{b.scale.awaited_n:,} calls")
    r.add("ours.enqueue_p50", "enqueue, awaited: latency p50", "ms", found["p50"])
    r.add("ours.enqueue_p99", "enqueue, awaited: latency p99", "ms", found["p99"])


# -- processing -----------------------------------------------------------------------------


async def drain(settings: Settings, job_type: str, n: int, *, ordering: Ordering = "key",
                once: str | None = None, concurrency: int = 64, timeout_s: float = 900.0,
                window: tuple[Callable[[], object], Callable[[], object]] | None = None,
                ) -> dict[str, float]:
    """Run a worker with `Worker.run(until_idle=True)` over a backlog of exactly `n` jobs.

    Returns the rate (first handler call to last), the start-up (run() to the first call)
    and the idle tail (last call to run() returning). `once` is "live" (`ctx.once()`) or
    "deferred" (`ctx.once_deferred()`) for a handler writing one effect row, None for a
    no-op; "by hand" writes the same effect behind an idempotency key of its own, one
    transaction per job (the anchor). `window` (no-op and the live form) is called at
    the first job and after the n-th, e.g. to start and stop a profiler.
    """
    app = App(settings)
    tally = Tally()

    if once == "by hand":
        keys = await asyncpg.create_pool(
            settings.database_url, min_size=1, max_size=settings.database_pool_size,
            server_settings={"search_path": settings.database_schema})

        @app.job(job_type, ordering=ordering, concurrency=concurrency)
        async def by_hand(job: dict[str, Any], ctx: JobContext) -> None:
            async with keys.acquire() as conn, conn.transaction():
                if await conn.execute(CLAIM_KEY, ctx.job_id) == "INSERT 0 1":
                    await conn.execute(INSERT_EFFECT, ctx.job_id, job["n"])
            tally.hit()

        try:
            return await until_idle(app, job_type, n, tally, timeout_s)
        finally:
            await keys.close()
    if once is not None:
        # The form is chosen here, not per job: `block(ctx)` is `ctx.once()` or
        # `ctx.once_deferred()`, and both take the same execute().
        block: Callable[[JobContext], AbstractAsyncContextManager[Any]] = (
            JobContext.once if once == "live" else JobContext.once_deferred)

        opened = [False]

        @app.job(job_type, ordering=ordering, concurrency=concurrency)
        async def write_effect(job: dict[str, Any], ctx: JobContext) -> None:
            if window is not None and not opened[0]:
                opened[0] = True
                window[0]()
            async with block(ctx) as writes:
                await writes.execute(INSERT_EFFECT, ctx.job_id, job["n"])
            tally.hit()
            if window is not None and tally.count == n:
                window[1]()
    else:
        @app.job(job_type, ordering=ordering, concurrency=concurrency)
        async def noop(job: dict[str, Any], ctx: JobContext) -> None:
            if window is not None and tally.count == 0:
                window[0]()
            tally.hit()
            if window is not None and tally.count == n:
                window[1]()

    return await until_idle(app, job_type, n, tally, timeout_s)


async def until_idle(app: App, job_type: str, n: int, tally: Tally,
                     timeout_s: float) -> dict[str, float]:
    """Run the app's worker of `job_type` until idle over a backlog of exactly `n` jobs,
    its handler counting calls on `tally`: the rate, the start-up and the idle tail (see
    `drain`). BenchError past `timeout_s`, or for other than `n` handler calls."""
    worker = app.worker(job_type)
    began = time.perf_counter()
    try:
        await asyncio.wait_for(worker.run(until_idle=True), timeout_s)
    except TimeoutError as exc:
        raise BenchError(f"{job_type}: the worker ran {tally.count} of {n} jobs in "
                         f"{timeout_s:.0f} s") from exc
    ended = time.perf_counter()
    if tally.count != n:
        raise BenchError(f"{job_type}: {tally.count} handler calls for {n} jobs "
                         f"(outcomes {dict(worker.outcomes)})")
    return {"rate": tally.rate(), "startup_s": tally.first - began,
            "tail_s": ended - tally.last}


def processing(b: Bench) -> None:
    s = b.settings()
    job_type = "bench.noop"
    n = b.scale.backlog_n
    b.results.details["processing_fill_jobs_per_s"] = new_backlog(b, job_type, n, 1200)
    topic = f"{b.prefix}.{job_type}"
    rates: dict[str, list[float]] = {"raw": [], "strong": [], "unordered": [], "key": []}
    startup: list[float] = []
    for run in range(b.scale.runs):
        for kind in rotated(["raw", "strong", "unordered", "key"], run):
            if kind == "raw":
                rates["raw"].append(run_async(
                    raw_consume(s, topic, n, f"{b.prefix}.raw-consume-{run}"), 900))
                continue
            if kind == "strong":
                rates["strong"].append(run_async(raw_consume_strong(
                    s, topic, n, f"{b.prefix}.raw-strong-{run}"), 900))
                continue
            ordering: Ordering = "unordered" if kind == "unordered" else "key"
            result = run_async(drain(s, job_type, n, ordering=ordering), 960)
            rates[kind].append(result["rate"])
            startup.append(result["startup_s"])
            run_async(rewind_worker_group(s, job_type), 60)
    r = b.results
    r.add("raw.consume", "raw aiokafka getmany(500) + commit per batch", "msg/s", rates["raw"],
          f"{n:,} records, 6 partitions")
    r.add("raw.consume_strong", "the strongest raw aiokafka loop (uvloop, commits every "
          "0.5 s, tuned fetches)", "msg/s", rates["strong"],
          f"{n:,} records, 6 partitions; fetch: {STRONG_NAME} (ops/bench/raw.py)")
    r.add("ours.noop_unordered", "no-op processing, ordering=unordered", "jobs/s",
          rates["unordered"], f"{n:,} jobs backlog, concurrency 64")
    r.add("ours.noop_key", "no-op processing, ordering=key (default)", "jobs/s", rates["key"],
          f"{n:,} jobs backlog, concurrency 64")
    r.add("ours.worker_startup", "worker start to first job (join included)", "s", startup,
          "left out of the processing rates")


async def prepare_effects(settings: Settings, *, truncate: bool) -> None:
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    try:
        await conn.execute(f"CREATE TABLE IF NOT EXISTS {EFFECTS_TABLE} "
                           "(job_id text NOT NULL, n int NOT NULL)")
        await conn.execute(f"CREATE TABLE IF NOT EXISTS {KEYS_TABLE} (key text PRIMARY KEY)")
        if truncate:
            await conn.execute(f"TRUNCATE {EFFECTS_TABLE}, {KEYS_TABLE}, stream_jobs_done")
    finally:
        await conn.close()


async def effects_count(settings: Settings) -> tuple[int, int]:
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    try:
        rows = await conn.fetchval(f"SELECT count(DISTINCT job_id) FROM {EFFECTS_TABLE}")
        total = await conn.fetchval(f"SELECT count(*) FROM {EFFECTS_TABLE}")
        return int(rows), int(total)
    finally:
        await conn.close()


def exactly_once(b: Bench) -> None:
    s = b.settings()
    job_type = "bench.once"
    n = b.scale.once_n
    new_backlog(b, job_type, n)
    # (name, once form, concurrency): the default concurrency for both forms, and the
    # deferred form with the concurrency an I/O-bound type would declare (bigger batches).
    contenders = [("live", "live", 64), ("by hand", "by hand", 64),
                  ("deferred", "deferred", 64), ("deferred256", "deferred", 256)]
    rates: dict[str, list[float]] = {name: [] for name, _, _ in contenders}
    # Where each job's CPU goes: this process (the worker runs in it), the broker, Postgres.
    stack = b.stack_settings()
    brokers = [row.pid for row in KafkaCluster(stack, 1).status() if row.pid is not None]
    postmaster = PostgresServer(stack).running_pid()

    def cpu_now() -> dict[str, float]:
        return {"worker": process_cpu_s(os.getpid()),
                "broker": sum(process_cpu_s(p) for p in brokers),
                "postgres": postgres_cpu_s(postmaster), "machine": machine_busy_s(),
                "at": time.monotonic()}

    cpu: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in contenders}
    for run in range(b.scale.runs):
        # Every form in every run, rotating which goes first, so they share the noise.
        shift = run % len(contenders)
        for name, mode, concurrency in contenders[shift:] + contenders[:shift]:
            run_async(prepare_effects(s, truncate=True), 60)
            before = cpu_now()
            rates[name].append(run_async(drain(s, job_type, n, once=mode,
                                               concurrency=concurrency), 960)["rate"])
            after = cpu_now()
            cpu[name].append({k: after[k] - before[k] for k in after})
            distinct, total = run_async(effects_count(s), 60)
            if distinct != n or total != n:
                raise BenchError(f"exactly-once ({name}): {total} effect rows for {distinct} "
                                 f"of {n} jobs")
            run_async(rewind_worker_group(s, job_type), 60)
    # CPU per job over the whole drain call (start-up and the idle check included, so a
    # little above the steady cost), median of the runs.
    b.results.details["once_cpu"] = {
        name: {"jobs": n, "runs": runs, "ms_per_job": {
            part: statistics.median(r[part] for r in runs) * 1000 / n
            for part in ("worker", "broker", "postgres", "machine")},
            "wall_s": statistics.median(r["at"] for r in runs)}
        for name, runs in cpu.items()}
    note = (f"{n:,} jobs, default pool of {s.database_pool_size} connections, "
            "ordering=key, concurrency {}; rows checked = N")
    b.results.add("ours.once", "exactly-once: one row via ctx.once() per job (live "
                  "connection, group claims, optimistic batches)", "jobs/s", rates["live"],
                  note.format(64))
    b.results.add("ours.once_by_hand", "the same row behind a hand-written idempotency key "
                  "(INSERT ... ON CONFLICT DO NOTHING + the effect, a transaction per job)",
                  "jobs/s", rates["by hand"],
                  f"{n:,} jobs, a pool of {s.database_pool_size} connections of the handler's "
                  "own, ordering=key, concurrency 64; rows checked = N")
    b.results.add("ours.once_deferred", "exactly-once: one row via ctx.once_deferred() per "
                  "job (recorded, applied in batches)", "jobs/s", rates["deferred"],
                  note.format(64))
    b.results.add("ours.once_deferred_256", "exactly-once: ctx.once_deferred(), concurrency "
                  "256", "jobs/s", rates["deferred256"], note.format(256))
