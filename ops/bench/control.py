"""What cancel, unique keys and debounce cost, side by side (`BENCH_ONLY=control`).

- **The no-op path.** One backlog, drained by a no-op handler in three contenders
  interleaved in rounds (ops/bench/paired.py: every contender once a round, the order
  turned each round, the load average after each drain): the cancel watch off
  (`STREAM_JOBS_CANCEL_WATCH=false`: no LISTEN, no map of running jobs; the empty set
  is still looked at), on with nothing cancelled
  (the default: what cancels cost a worker that never sees one), and on with 10,000 other
  job IDs cancelled (every job looked up in a set of 10,000: the check per job when cancels
  are used). Both headers of unique jobs are decoded on every path alike.
- **Unique keys at the worker.** A backlog a quarter as long whose every job carries a
  unique key, drained by the same no-op handler in each of the usual runs: each job gives
  its key back (one statement) once finished.
- **Enqueue.** Awaited one by one, rotated: a plain `enqueue` (returns on the broker's
  ack), a unique one (a fresh key each: the key and the outbox row in one Postgres
  transaction, returning on its commit) and a debounced one (a fresh key each: a window
  opened, the outbox row written). The outbox is emptied between runs; no relay runs, as
  the caller's wait ends at the commit.

Rates run from the first handler call to the last, as in the processing section; each
drain checks that every job ran once.
"""

from __future__ import annotations

import time
from typing import Any

import asyncpg

from ops.bench.backlog import ENQUEUE_BATCH, fill, payload, rewind_worker_group
from ops.bench.common import Bench, percentile, rotated, run_async
from ops.bench.ours import drain
from ops.bench.paired import PAIRS, QUICK_PAIRS, Interleaved, interleave
from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.kafka.producer import JobProducer
from stream_jobs.settings import Settings

HEADING = "Cancel, unique jobs, debounce"
# The section's opening sentence and the figures' prefix (ops/bench/report/ renders it).
INTRO = ("What cancels, unique keys and debounce cost, side by side in one run "
         "(ops/bench/control.py says how).")
PREFIX = "control."
NOOP, KEYED = "bench.control", "bench.control-keyed"
ENQ_PLAIN, ENQ_UNIQUE, ENQ_DEBOUNCE = ("bench.control-enq", "bench.control-unique",
                                       "bench.control-debounce")
CANCELLED_IDS = 10_000
DRAINS = ["off", "on", "on_cancels"]
ENQUEUES = ["plain", "unique", "debounce"]
GOALS = [  # (text, numerator or figure, denominator or None, op, target, unit)
    ("no-op with cancels on (none cancelled) >= 0.97x cancels off",
     "control.noop_on", "control.noop_off", ">=", 0.97, "x"),
    ("no-op with 10,000 other IDs cancelled (a check per job) >= 0.97x cancels off",
     "control.noop_cancels", "control.noop_off", ">=", 0.97, "x"),
    ("unique enqueue, awaited: p99 < 20 ms", "control.unique_p99", None, "<", 20.0, "ms"),
]


async def _sql(settings: Settings, *statements: str) -> None:
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


async def _cancel_others(settings: Settings, n: int) -> None:
    """`n` cancels of IDs no job has, so the workers' sets hold them and every job runs.
    Vacuumed at once for every contender alike, so no autovacuum runs during a drain."""
    await _sql(settings, "TRUNCATE stream_jobs_cancels",
               "INSERT INTO stream_jobs_cancels (job_id, job_type) SELECT "
               f"'bench-cancelled-' || g, '' FROM generate_series(1, {n}) g",
               "VACUUM ANALYZE stream_jobs_cancels")


async def _fill_keyed(settings: Settings, n: int) -> None:
    """`n` jobs that each carry a unique key (straight to the lane, as a relay would put
    them: what is measured is the worker giving keys back)."""
    app = App(settings)
    client = app.client()
    producer = JobProducer(settings)
    await producer.start()
    try:
        for i in range(0, n, ENQUEUE_BATCH):
            batch = []
            for j in range(i, min(n, i + ENQUEUE_BATCH)):
                topic, record = client.prepare(Job(KEYED, payload(j)))
                batch.append((topic, record.with_(unique_key=f"key-{j}")))
            await producer.send_many(batch)
    finally:
        await producer.stop()


async def _awaited(settings: Settings, kind: str, n: int, run: int) -> tuple[float, list[float]]:
    """`await enqueue(...)` one by one: jobs per second and each call's latency in ms."""
    job_type = {"plain": ENQ_PLAIN, "unique": ENQ_UNIQUE, "debounce": ENQ_DEBOUNCE}[kind]
    latencies: list[float] = []
    async with App(settings).client() as client:
        def call(i: int) -> Any:
            key = f"r{run}-k{i}"  # a fresh key each: none is held, none supersedes
            if kind == "unique":
                return client.enqueue(job_type, payload(i), unique_key=key)
            if kind == "debounce":
                return client.enqueue(job_type, payload(i), key=key, debounce=60)
            return client.enqueue(job_type, payload(i))

        await call(-1)  # connections and metadata warm
        began = time.perf_counter()
        for i in range(n):
            t0 = time.perf_counter()
            await call(i)
            latencies.append((time.perf_counter() - t0) * 1000)
        return n / (time.perf_counter() - began), latencies


def _noop_drain(s: Settings, kind: str, job_type: str, n: int) -> float:
    """One drain of the contender `kind` (DRAINS, or "keyed"): its jobs/s."""
    run_async(_cancel_others(s, CANCELLED_IDS if kind == "on_cancels" else 0), 60)
    watched = s.model_copy(update={"cancel_watch": kind != "off"})
    rate = run_async(drain(watched, job_type, n), 960)["rate"]
    run_async(rewind_worker_group(s, job_type), 60)
    return rate


def control(b: Bench) -> None:
    s = b.settings()
    # The no-op contenders drain the whole processing backlog (a quarter of it drained in
    # under a second here, too short to tell 3% apart); the keyed one, at a third of
    # their speed, a quarter of it.
    n, n_keyed = b.scale.backlog_n, b.scale.backlog_n // 4
    for job_type in (NOOP, KEYED, ENQ_PLAIN, ENQ_UNIQUE, ENQ_DEBOUNCE):
        run_async(b.declare(job_type, retry_tiers=["5s", "1m"]), 60)
    run_async(fill(s, NOOP, n), 600)
    run_async(_fill_keyed(s, n_keyed), 600)
    noop = interleave(DRAINS, lambda kind: _noop_drain(s, kind, NOOP, n),
                      QUICK_PAIRS if b.quick else PAIRS, "control")
    keyed = []
    for _ in range(b.scale.runs):
        keyed.append(_noop_drain(s, "keyed", KEYED, n_keyed))
        print(f"[bench] control keyed: {keyed[-1]:,.0f} jobs/s", flush=True)
    enqueue: dict[str, list[float]] = {kind: [] for kind in ENQUEUES}
    latency: dict[str, list[list[float]]] = {kind: [] for kind in ENQUEUES}
    m = b.scale.awaited_n
    for run in range(b.scale.runs):
        for kind in rotated(ENQUEUES, run):
            run_async(_sql(s, "TRUNCATE stream_jobs_outbox, stream_jobs_unique, "
                              "stream_jobs_debounce"), 60)
            rate, calls = run_async(_awaited(s, kind, m, run), 600)
            enqueue[kind].append(rate)
            latency[kind].append(calls)
            print(f"[bench] control enqueue {kind}: {rate:,.0f} jobs/s", flush=True)
    _record(b, (n, n_keyed, m), noop, keyed, enqueue, latency)


def _record(b: Bench, sizes: tuple[int, int, int], noop: Interleaved, keyed: list[float],
            enqueue: dict[str, list[float]], latency: dict[str, list[list[float]]]) -> None:
    n, n_keyed, m = sizes
    r = b.results
    note = (f"{n:,} jobs backlog, concurrency 64, ordering=key; "
            f"{len(noop.values['off'])} interleaved rounds")
    for kind, name, label, extra in (
            ("off", "noop_off", "no-op, cancel watch off (STREAM_JOBS_CANCEL_WATCH=false)", ""),
            ("on", "noop_on", "no-op, cancel watch on, nothing cancelled (the default)", ""),
            ("on_cancels", "noop_cancels", f"no-op, {CANCELLED_IDS:,} other job IDs cancelled",
             "; every job looked up in the set")):
        r.add(f"control.{name}", label, "jobs/s", noop.values[kind], note + extra,
              loads=noop.loads[kind])
    r.add("control.noop_keyed", "no-op, every job holding a unique key (given back after it)",
          "jobs/s", keyed, f"{n_keyed:,} jobs backlog, concurrency 64, ordering=key; one "
          "statement per job")
    for kind, label in (("plain", "enqueue, awaited (plain)"),
                        ("unique", "unique enqueue, awaited (a fresh key each)"),
                        ("debounce", "debounced enqueue, awaited (a fresh key each)")):
        r.add(f"control.{kind}", label, "jobs/s", enqueue[kind],
              f"{m:,} calls" + ("" if kind == "plain" else ", to the outbox commit"))
        r.add(f"control.{kind}_p50", f"{label}: latency p50", "ms",
              [percentile(calls, 50) for calls in latency[kind]])
        r.add(f"control.{kind}_p99", f"{label}: latency p99", "ms",
              [percentile(calls, 99) for calls in latency[kind]])


RATIOS = [
    ("no-op, cancels on / off", "control.noop_on", "control.noop_off"),
    ("no-op, 10,000 IDs cancelled / off", "control.noop_cancels", "control.noop_off"),
    ("no-op, jobs holding unique keys / plain jobs (cancels on)", "control.noop_keyed",
     "control.noop_on"),
    ("unique enqueue / plain enqueue (awaited)", "control.unique", "control.plain"),
    ("debounced enqueue / plain enqueue (awaited)", "control.debounce", "control.plain"),
]


__all__ = ["GOALS", "HEADING", "INTRO", "PREFIX", "RATIOS", "control"]
