"""A paced producer for the latency bench (run as its own process).

Offers `--rate` jobs per second for `--seconds`, each one an `enqueue` of its own, as
many concurrent web requests would, none waiting for another. Settings come from the
`STREAM_JOBS_*` environment. Prints "<jobs sent> <achieved rate> <unix time of start>".
"""

from __future__ import annotations

import argparse
import asyncio
import time

from ops.bench.common import payload, run_async
from stream_jobs.app import App

MAX_PENDING = 50_000


async def pace(job_type: str, rate: float, seconds: float) -> tuple[int, float, float]:
    async with App().client() as client:
        await client.enqueue(job_type, payload(0))  # metadata and connections warm
        total = int(rate * seconds)
        pending: set[asyncio.Task[str]] = set()
        sent = 0
        began = time.time()
        t0 = time.perf_counter()
        deadline = t0 + seconds * 3 + 30
        while sent < total:
            now = time.perf_counter()
            if now > deadline:
                raise RuntimeError(f"the pacer fell behind: {sent} of {total} sent")
            due = min(total, int((now - t0) * rate)) - sent
            for _ in range(due):
                task = asyncio.create_task(client.enqueue(job_type, payload(sent)))
                pending.add(task)
                task.add_done_callback(pending.discard)
                sent += 1
            if len(pending) > MAX_PENDING:
                raise RuntimeError("more than 50,000 enqueues unacknowledged; the broker lags")
            await asyncio.sleep(0.002)
        await asyncio.wait_for(asyncio.gather(*list(pending)), 120)
        achieved = total / (time.perf_counter() - t0)
    return total + 1, achieved, began


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
