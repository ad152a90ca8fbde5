"""Shared by the peer apps (Celery, Dramatiq); runs in the peers' venv, never in ours.

Counting no-op task runs must not add a broker round trip per task, so each worker
process (or prefork child) counts in memory and stamps its first and last task, and a
daemon thread writes those three numbers to a Redis hash every 100 ms. `wait` sums the
hash until every task has run and prints the rate from the first task to the last.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6390/0")
QUEUE = os.environ.get("BENCH_QUEUE", "bench")
TALLY_KEY = f"{QUEUE}:tally"
FLUSH_S = 0.1
MAX_FLUSHES = 36_000  # one hour; the bench stops workers long before
PAYLOAD_BYTES = 200


class _Counter:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0
        self.first = 0.0
        self.last = 0.0
        self.flusher_pid = 0


_counter = _Counter()


def tally() -> None:
    """Count one task run (called by the no-op task)."""
    now = time.time()
    with _counter.lock:
        if _counter.count == 0:
            _counter.first = now
        _counter.count += 1
        _counter.last = now
        if _counter.flusher_pid != os.getpid():
            _counter.flusher_pid = os.getpid()
            threading.Thread(target=_flush_forever, name="bench-tally", daemon=True).start()


def _flush_forever() -> None:
    client = redis.Redis.from_url(REDIS_URL)
    field = f"{os.getpid()}"
    for _ in range(MAX_FLUSHES):
        time.sleep(FLUSH_S)
        with _counter.lock:
            text = f"{_counter.count} {_counter.first:.6f} {_counter.last:.6f}"
        client.hset(TALLY_KEY, field, text)


def payload(i: int) -> dict[str, Any]:
    """The same ~200-byte job as the stream-jobs runs use."""
    bare = len(json.dumps({"user": "user-00000000", "n": 0, "note": ""}, separators=(",", ":")))
    return {"user": f"user-{i:08d}", "n": i, "note": "x" * (PAYLOAD_BYTES - bare - 3)}


def timed_enqueue(send: Callable[[dict[str, Any]], object], n: int) -> dict[str, float]:
    """Call `send` n times one by one; the rate and the per-call latency percentiles."""
    latencies: list[float] = []
    began = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter()
        send(payload(i))
        latencies.append((time.perf_counter() - t0) * 1000)
    elapsed = time.perf_counter() - began
    latencies.sort()
    return {"rate": n / elapsed, "p50_ms": latencies[len(latencies) // 2],
            "p99_ms": latencies[min(len(latencies) - 1, len(latencies) * 99 // 100)]}


def wait(n: int, timeout_s: float) -> dict[str, float]:
    """Block until the workers have run `n` tasks; the rate from the first to the last."""
    client = redis.Redis.from_url(REDIS_URL)
    deadline = time.monotonic() + timeout_s
    while True:
        rows = [v.decode().split() for v in client.hgetall(TALLY_KEY).values()]
        count = sum(int(r[0]) for r in rows)
        if count >= n:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"only {count} of {n} tasks ran within {timeout_s:.0f} s")
        time.sleep(0.2)
    first = min(float(r[1]) for r in rows if int(r[0]))
    last = max(float(r[2]) for r in rows if int(r[0]))
    return {"count": count, "rate": (count - 1) / (last - first), "first": first, "last": last,
            "processes": len(rows)}


def enqueue_main(peer: str, send: Callable[[dict[str, Any]], object]) -> None:
    """A peer module's command line, `enqueue --n N`: one task to warm the connections
    (counted by the bench), then N - 1 timed, the figures printed as JSON."""
    parser = argparse.ArgumentParser(description=f"Enqueue {peer} no-op tasks.")
    parser.add_argument("command", choices=["enqueue"])
    parser.add_argument("--n", type=int, required=True)
    args = parser.parse_args()
    send({"warm": True})
    print(json.dumps(timed_enqueue(send, args.n - 1)))


def main() -> None:
    parser = argparse.ArgumentParser(description="Wait for the peers' tally.")
    parser.add_argument("command", choices=["wait"])
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    print(json.dumps(wait(args.n, args.timeout)))


if __name__ == "__main__":
    main()
