"""What results and batches cost (`BENCH_ONLY=results`), side by side on one backlog.

- **Unused**: the operations the feature adds to every job's path when a type keeps no
  results and the job is in no batch (the finish check, the context's field, the
  workflow header's lookup in the decoder), timed in a tight loop and set against the time
  one no-op job takes at the no-op rate measured here. The goal is that it is lost in the
  noise (<= 3%); a drain-against-drain comparison could not see 3% on this shared box.
- **Used**: the same backlog drained by four handlers in a rotated order: a no-op; a
  no-op of a type with `keep_result` (the dedup row and a result row per job, by
  deferred batches); one insert through `ctx.once_deferred()` (the dedup row and one row
  per job: the yardstick of an exactly-once write); and, on a backlog of batch members
  (made by `client.batch`, moved by the outbox relay), a no-op whose finish moves the
  batch's counters (the dedup row, the member's result row and an UPDATE of the batch's
  row per job, `on_complete` written by the last). Between drains the worker group is
  rewound and the tables emptied, so each drain does the same work.

Each run checks its own work: one result row per job, the batch's counters equal to its
members, and the callback written once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import asyncpg

from ops.bench.backlog import fill, payload, rewind_worker_group
from ops.bench.common import Bench, BenchError, Tally, rotated, run_async
from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.context import JobContext
from stream_jobs.dedup.store import DedupStore
from stream_jobs.outbox.relay import OutboxRelay
from stream_jobs.record import HEADER_WORKFLOW, JobRecord, decode_record
from stream_jobs.results.finish import Finisher
from stream_jobs.results.store import FinishRows
from stream_jobs.settings import Settings

HEADING = "Results and batches"
# The section's opening sentence and the figures' prefix (ops/bench/report/ renders it).
INTRO = ("What `keep_result` and batch membership cost, unused and used, side by side on "
         "one backlog in one run (ops/bench/results.py says how).")
PREFIX = "results."
PLAIN, MEMBERS, CALLBACK = "bench.results", "bench.members", "bench.members-done"
TABLE = "bench_results_rows"
CONTENDERS = ["noop", "kept", "deferred", "member"]
LOOP_N = 200_000
GOALS = [  # (text, numerator or figure, denominator or None, op, target, unit)
    ("unused: the work added to a no-op job <= 3% of it", "results.unused_pct", None, "<=",
     3.0, "%"),
    ("a kept result per job >= 0.7x one insert through ctx.once_deferred()",
     "results.kept", "results.deferred", ">=", 0.7, "x"),
    ("a batch member's counter update per job >= 0.5x one insert through "
     "ctx.once_deferred()", "results.member", "results.deferred", ">=", 0.5, "x"),
]


async def _sql(settings: Settings, statement: str, *args: Any) -> Any:
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    try:
        return await conn.fetchval(statement, *args)
    finally:
        await conn.close()


def _handler(kind: str, tally: Tally) -> Callable[..., Any]:
    if kind == "deferred":
        async def deferred(job: dict[str, Any], ctx: JobContext) -> None:
            async with ctx.once_deferred() as writes:
                await writes.execute(f"INSERT INTO {TABLE} (job_id) VALUES ($1)", ctx.job_id)
            tally.hit()
        return deferred

    async def noop(job: dict[str, Any], ctx: JobContext) -> int:
        tally.hit()
        return 1  # kept by "kept", dropped by the others
    return noop


async def _drain(settings: Settings, kind: str, n: int, batch_id: str) -> float:
    """One drain by contender `kind`; its rate (first handler call to the last)."""
    app = App(settings)
    tally = Tally()
    job_type = MEMBERS if kind == "member" else PLAIN
    app.job(job_type, keep_result="1h" if kind == "kept" else None)(_handler(kind, tally))
    await asyncio.wait_for(app.worker(job_type).run(until_idle=True), 900)
    if tally.count != n:
        raise BenchError(f"results ({kind}): {tally.count} handler calls for {n} jobs")
    rows = int(await _sql(settings, "SELECT count(*) FROM stream_jobs_results"))
    if rows != (n if kind in ("kept", "member") else 0):
        raise BenchError(f"results ({kind}): {rows} result rows for {n} jobs")
    if kind == "member":
        done = await _sql(settings, "SELECT succeeded FROM stream_jobs_workflows "
                                    "WHERE workflow_id = $1", batch_id)
        written = int(await _sql(settings, "SELECT count(*) FROM stream_jobs_outbox"))
        if done != n or written != 1:
            raise BenchError(f"results (member): the batch counted {done} of {n}, "
                             f"{written} callbacks written")
    return tally.rate()


async def _reset(settings: Settings, batch_id: str) -> None:
    """Empty what a drain wrote, so the next drain of the same backlog does the same."""
    await _sql(settings, f"TRUNCATE {TABLE}, stream_jobs_done, stream_jobs_results, "
                         "stream_jobs_outbox")
    await _sql(settings, "UPDATE stream_jobs_workflows SET succeeded = 0, failed = 0, "
                         "finished_at = NULL WHERE workflow_id = $1", batch_id)


async def _members(settings: Settings, n: int) -> str:
    """A batch of `n` members on MEMBERS, moved to Kafka by a relay; the batch's ID."""
    client = App(settings).client()
    batch_id = await client.batch([Job(MEMBERS, payload(i)) for i in range(n)],
                                  on_complete=Job(CALLBACK, {"n": 0}))
    async with OutboxRelay(settings) as relay:
        moved = await relay.drain()
    if moved != n:
        raise BenchError(f"results: the relay moved {moved} of {n} members")
    return batch_id


def unused_cost_us(settings: Settings) -> float:
    """Microseconds the feature adds to a job that uses none of it (see the docstring)."""
    finisher = Finisher.of(FinishRows(DedupStore(settings)), settings, PLAIN, None)
    record = JobRecord(job_id="01a2265a-9f17-7019-a966-4a00c51fb752", job_type=PLAIN,
                       payload=b"{}", key=b"k", enqueued_at_ms=1)
    job = decode_record(key=record.key, value=record.payload, headers=record.headers(),
                        expected_type=PLAIN, max_payload_bytes=1024)
    found = {name: value for name, value in record.headers()}

    class Slots:
        __slots__ = ("_finish",)
        _finish: object

    ctx = Slots()
    began = time.perf_counter()
    for _ in range(LOOP_N):
        finish = finisher.finish_for(job)  # the worker's test
        ctx._finish = finish  # the context's field
        if finish is None and HEADER_WORKFLOW in found:  # the decoder's lookup
            raise BenchError("a plain job looked like a member")
    return (time.perf_counter() - began) / LOOP_N * 1e6


def results(b: Bench) -> None:
    s = b.settings()
    n = b.scale.backlog_n // 4
    for job_type in (PLAIN, MEMBERS, CALLBACK):
        run_async(b.declare(job_type), 60)
    run_async(_sql(s, f"CREATE TABLE IF NOT EXISTS {TABLE} (job_id text NOT NULL)"), 60)
    run_async(fill(s, PLAIN, n), 600)
    batch_id = run_async(_members(s, n), 900)
    rates: dict[str, list[float]] = {kind: [] for kind in CONTENDERS}
    for run in range(b.scale.runs):
        for kind in rotated(CONTENDERS, run):
            run_async(_reset(s, batch_id), 60)
            t0 = time.monotonic()
            rates[kind].append(run_async(_drain(s, kind, n, batch_id), 960))
            print(f"[bench] results {kind}: {rates[kind][-1]:,.0f} jobs/s "
                  f"({time.monotonic() - t0:.0f} s)", flush=True)
            run_async(rewind_worker_group(s, MEMBERS if kind == "member" else PLAIN), 60)
    added = [unused_cost_us(s) for _ in range(b.scale.runs)]
    per_job = [1e6 / rate for rate in rates["noop"]]
    note = f"{n:,} jobs backlog, concurrency 64, ordering=key"
    r = b.results
    r.add("results.noop", "no-op, a type without keep_result (results section)", "jobs/s",
          rates["noop"], note)
    r.add("results.kept", "no-op returning a kept result (keep_result, no once)", "jobs/s",
          rates["kept"], f"{note}; a dedup row and a result row per job")
    r.add("results.deferred", "one insert through ctx.once_deferred(), for reference",
          "jobs/s", rates["deferred"], f"{note}; a dedup row and one row per job")
    r.add("results.member", "no-op batch member: its finish moves the batch's counters",
          "jobs/s", rates["member"], f"{note}; one batch of {n:,}, on_complete once")
    r.add("results.unused_us", "work the feature adds to a job that uses none of it", "us",
          added, f"timed in a loop of {LOOP_N:,}")
    r.add("results.unused_pct", "the same, as a share of a no-op job at the rate above", "%",
          [100 * a / p for a, p in zip(added, per_job, strict=True)],
          "added us / (1e6 / no-op jobs/s), run by run")




# Each of the two against each baseline: kept result / no-op, kept result / one insert
# through ctx.once_deferred(), then the batch member's two.
RATIOS = [(f"{what} / {against}", f"results.{num}", f"results.{den}")
          for what, num in (("kept result", "kept"), ("batch member", "member"))
          for against, den in (("no-op", "noop"),
                               ("one insert through ctx.once_deferred()", "deferred"))]


__all__ = ["GOALS", "HEADING", "INTRO", "PREFIX", "RATIOS", "results", "unused_cost_us"]
