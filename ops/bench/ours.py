"""stream-jobs itself, through its public API: enqueue, processing (no-op and exactly-once),
end-to-end latency at half capacity, and how late a 5 s retry runs.

Processing is measured side by side with the raw consume loop on the same backlog: the
backlog is filled once, and each run drains it again (the worker group is rewound to 0).
Rates run from the first handler call to the last, so worker start-up and the
consumer-group join are left out (they are reported separately).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import time
from array import array
from collections.abc import Callable
from typing import Any, TypedDict

import asyncpg

from ops.bench.backlog import fill, payload, rewind_worker_group
from ops.bench.common import Bench, BenchError, Tally, percentile, rotated, run_async
from ops.bench.cpu import machine_busy_s, postgres_cpu_s, process_cpu_s
from ops.bench.raw import raw_consume, raw_produce
from ops.bench.snapshot import CODE_DIR, PROJECT_PYTHON
from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.handlers import Ordering
from stream_jobs.settings import Settings
from stream_jobs.stack import KafkaCluster, PostgresServer

EFFECTS_TABLE = "bench_effects"


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
    raw: list[float] = []
    many: list[float] = []
    awaited: list[float] = []
    p50: list[float] = []
    p99: list[float] = []
    # A warm-up of each, so JIT-less first-call costs (metadata, connections) are not timed.
    run_async(raw_produce(s, raw_topic, min(n, 2_000)), 120)
    run_async(fill(s, "bench.enqueue-many", min(n, 2_000)), 120)
    for run in range(b.scale.runs):
        for kind in rotated(["raw", "many", "awaited"], run):
            if kind == "raw":
                raw.append(run_async(raw_produce(s, raw_topic, n), 600))
            elif kind == "many":
                many.append(run_async(fill(s, "bench.enqueue-many", n), 600))
            else:
                rate, latencies = run_async(
                    awaited_enqueue(s, "bench.enqueue-awaited", b.scale.awaited_n), 600)
                awaited.append(rate)
                p50.append(percentile(latencies, 50))
                p99.append(percentile(latencies, 99))
    r = b.results
    r.add("raw.produce", "raw aiokafka producer (pipelined sends)", "msg/s", raw,
          f"{n:,} records, same bytes and producer settings as ours")
    r.add("ours.enqueue_many", "enqueue_many, batches of 500", "jobs/s", many, f"{n:,} jobs")
    r.add("ours.enqueue_awaited", "enqueue, awaited one by one", "jobs/s", awaited,
          f"{b.scale.awaited_n:,} calls")
    r.add("ours.enqueue_p50", "enqueue, awaited: latency p50", "ms", p50)
    r.add("ours.enqueue_p99", "enqueue, awaited: latency p99", "ms", p99)


# -- processing -----------------------------------------------------------------------------


async def drain(settings: Settings, job_type: str, n: int, *, ordering: Ordering = "key",
                once: str | None = None, concurrency: int = 64, timeout_s: float = 900.0,
                window: tuple[Callable[[], object], Callable[[], object]] | None = None,
                ) -> dict[str, float]:
    """Run a worker with `Worker.run(until_idle=True)` over a backlog of exactly `n` jobs.

    Returns the rate (first handler call to last), the start-up (run() to the first call)
    and the idle tail (last call to run() returning). `once` is "live" (`ctx.once()`) or
    "deferred" (`ctx.once_deferred()`) for a handler writing one effect row, None for a
    no-op. `window` (no-op only) is called at
    the first job and after the n-th, e.g. to start and stop a profiler.
    """
    app = App(settings)
    tally = Tally()

    if once == "live":
        @app.job(job_type, ordering=ordering, concurrency=concurrency)
        async def write_once(job: dict[str, Any], ctx: JobContext) -> None:
            async with ctx.once() as conn:
                await conn.execute(f"INSERT INTO {EFFECTS_TABLE} (job_id, n) VALUES ($1, $2)",
                                   ctx.job_id, job["n"])
            tally.hit()
    elif once == "deferred":
        @app.job(job_type, ordering=ordering, concurrency=concurrency)
        async def write_deferred(job: dict[str, Any], ctx: JobContext) -> None:
            async with ctx.once_deferred() as writes:
                await writes.execute(f"INSERT INTO {EFFECTS_TABLE} (job_id, n) VALUES ($1, $2)",
                                     ctx.job_id, job["n"])
            tally.hit()
    else:
        @app.job(job_type, ordering=ordering, concurrency=concurrency)
        async def noop(job: dict[str, Any], ctx: JobContext) -> None:
            if window is not None and tally.count == 0:
                window[0]()
            tally.hit()
            if window is not None and tally.count == n:
                window[1]()

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
    run_async(b.declare(job_type), 60)
    b.results.details["processing_fill_jobs_per_s"] = run_async(fill(s, job_type, n), 1200)
    topic = f"{b.prefix}.{job_type}"
    rates: dict[str, list[float]] = {"raw": [], "unordered": [], "key": []}
    startup: list[float] = []
    for run in range(b.scale.runs):
        for kind in rotated(["raw", "unordered", "key"], run):
            if kind == "raw":
                rates["raw"].append(run_async(
                    raw_consume(s, topic, n, f"{b.prefix}.raw-consume-{run}"), 900))
                continue
            ordering: Ordering = "unordered" if kind == "unordered" else "key"
            result = run_async(drain(s, job_type, n, ordering=ordering), 960)
            rates[kind].append(result["rate"])
            startup.append(result["startup_s"])
            run_async(rewind_worker_group(s, job_type), 60)
    r = b.results
    r.add("raw.consume", "raw aiokafka getmany(500) + commit per batch", "msg/s", rates["raw"],
          f"{n:,} records, 6 partitions")
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
        if truncate:
            await conn.execute(f"TRUNCATE {EFFECTS_TABLE}, stream_jobs_done")
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
    run_async(b.declare(job_type), 60)
    run_async(fill(s, job_type, n), 600)
    # (name, once form, concurrency): the default concurrency for both forms, and the
    # deferred form with the concurrency an I/O-bound type would declare (bigger batches).
    contenders = [("live", "live", 64), ("deferred", "deferred", 64),
                  ("deferred256", "deferred", 256)]
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
                  "connection, a savepoint per job)", "jobs/s", rates["live"], note.format(64))
    b.results.add("ours.once_deferred", "exactly-once: one row via ctx.once_deferred() per "
                  "job (recorded, applied in batches)", "jobs/s", rates["deferred"],
                  note.format(64))
    b.results.add("ours.once_deferred_256", "exactly-once: ctx.once_deferred(), concurrency "
                  "256", "jobs/s", rates["deferred256"], note.format(256))


# -- end-to-end latency ---------------------------------------------------------------------


class LatencyRun(TypedDict):
    """One paced run: ms from enqueue to start after the warm-up, and the rates."""

    p50: float
    p99: float
    max: float
    sent: int
    offered_per_s: float
    started_per_s: float


class CapacityStep(LatencyRun):
    """A paced run of the capacity search, at `rate`, and whether it kept up."""

    rate: float
    kept_up: bool


async def _latency_run(b: Bench, job_type: str, rate: float, seconds: float,
                       warmup_s: float) -> LatencyRun:
    s = b.settings()
    app = App(s)
    # Per job: when it was enqueued (unix s) and ms from enqueue to start. Arrays of
    # doubles, not a list of tuples: the measuring handler must not fill the worker's
    # young generation with objects the garbage collector walks (it did: a 46 ms pause).
    enqueued_at = array("d")
    waited_ms = array("d")
    expected = 0
    all_ran = asyncio.Event()

    @app.job(job_type)
    async def stamp(job: dict[str, Any], ctx: JobContext) -> None:
        enqueued = ctx.enqueued_at_ms / 1000
        enqueued_at.append(enqueued)
        waited_ms.append((time.time() - enqueued) * 1000)
        if expected and len(waited_ms) >= expected:
            all_ran.set()

    worker = app.worker(job_type)
    running = asyncio.create_task(worker.run())
    try:
        for _ in range(300):  # joined once every lane partition is assigned (30 s at most)
            if len(worker.consumer.assignment()) >= 1 and worker.partitions:
                break
            if running.done():
                await running
            await asyncio.sleep(0.1)
        else:
            raise BenchError("the latency worker was not assigned its partitions in 30 s")
        await asyncio.sleep(1.0)  # first fetches in flight before the pacer starts
        pacer = await asyncio.create_subprocess_exec(
            str(PROJECT_PYTHON), "-m", "ops.bench.pacer", "--type", job_type,
            "--rate", f"{rate:.1f}", "--seconds", f"{seconds:.1f}",
            cwd=CODE_DIR, env=b.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = await asyncio.wait_for(pacer.communicate(), seconds + 120)
        if pacer.returncode != 0:
            text = err.decode(errors="replace")
            raise BenchError(f"the pacer failed: {text[:400]} ... {text[-600:]}")
        sent_text, achieved_text, began_text = out.decode().split()[:3]
        expected, achieved, began = int(sent_text), float(achieved_text), float(began_text)
        if len(waited_ms) < expected:
            try:
                await asyncio.wait_for(all_ran.wait(), 120)
            except TimeoutError as exc:
                raise BenchError(f"latency run: {len(waited_ms)} of {expected} jobs ran "
                                 "within 120 s") from exc
        if len(waited_ms) != expected:
            raise BenchError(f"latency run: {len(waited_ms)} runs for {expected} jobs")
    finally:
        worker.request_stop()
        await asyncio.wait_for(asyncio.gather(running, return_exceptions=True), 60)
    stamps = list(zip(enqueued_at, waited_ms, strict=True))
    samples = [ms for enqueued, ms in stamps if enqueued >= began + warmup_s]
    # Jobs started per second while the pacer was offering (after the warm-up): with an
    # offer above capacity, what producer, broker and worker sustain together.
    window = (began + warmup_s, began + seconds)
    started = sum(1 for enqueued, ms in stamps
                  if window[0] <= enqueued + ms / 1000 < window[1])
    return {"p50": percentile(samples, 50), "p99": percentile(samples, 99),
            "max": max(samples), "sent": expected, "offered_per_s": achieved,
            "started_per_s": started / (window[1] - window[0])}


# A paced run kept up when the pacer offered what it was asked to and no job waited long:
# a worker that falls behind builds a backlog, and its p99 grows to seconds.
KEPT_UP_OFFERED = 0.97
KEPT_UP_P99_MS = 1000.0


def _capacity_search(b: Bench, drain: float) -> tuple[float, list[CapacityStep]]:
    """The end-to-end capacity: the highest offered rate, in steps of a tenth of the
    worker-alone drain rate, that the producer process, the broker and the worker carried
    together (see KEPT_UP_*). Steps go up until one does not keep up."""
    steps: list[CapacityStep] = []
    capacity: float | None = None
    for tenth in range(3, 11):
        rate = drain * tenth / 10
        job_type = f"bench.e2e-step{tenth}"
        run_async(b.declare(job_type), 60)
        paced = run_async(_latency_run(b, job_type, rate, b.scale.e2e_seconds, 1.0), 900)
        step: CapacityStep = {**paced, "rate": rate,
                              "kept_up": (paced["offered_per_s"] >= KEPT_UP_OFFERED * rate
                                          and paced["p99"] <= KEPT_UP_P99_MS)}
        steps.append(step)
        if not step["kept_up"]:
            break
        capacity = rate
    if capacity is None:  # not even the first step: what the worker started meanwhile
        capacity = steps[0]["started_per_s"]
    return capacity, steps


def latency(b: Bench) -> None:
    """p50/p99 at half the end-to-end capacity (the goal) and at a quarter of it; also at
    half the worker-alone drain rate, the measure earlier runs used.

    The end-to-end capacity is searched first (`_capacity_search`). On 2 shared cores the
    producer process costs about as much CPU per job as the worker, so half the worker's
    drain rate alone is close to what the box carries at all, not half of it."""
    drain = b.results.figures["ours.noop_key"].median
    capacity, steps = _capacity_search(b, drain)
    # name: (rate, figure-name suffix, "at ..." in the label, what the rate is)
    loads = {
        "half": (capacity * 0.5, "", "half capacity", "half of the end-to-end capacity"),
        "quarter": (capacity * 0.25, "_quarter", "quarter capacity",
                    "a quarter of the end-to-end capacity"),
        "half-drain": (drain * 0.5, "_half_drain", "half the worker-alone drain rate",
                       "half of the worker-alone no-op drain rate"),
    }
    found: dict[str, list[LatencyRun]] = {name: [] for name in loads}
    for run in range(b.scale.runs):
        for name in rotated(list(loads), run):
            job_type = f"bench.e2e-{name}-r{run}"
            run_async(b.declare(job_type), 60)
            found[name].append(run_async(_latency_run(
                b, job_type, loads[name][0], b.scale.e2e_seconds, 1.0), 600))
    b.results.details["latency_runs"] = found
    b.results.details["latency_capacity_steps"] = steps
    r = b.results
    r.add("ours.e2e_capacity", "end-to-end capacity (producer process + worker)", "jobs/s",
          [capacity], f"the highest offered rate, in tenths of the no-op drain rate, with "
          f"p99 <= {KEPT_UP_P99_MS:.0f} ms and >= {KEPT_UP_OFFERED:.0%} of it offered; "
          "steps in the latency detail")
    for name, (rate, suffix, at, described) in loads.items():
        note = (f"offered {rate:,.0f} jobs/s ({described}) for "
                f"{b.scale.e2e_seconds:.0f} s by a paced producer process; first 1 s dropped")
        r.add(f"ours.e2e{suffix}_p50", f"end-to-end p50 at {at}", "ms",
              [x["p50"] for x in found[name]], note)
        r.add(f"ours.e2e{suffix}_p99", f"end-to-end p99 at {at}", "ms",
              [x["p99"] for x in found[name]], note)
        r.add(f"ours.e2e{suffix}_offered", f"rate the pacer achieved ({name})", "jobs/s",
              [x["offered_per_s"] for x in found[name]])


# -- retry-tier accuracy --------------------------------------------------------------------


class RetryRun(TypedDict):
    """How late each retry ran against its 5 s tier, and the relay's counters."""

    warm: bool
    late_ms: list[float]
    outcomes: dict[str, int]
    relay_released: int | None  # None: the worker ran no relay
    relay_hops: int | None


async def _retry_run(settings: Settings, job_type: str, n: int, *,
                     warm: bool) -> RetryRun:
    """Each job fails once; how late each retry ran against 5 s (ms), and the relay's
    counters (a record the relay takes before it is due hops back to a tier).

    Cold: a fresh worker meets the backlog, so its first failures are also its producer's
    first writes to the tier topic. Warm: one canary job has failed and been retried by
    the same running worker before the n jobs are enqueued.
    """
    app = App(settings)
    failed_at: dict[str, float] = {}
    late_ms: list[float] = []
    expected = n + 1 if warm else n
    all_ran = asyncio.Event()
    canary_ran = asyncio.Event()

    @app.job(job_type)
    async def fail_once(job: dict[str, Any], ctx: JobContext) -> None:
        now = time.time()
        if ctx.attempt == 1:
            failed_at[ctx.job_id] = now
            raise RuntimeError("failing once on purpose")
        if job.get("canary"):
            canary_ran.set()
        else:
            late_ms.append((now - failed_at[ctx.job_id] - 5.0) * 1000)
        if len(late_ms) + canary_ran.is_set() >= expected:
            all_ran.set()

    worker = app.worker(job_type)
    limit_s = 120 + n / 10
    if not warm:
        await fill(settings, job_type, n)
        await asyncio.wait_for(worker.run(until_idle=True), limit_s)
    else:
        running = asyncio.create_task(worker.run())
        try:
            async with app.client() as client:
                await client.enqueue(job_type, {"canary": True})
            await asyncio.wait_for(canary_ran.wait(), 60)
            await fill(settings, job_type, n)
            await asyncio.wait_for(all_ran.wait(), limit_s)
        except TimeoutError as exc:
            raise BenchError(f"warm retry run: {len(late_ms)} of {n} retries ran") from exc
        finally:
            worker.request_stop()
            await asyncio.wait_for(asyncio.gather(running, return_exceptions=True), 60)
    if len(late_ms) != n:
        raise BenchError(f"retry run: {len(late_ms)} of {n} retries ran "
                         f"(outcomes {dict(worker.outcomes)})")
    relay = worker.relay
    return {"warm": warm, "late_ms": sorted(late_ms), "outcomes": dict(worker.outcomes),
            "relay_released": getattr(relay, "released", None),
            "relay_hops": getattr(relay, "hops", None)}


def retry(b: Bench) -> None:
    found: dict[str, list[RetryRun]] = {"cold": [], "warm": []}
    for run in range(b.scale.runs):
        for kind in rotated(["cold", "warm"], run):
            job_type = f"bench.late-{kind}-r{run}"
            run_async(b.declare(job_type), 60)
            found[kind].append(run_async(
                _retry_run(b.settings(), job_type, b.scale.retry_n, warm=kind == "warm"), 600))
    b.results.details["retry_runs"] = found["cold"] + found["warm"]
    r = b.results
    for kind, runs in found.items():
        lates = [x["late_ms"] for x in runs]
        note = (f"{b.scale.retry_n} jobs failing once; gap from the failure to the retry's "
                f"start, minus 5 s; {kind} worker")
        suffix = "" if kind == "cold" else "_warm"
        label = f"5 s retry, {kind} worker: lateness"
        r.add(f"ours.retry{suffix}_late_p50", f"{label} p50", "ms",
              [percentile(x, 50) for x in lates], note)
        r.add(f"ours.retry{suffix}_late_p99", f"{label} p99", "ms",
              [percentile(x, 99) for x in lates], note)
        r.add(f"ours.retry{suffix}_late_max", f"{label} max", "ms", [max(x) for x in lates], note)
