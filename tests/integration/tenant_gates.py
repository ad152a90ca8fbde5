"""A worker process's share of the per-tenant limit tests: one `TenantGate` asked by many
concurrent loops, as a dispatcher would, in a process of its own (settings from the
environment, `cli_env.settings_env`).

    python -m tests.integration.tenant_gates MODE --out FILE [options]

MODE `hold`: each loop asks, holds the slot `--hold-ms`, releases, for `--seconds`; FILE
gets every hold's (start, end) in monotonic ns (the clock every process on the box shares),
taken inside the grant, so overlaps counted from them never exceed what Postgres granted.
MODE `rate`: each loop asks as often as it is allowed; FILE gets, for every grant, when the
granting ask was sent and when its answer came (Postgres granted it in between).
MODE `keep`: takes `--keep` slots, prints "held N" and waits to be killed.
Loops start at the wall-clock second `--start-at`, so slow process starts do not matter.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

from stream_jobs.fairness.gate import TenantGate
from stream_jobs.settings import Settings
from stream_jobs.tenants import FairnessSpec


async def _granted(gate: TenantGate, tenant: str) -> None:
    while True:
        wait_s = await gate.acquire(tenant)
        if wait_s is None:
            return
        await asyncio.sleep(wait_s)  # the gate's own answer: when asking again is worth it


async def _holds(gate: TenantGate, tenant: str, until: float, hold_s: float,
                 out: list[tuple[int, int]]) -> None:
    while time.monotonic() < until:
        await _granted(gate, tenant)
        start = time.monotonic_ns()
        await asyncio.sleep(hold_s * random.uniform(0.5, 1.5))  # the job's work
        out.append((start, time.monotonic_ns()))
        await gate.release(tenant)


async def _grants(gate: TenantGate, tenant: str, until: float,
                  out: list[tuple[int, int]]) -> None:
    while time.monotonic() < until:
        while True:
            asked = time.monotonic_ns()
            wait_s = await gate.acquire(tenant)
            if wait_s is None:
                break
            await asyncio.sleep(wait_s)
        out.append((asked, time.monotonic_ns()))


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["hold", "rate", "keep"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--job-type", default="tenant.work")
    parser.add_argument("--tenant", default="acme")
    parser.add_argument("--concurrency", type=int)
    parser.add_argument("--rate", type=float)
    parser.add_argument("--loops", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--hold-ms", type=float, default=20.0)
    parser.add_argument("--keep", type=int, default=1)
    parser.add_argument("--ttl", type=float, default=10.0)
    parser.add_argument("--start-at", type=float, default=0.0)
    args = parser.parse_args(argv)
    spec = FairnessSpec(tenant_concurrency=args.concurrency, tenant_rate_per_s=args.rate)
    gate = TenantGate(Settings(), args.job_type, spec, f"{args.mode}-{args.out.stem}",
                      lease_ttl_s=args.ttl)
    await gate.start()
    try:
        if args.mode == "keep":
            for _ in range(args.keep):
                await _granted(gate, args.tenant)
            print(f"held {args.keep}", flush=True)
            await asyncio.Event().wait()  # until killed
        await asyncio.sleep(max(0.0, args.start_at - time.time()))  # the agreed start
        until = time.monotonic() + args.seconds
        if args.mode == "hold":
            holds: list[tuple[int, int]] = []
            await asyncio.gather(*(_holds(gate, args.tenant, until, args.hold_ms / 1000, holds)
                                   for _ in range(args.loops)))
            args.out.write_text(json.dumps(holds))
        else:
            grants: list[tuple[int, int]] = []
            await asyncio.gather(*(_grants(gate, args.tenant, until, grants)
                                   for _ in range(args.loops)))
            args.out.write_text(json.dumps(grants))
    finally:
        await gate.stop()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
