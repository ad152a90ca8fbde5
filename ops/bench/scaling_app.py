"""The app the scaling run's worker processes load:
`stream-jobs worker ops.bench.scaling_app:app --type bench.scale-noop --until-idle`.

Two handlers, a no-op and an exactly-once one (one effect row through `ctx.once()`, as
the exactly-once section's handler writes). Each process stamps every finished job with
`time.monotonic()` (one clock for every process on Linux) and, when `BENCH_SCALING_STAMPS`
is set, writes the stamps to the file it names when it exits; a child of `--processes N`
writes to that name plus `.<pid>`.
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
    """The stamps a process wrote (the bench side of `_StampFile.write`)."""
    found = array("d")
    found.frombytes(path.read_bytes())
    return found.tolist()


def stamp_files(path: Path) -> list[Path]:
    """The files the children of `stream-jobs worker --processes N` wrote for `path`: each
    child writes `<path>.<pid>` (the supervisor, which runs no job, writes `path` itself)."""
    return sorted(path.parent.glob(f"{path.name}.*"))


class _StampFile:
    """Where this process writes its stamps as it exits: `BENCH_SCALING_STAMPS`, or, in a
    forked worker process of `--processes N` (which runs the exit handlers too), that
    name plus `.<pid>`."""

    def __init__(self, path: Path) -> None:
        self.base = self.path = path

    def forked(self) -> None:
        self.path = self.base.with_name(f"{self.base.name}.{os.getpid()}")

    def write(self) -> None:
        self.path.write_bytes(_stamps.tobytes())


_stamps_file = os.environ.get(STAMPS_ENV)
if _stamps_file:
    _file = _StampFile(Path(_stamps_file))
    atexit.register(_file.write)
    os.register_at_fork(after_in_child=_file.forked)
