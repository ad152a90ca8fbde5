"""The transactional outbox, side by side with direct enqueueing (`BENCH_ONLY=outbox`).

- **Throughput**: the same jobs, in batches of `ENQUEUE_BATCH`, once through
  `enqueue_many` straight to Kafka and once through `enqueue_many(conn=...)`, one
  transaction per batch, with a `stream-jobs outbox relay` process moving them on. Two
  figures for the outbox: the callers' commits per second, and jobs per second through to
  Kafka (first commit to the relay's last delete: the outbox empty again), which is the
  one the goal compares with direct `enqueue_many`.
- **Latency at 1,000 jobs/s**: a paced writer commits one job per transaction (16
  connections, as concurrent web requests would) for a few seconds while the relay
  process runs; each job's latency is from its commit returning to the broker appending
  the record (the topic keeps LogAppendTime, the broker's clock, which is this machine's).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import Iterator

import asyncpg
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from ops.bench.backlog import ENQUEUE_BATCH, fill, payload
from ops.bench.common import Bench, BenchError, percentile, rotated, run_async
from ops.bench.snapshot import OUT_DIR, PROJECT_CLI
from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.kafka.admin import admin_client
from stream_jobs.kafka.consumer import open_reader
from stream_jobs.naming import lane_topic
from stream_jobs.outbox.rows import table
from stream_jobs.record import HEADER_JOB_ID
from stream_jobs.settings import Settings

HEADING = "Outbox"
# The section's opening sentence and the figures' prefix (ops/bench/report/ renders it).
INTRO = ("`enqueue(conn=...)` writes the job in the caller's transaction and a relay "
         "process moves it to Kafka; measured side by side with direct `enqueue_many` in "
         "one run (ops/bench/outbox.py says how).")
PREFIX = "outbox."
DIRECT, OUTBOX, PACED = "bench.outbox-direct", "bench.outbox", "bench.outbox-paced"
LATENCY_RATE = 1_000.0
WRITERS = 16
GOALS = [  # (text, numerator or figure, denominator or None, op, target, unit)
    ("outbox enqueue through to Kafka >= 0.3x direct enqueue_many",
     "outbox.through", "outbox.direct", ">=", 0.3, "x"),
    ("commit -> broker ack p99 <= 100 ms at 1,000 jobs/s", "outbox.p99", None, "<=",
     100.0, "ms"),
]
RATIOS: list[tuple[str, str, str]] = []  # none side by side beyond the goals


@contextlib.contextmanager
def relay_process(b: Bench) -> Iterator[subprocess.Popen[bytes]]:
    """`stream-jobs outbox relay` on the bench's settings, as a worker host would run it."""
    log = (OUT_DIR / "outbox-relay.log").open("ab")
    proc = subprocess.Popen([str(PROJECT_CLI), "outbox", "relay"], env=b.env(), stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


async def _until_empty(settings: Settings, timeout_s: float) -> float:
    """Poll the outbox (one connection, every 5 ms) until it is empty; the time
    (perf_counter) it was first seen so."""
    conn = await asyncpg.connect(settings.database_url)
    try:
        deadline = time.perf_counter() + timeout_s
        waiting = f"SELECT EXISTS (SELECT 1 FROM {table(settings.database_schema)})"
        while await conn.fetchval(waiting):
            if time.perf_counter() > deadline:
                raise BenchError(f"the outbox did not empty within {timeout_s:.0f} s")
            await asyncio.sleep(0.005)
        return time.perf_counter()
    finally:
        await conn.close()


async def through_outbox(settings: Settings, n: int) -> tuple[float, float]:
    """`n` jobs through `enqueue_many(conn=...)`, a transaction per batch: (commits per
    second, jobs per second through to Kafka)."""
    client = App(settings).client()
    conn = await asyncpg.connect(settings.database_url)
    try:
        began = time.perf_counter()
        for i in range(0, n, ENQUEUE_BATCH):
            async with conn.transaction():
                await client.enqueue_many([Job(OUTBOX, payload(j))
                                           for j in range(i, min(n, i + ENQUEUE_BATCH))],
                                          conn=conn)
        committed = time.perf_counter()
    finally:
        await conn.close()
    emptied = await _until_empty(settings, 600)
    return n / (committed - began), n / (emptied - began)


async def paced_latency(settings: Settings, rate: float, seconds: float
                        ) -> tuple[list[float], float]:
    """One job per transaction at `rate` for `seconds` from `WRITERS` connections; (each
    job's commit -> append latency in ms, the rate achieved)."""
    client = App(settings).client()
    pool = await asyncpg.create_pool(settings.database_url, min_size=WRITERS, max_size=WRITERS)
    committed: dict[str, float] = {}
    queue: asyncio.Queue[int | None] = asyncio.Queue()

    async def writer() -> None:
        async with pool.acquire() as conn:
            while (i := await queue.get()) is not None:
                async with conn.transaction():
                    job_id = await client.enqueue(PACED, payload(i), conn=conn)
                committed[job_id] = time.time() * 1000

    writers = [asyncio.create_task(writer()) for _ in range(WRITERS)]
    try:
        total = int(rate * seconds)
        began = time.perf_counter()
        sent = 0
        while sent < total:
            due = min(total, int((time.perf_counter() - began) * rate)) - sent
            for i in range(due):
                queue.put_nowait(sent + i)
            sent += due
            await asyncio.sleep(0.002)  # the pacer's tick
        for _ in writers:
            queue.put_nowait(None)
        await asyncio.gather(*writers)
        achieved = total / (time.perf_counter() - began)
    finally:
        for task in writers:
            task.cancel()
        await pool.close()
    await _until_empty(settings, 120)
    appended = await _append_times(settings, lane_topic(settings.topic_prefix, PACED))
    missing = set(committed) - set(appended)
    if missing:
        raise BenchError(f"{len(missing)} committed jobs are not in Kafka")
    return [appended[job_id] - at for job_id, at in committed.items()], achieved


async def _append_times(settings: Settings, topic: str) -> dict[str, float]:
    """Job ID -> the broker's append time (ms) of its first record in `topic`."""
    from stream_jobs.kafka import scan

    found: dict[str, float] = {}
    async with open_reader(settings, client_id="bench-outbox") as consumer:
        await consumer.refresh_metadata()
        async for record in scan.scan(consumer, topic, await scan.ranges(consumer, topic)):
            for name, value in record.headers:
                if name == HEADER_JOB_ID:
                    found.setdefault(value.decode(), float(record.timestamp))
    return found


async def _log_append_time(settings: Settings, topic: str) -> None:
    async with admin_client(settings) as admin:
        await admin.alter_configs([ConfigResource(
            ConfigResourceType.TOPIC, topic, {"message.timestamp.type": "LogAppendTime"})])


def outbox(b: Bench) -> None:
    s = b.settings()
    for job_type in (DIRECT, OUTBOX, PACED):
        run_async(b.declare(job_type), 60)
    run_async(_log_append_time(s, lane_topic(s.topic_prefix, PACED)), 60)
    n = b.scale.produce_n
    direct: list[float] = []
    commits: list[float] = []
    through: list[float] = []
    p50: list[float] = []
    p99: list[float] = []
    achieved: list[float] = []
    with relay_process(b):
        run_async(fill(s, DIRECT, min(n, 2_000)), 120)  # warm-ups: connections, metadata
        run_async(through_outbox(s, min(n, 2_000)), 300)
        for run in range(b.scale.runs):
            for kind in rotated(["direct", "outbox"], run):
                if kind == "direct":
                    direct.append(run_async(fill(s, DIRECT, n), 600))
                else:
                    committed, moved = run_async(through_outbox(s, n), 900)
                    commits.append(committed)
                    through.append(moved)
            latencies, rate = run_async(paced_latency(s, LATENCY_RATE, b.scale.e2e_seconds),
                                        300)
            p50.append(percentile(latencies, 50))
            p99.append(percentile(latencies, 99))
            achieved.append(rate)
    r = b.results
    r.add("outbox.direct", "direct enqueue_many (beside the outbox)", "jobs/s", direct,
          f"{n:,} jobs, batches of {ENQUEUE_BATCH}")
    r.add("outbox.commits", "enqueue_many(conn=...): commits", "jobs/s", commits,
          f"{n:,} jobs, a transaction per batch of {ENQUEUE_BATCH}")
    r.add("outbox.through", "enqueue_many(conn=...): through to Kafka", "jobs/s", through,
          "first commit to the outbox empty again (a relay process)")
    r.add("outbox.p50", f"outbox commit -> broker append p50 at {LATENCY_RATE:,.0f}/s",
          "ms", p50, f"one job per transaction, {WRITERS} connections")
    r.add("outbox.p99", f"outbox commit -> broker append p99 at {LATENCY_RATE:,.0f}/s",
          "ms", p99)
    r.add("outbox.paced_rate", "outbox latency run: rate achieved", "jobs/s", achieved,
          f"offered {LATENCY_RATE:,.0f}/s for {b.scale.e2e_seconds:g} s")


__all__ = ["GOALS", "HEADING", "INTRO", "PREFIX", "RATIOS", "outbox"]
