"""Retry-tier accuracy: how late a job's retry runs against its 5 s tier, with a cold
worker (its first failures are its producer's first writes to the tier) and a warm one."""

from __future__ import annotations

import asyncio
import time
from typing import Any, TypedDict

from ops.bench.backlog import fill
from ops.bench.common import Bench, BenchError, percentile, rotated, run_async
from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.settings import Settings


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
