"""A paced producer for the latency bench (run as its own process).

Offers `--rate` jobs per second for `--seconds`: every 2 ms, the jobs due since the last
tick go out as one `enqueue_many`, none waiting for another. Settings come from the
`STREAM_JOBS_*` environment. Prints "<jobs sent> <achieved rate> <unix time of start>".
"""

from __future__ import annotations

import argparse
import asyncio
import time

from ops.bench.backlog import payload
from ops.bench.common import run_async
from stream_jobs.app import App
from stream_jobs.client import Job

TICK_S = 0.002
MAX_PENDING_BATCHES = 2_000


async def pace(job_type: str, rate: float, seconds: float) -> tuple[int, float, float]:
    """Offer `rate` jobs/s for `seconds`; (jobs sent, rate achieved, unix time of start).

    Each tick enqueues the jobs that came due since the last one as one `enqueue_many`
    task, not awaited by the loop. If the box cannot keep up, the pacer waits for earlier
    batches (so the achieved rate, which is reported, falls short) instead of queueing
    without bound; it stops offering at the deadline.
    """
    async with App().client() as client:
        await client.enqueue(job_type, payload(0))  # metadata and connections warm
        total = int(rate * seconds)
        pending: set[asyncio.Task[list[str]]] = set()
        # Failures only: finished batches are not kept, so the pacer's heap (and its
        # collector's work) stays flat over the run.
        failures: list[BaseException] = []
        batches = 0

        def finished(task: asyncio.Task[list[str]]) -> None:
            pending.discard(task)
            error = None if task.cancelled() else task.exception()
            if error is not None:
                failures.append(error)

        sent = 0
        began = time.time()
        t0 = time.perf_counter()
        deadline = t0 + seconds * 2 + 10
        now = t0
        while sent < total and now < deadline:
            due = min(total, int((now - t0) * rate)) - sent
            if due > 0:
                batch = [Job(job_type, payload(sent + i)) for i in range(due)]
                task = asyncio.create_task(client.enqueue_many(batch))
                pending.add(task)
                task.add_done_callback(finished)
                batches += 1
                sent += due
            if len(pending) > MAX_PENDING_BATCHES:
                await asyncio.wait(set(pending), return_when=asyncio.FIRST_COMPLETED)
            await asyncio.sleep(TICK_S)
            now = time.perf_counter()
        achieved = sent / (now - t0)
        if pending:
            await asyncio.wait_for(asyncio.wait(set(pending)), 120)
        await asyncio.sleep(0)  # the last done callbacks
        if failures:
            raise RuntimeError(f"{len(failures)} of {batches} enqueue batches failed; the "
                               f"first: {failures[0]!r}")
    return sent + 1, achieved, began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--type", required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args()
    sent, achieved, began = run_async(pace(args.type, args.rate, args.seconds),
                                      args.seconds * 3 + 200)
    print(sent, f"{achieved:.1f}", f"{began:.6f}")


if __name__ == "__main__":
    main()
