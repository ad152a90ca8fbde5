"""A producer process for tests/integration/test_unique.py: unique or debounced enqueues
on a few keys, started together with another one so that the two race on every key.

    python -m tests.apps.keyed_producer TYPE unique|debounce N KEYS WINDOW_S NAME

Settings come from the STREAM_JOBS_* environment. It connects, prints `ready`, waits for
a line on stdin (the test's start signal, sent once every producer is ready), makes N
enqueues (8 at a time) on keys `k0` .. `k{KEYS-1}` in turn, and prints one JSON line per
enqueue: the key, the payload's `n`, the answer's job ID, whether it was sent, what it
superseded and its not-before.
"""

from __future__ import annotations

import asyncio
import sys

import orjson

from stream_jobs.app import App
from stream_jobs.unique.rules import Enqueued

CONCURRENCY = 8


async def main(job_type: str, mode: str, n: int, keys: int, window_s: float,
               name: str) -> None:
    app = App()
    async with app.client() as client:
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        order = asyncio.Semaphore(CONCURRENCY)
        out: list[dict[str, object]] = []

        async def one(i: int) -> None:
            key = f"k{i % keys}"
            payload = {"producer": name, "n": i}
            async with order:
                if mode == "unique":
                    got: Enqueued = await client.enqueue(job_type, payload, unique_key=key,
                                                         unique_for=window_s)
                else:
                    got = await client.enqueue(job_type, payload, key=key, debounce=window_s)
            out.append({"producer": name, "key": key, "n": i, "job_id": str(got),
                        "sent": got.sent,
                        "superseded": got.superseded, "not_before_ms": got.not_before_ms})

        await asyncio.gather(*(one(i) for i in range(n)))
    sys.stdout.write("".join(orjson.dumps(line).decode() + "\n" for line in out))


if __name__ == "__main__":
    job_type, mode, n, keys, window_s, name = sys.argv[1:7]
    asyncio.run(main(job_type, mode, int(n), int(keys), float(window_s), name))
