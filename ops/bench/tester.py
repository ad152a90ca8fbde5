"""Handler tests in memory (`JobTester`) beside the same work on the real stack
(`BENCH_ONLY=tester`).

- **A handler test**: the tour's three jobs (one succeeds, one fails its first attempt and
  is retried through a 1 s tier, one is refused with `PermanentError`), from the first
  enqueue to the drain returning: `JobTester` (opened and closed in the time, the retry's
  second passed on the virtual clock) against a real worker run with
  `Worker.run(until_idle=True)` on the stack, which waits out the tier and joins its groups.
- **Many jobs**: a no-op handler over a backlog, first handler call to last, in memory
  and on the stack (`ours.drain`, the processing section's method): a test that enqueues
  thousands of jobs must not be slower than the stack it stands in for.
"""

from __future__ import annotations

import time
from typing import Any

from ops.bench.backlog import ENQUEUE_BATCH, fill, payload, rewind_worker_group
from ops.bench.common import Bench, BenchError, Tally, rotated, run_async
from ops.bench.ours import drain
from stream_jobs import App, JobContext, PermanentError
from stream_jobs.client import Job
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.settings import Settings
from stream_jobs.testing import JobTester

HEADING = "Handler tests in memory"
# The section's opening sentence and the figures' prefix (ops/bench/report/ renders it).
INTRO = ("`JobTester` runs the real worker and relay on an in-memory broker, on virtual "
         "time; measured side by side with the same work on the real stack in one run "
         "(ops/bench/tester.py says how).")
PREFIX = "tester."
TOUR, NOOP = "bench.tester-tour", "bench.tester-noop"
GOALS = [  # (text, numerator or figure, denominator or None, op, target, unit)
    ("a handler test with a retry: the real stack takes >= 20x as long as in memory",
     "tester.tour_stack", "tester.tour_memory", ">=", 20.0, "x"),
    ("the same test in memory <= 200 ms", "tester.tour_memory", None, "<=", 200.0, "ms"),
    ("no-op jobs in memory >= 1x a real worker on the stack", "tester.noop_memory",
     "tester.noop_stack", ">=", 1.0, "x"),
]
RATIOS: list[tuple[str, str, str]] = []  # none side by side beyond the goals
_TOUR_JOBS = [{"kind": "ok"}, {"kind": "flaky"}, {"kind": "refused"}]


def tour_app(settings: Settings) -> App:
    app = App(settings)

    @app.job(TOUR)
    async def tour(job: dict[str, Any], ctx: JobContext) -> None:
        if job["kind"] == "refused":
            raise PermanentError("no such address")
        if job["kind"] == "flaky" and ctx.attempt == 1:
            raise RuntimeError("mail server busy")

    return app


def _check(outcomes: dict[str, int], where: str) -> None:
    if outcomes != {"succeeded": 2, "retried": 1, "dead_lettered": 1}:
        raise BenchError(f"the tour test {where} ended with {outcomes}")


async def tour_in_memory(settings: Settings, policy: JobTypePolicy) -> float:
    """The tour test through JobTester: ms from opening it to the drain returning."""
    began = time.perf_counter()
    async with JobTester(tour_app(settings), types={TOUR: policy}) as t:
        for job in _TOUR_JOBS:
            await t.enqueue(TOUR, job)
        await t.run_until_idle()
        _check(dict(t.outcomes), "in memory")
    return (time.perf_counter() - began) * 1000


async def tour_on_the_stack(settings: Settings) -> float:
    """The tour test with a real worker: ms from the first enqueue to the drain returning."""
    app = tour_app(settings)
    began = time.perf_counter()
    async with app.client() as client:
        for job in _TOUR_JOBS:
            await client.enqueue(TOUR, job)
    worker = app.worker(TOUR)
    await worker.run(until_idle=True)
    _check({str(k): v for k, v in worker.outcomes.items()}, "on the stack")
    return (time.perf_counter() - began) * 1000


async def noop_in_memory(settings: Settings, policy: JobTypePolicy, n: int) -> float:
    """Jobs/s of a no-op handler under JobTester, first handler call to last."""
    app = App(settings)
    tally = Tally()

    @app.job(NOOP)
    async def noop(job: dict[str, Any], ctx: JobContext) -> None:
        tally.hit()

    async with JobTester(app, types={NOOP: policy}) as t:
        for start in range(0, n, ENQUEUE_BATCH):
            await t.enqueue_many([Job(NOOP, payload(i))
                                  for i in range(start, min(n, start + ENQUEUE_BATCH))])
        await t.run_until_idle()
    if tally.count != n:
        raise BenchError(f"{NOOP}: {tally.count} handler calls for {n} jobs in memory")
    return tally.rate()


def tester(b: Bench) -> None:
    s = b.settings()
    tour_policy = run_async(b.declare(TOUR, retry_tiers=["1s"], max_attempts=3), 60)
    noop_policy = run_async(b.declare(NOOP), 60)
    n = max(1_000, b.scale.backlog_n // 5)
    b.results.details["tester_fill_jobs_per_s"] = run_async(fill(s, NOOP, n), 600)
    tour: dict[str, list[float]] = {"memory": [], "stack": []}
    noop: dict[str, list[float]] = {"memory": [], "stack": []}
    run_async(tour_on_the_stack(s), 120)  # warm-up: the groups, the topics' metadata
    for run in range(b.scale.runs):
        for kind in rotated(["memory", "stack"], run):
            if kind == "memory":
                tour[kind].append(run_async(tour_in_memory(s, tour_policy), 120))
                noop[kind].append(run_async(noop_in_memory(s, noop_policy, n), 600))
            else:
                tour[kind].append(run_async(tour_on_the_stack(s), 120))
                noop[kind].append(run_async(drain(s, NOOP, n), 600)["rate"])
                run_async(rewind_worker_group(s, NOOP), 60)
    r = b.results
    note = "3 jobs: a success, a retry through a 1 s tier, a PermanentError"
    r.add("tester.tour_memory", "tour test, JobTester (open to close)", "ms", tour["memory"],
          note)
    r.add("tester.tour_stack", "tour test, a real worker (enqueue to until_idle)", "ms",
          tour["stack"], note)
    r.add("tester.noop_memory", "no-op jobs, JobTester", "jobs/s", noop["memory"],
          f"{n:,} jobs, first handler call to last")
    r.add("tester.noop_stack", "no-op jobs, a real worker (beside JobTester)", "jobs/s",
          noop["stack"], f"{n:,} jobs backlog, ordering=key, concurrency 64")


__all__ = ["GOALS", "HEADING", "INTRO", "PREFIX", "RATIOS", "tester"]
