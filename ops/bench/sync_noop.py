"""Sync handlers beside async ones: a no-op `def` (run on the worker's thread pool) and a
no-op `async def` drain the same backlog in one run, in a rotated order.

    BENCH_ONLY=sync .venv/bin/python -m ops.bench.run

What the `def` costs on top of the `async def` is the hand-off to a pool thread and back
(a queue put, a thread wake-up, `call_soon_threadsafe`) and the GIL they share; the rest
of the job path is the same code. Both at the default concurrency (64: 64 threads for
the `def`) and ordering=key, as `stream-jobs worker` runs them.
"""

from __future__ import annotations

import threading
from typing import Any

from ops.bench.backlog import new_backlog, rewind_worker_group
from ops.bench.common import Bench, Tally, rotated, run_async
from ops.bench.ours import drain, until_idle
from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.settings import Settings


class ThreadTally(Tally):
    """A `Tally` that pool threads may hit at once."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    def hit(self) -> None:
        with self._lock:
            super().hit()


async def drain_sync(settings: Settings, job_type: str, n: int, *, concurrency: int = 64,
                     timeout_s: float = 900.0) -> dict[str, float]:
    """`ours.drain` for a no-op `def` handler: the rate from the first call to the last,
    the start-up and the idle tail."""
    app = App(settings)
    tally = ThreadTally()

    @app.job(job_type, concurrency=concurrency)
    def noop(job: dict[str, Any], ctx: JobContext) -> None:
        tally.hit()

    return await until_idle(app, job_type, n, tally, timeout_s)


def sync_handlers(b: Bench) -> None:
    s = b.settings()
    job_type = "bench.sync"
    n = b.scale.backlog_n
    b.results.details["sync_fill_jobs_per_s"] = new_backlog(b, job_type, n, 1200)
    rates: dict[str, list[float]] = {"async": [], "sync": []}
    for run in range(b.scale.runs):
        for kind in rotated(["async", "sync"], run):
            if kind == "async":
                result = run_async(drain(s, job_type, n), 960)
            else:
                result = run_async(drain_sync(s, job_type, n), 960)
            rates[kind].append(result["rate"])
            run_async(rewind_worker_group(s, job_type), 60)
    note = f"{n:,} jobs backlog, ordering=key, concurrency 64; the two side by side"
    b.results.add("ours.noop_async_beside_sync", "no-op async def (beside the def)", "jobs/s",
                  rates["async"], note)
    b.results.add("ours.noop_sync", "no-op def on the thread pool (64 threads)", "jobs/s",
                  rates["sync"], note)
