"""End-to-end latency: from `enqueue` to the handler's start, with a worker running and a
paced producer process offering a rate; the end-to-end capacity (what producer, broker and
worker carry together) searched first, the goals judged at half of it and at 80% of it."""

from __future__ import annotations

import asyncio
import subprocess
import time
from array import array
from typing import Any, TypedDict

from ops.bench.common import Bench, BenchError, percentile, rotated, run_async
from ops.bench.snapshot import CODE_DIR, PROJECT_PYTHON
from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.runtime.worker import Worker


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


async def _assigned(worker: Worker, running: asyncio.Task[None]) -> None:
    """Return once the worker has joined and holds its partitions (30 s at most)."""
    for _ in range(300):
        if len(worker.consumer.assignment()) >= 1 and worker.partitions:
            return
        if running.done():
            await running
        await asyncio.sleep(0.1)  # a poll interval
    raise BenchError("the latency worker was not assigned its partitions in 30 s")


async def _pace(b: Bench, job_type: str, rate: float, seconds: float) -> tuple[int, float, float]:
    """Offer `rate` jobs/s for `seconds` from a pacer process (ops/bench/pacer.py): (jobs
    sent, the rate it achieved, when it began)."""
    pacer = await asyncio.create_subprocess_exec(
        str(PROJECT_PYTHON), "-m", "ops.bench.pacer", "--type", job_type,
        "--rate", f"{rate:.1f}", "--seconds", f"{seconds:.1f}",
        cwd=CODE_DIR, env=b.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(pacer.communicate(), seconds + 120)
    if pacer.returncode != 0:
        text = err.decode(errors="replace")
        raise BenchError(f"the pacer failed: {text[:400]} ... {text[-600:]}")
    sent_text, achieved_text, began_text = out.decode().split()[:3]
    return int(sent_text), float(achieved_text), float(began_text)


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
        await _assigned(worker, running)
        await asyncio.sleep(1.0)  # first fetches in flight before the pacer starts
        expected, achieved, began = await _pace(b, job_type, rate, seconds)
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
    """p50/p99 at half the end-to-end capacity and at 80% of it (the goals), and at a
    quarter of it.

    The end-to-end capacity is searched first (`_capacity_search`). On 2 shared cores the
    producer process costs about as much CPU per job as the worker, so half the worker's
    drain rate alone (the measure of earlier runs, retired) is close to what the box
    carries at all: a rate it cannot offer with room to spare."""
    drain = b.results.figures["ours.noop_key"].median
    capacity, steps = _capacity_search(b, drain)
    # name: (rate, figure-name suffix, "at ..." in the label, what the rate is)
    loads = {
        "half": (capacity * 0.5, "", "half capacity", "half of the end-to-end capacity"),
        "quarter": (capacity * 0.25, "_quarter", "quarter capacity",
                    "a quarter of the end-to-end capacity"),
        "80pct": (capacity * 0.8, "_80", "80% of capacity",
                  "80% of the end-to-end capacity"),
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

