"""The app the scaling run's worker processes load:
`stream-jobs worker ops.bench.scaling_app:app --type bench.scale-noop --until-idle`.

Two handlers, a no-op and an exactly-once one (one effect row through `ctx.once()`, as
the exactly-once section's handler writes). Each process stamps every finished job with
`time.monotonic()` (one clock for every process on Linux) and, when `BENCH_SCALING_STAMPS`
is set, writes the stamps to the file it names when it exits.
"""

from __future__ import annotations

import atexit
import os
import time
from array import array
from pathlib import Path
from typing import Any

from ops.bench.ours import EFFECTS_TABLE
from stream_jobs.app import App
from stream_jobs.context import JobContext

NOOP_TYPE = "bench.scale-noop"
ONCE_TYPE = "bench.scale-once"
STAMPS_ENV = "BENCH_SCALING_STAMPS"

app = App()
_stamps = array("d")


@app.job(NOOP_TYPE)
async def noop(job: dict[str, Any], ctx: JobContext) -> None:
    """Does nothing: what is measured is the workers around it."""
    _stamps.append(time.monotonic())


@app.job(ONCE_TYPE)
async def write_once(job: dict[str, Any], ctx: JobContext) -> None:
    """One effect row, committed with the job's dedup row."""
    async with ctx.once() as conn:
        await conn.execute(f"INSERT INTO {EFFECTS_TABLE} (job_id, n) VALUES ($1, $2)",
                           ctx.job_id, job["n"])
    _stamps.append(time.monotonic())


def read_stamps(path: Path) -> list[float]:
    """The stamps a process wrote (the bench side of `_write_stamps`)."""
    found = array("d")
    found.frombytes(path.read_bytes())
    return found.tolist()


def _write_stamps(path: Path) -> None:
    path.write_bytes(_stamps.tobytes())


_stamps_file = os.environ.get(STAMPS_ENV)
if _stamps_file:
    atexit.register(_write_stamps, Path(_stamps_file))
