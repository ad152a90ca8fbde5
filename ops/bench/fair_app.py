"""The app the fairness section's worker processes load (ops/bench/fairness.py):
`stream-jobs worker ops.bench.fair_app:app --type bench.fair-on --processes 2`.

One handler for every type of the section: it sleeps `hold_ms` of its payload (2 ms in the
noisy-neighbour run) and stamps the job. A stamp is (tenant index, enqueued, started,
ended), unix seconds, written with one `os.write` per job to `<BENCH_FAIR_STAMPS>/<pid>.bin`
as the job ends, so the bench can count the jobs done while the workers still run and
every process of `--processes N` has a file of its own (one clock for all: `time.time()`).
The tenant travels in the payload too (`t`, its index), so the stamp does not depend on
how the runtime hands the tenant to a handler.
"""

from __future__ import annotations

import asyncio
import os
import struct
import time
from pathlib import Path
from typing import Any

from stream_jobs.app import App
from stream_jobs.context import JobContext

FAIR_ON = "bench.fair-on"
FAIR_OFF = "bench.fair-off"
FAIR_LIMIT = "bench.fair-limit"
STAMPS_ENV = "BENCH_FAIR_STAMPS"
STAMP = struct.Struct("<iddd")

app = App()


class _StampFile:
    """This process's stamp file, opened at its first job (after any fork)."""

    def __init__(self, folder: str | None) -> None:
        self.folder = folder
        self.fd: int | None = None
        self.pid = 0

    def write(self, tenant: int, enqueued: float, started: float, ended: float) -> None:
        if self.folder is None:
            return
        if self.fd is None or self.pid != os.getpid():
            self.pid = os.getpid()
            self.fd = os.open(os.path.join(self.folder, f"{self.pid}.bin"),
                              os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(self.fd, STAMP.pack(tenant, enqueued, started, ended))


_stamps = _StampFile(os.environ.get(STAMPS_ENV))


async def _hold_and_stamp(job: dict[str, Any], ctx: JobContext) -> None:
    started = time.time()
    await asyncio.sleep(job["hold_ms"] / 1000)
    _stamps.write(job["t"], ctx.enqueued_at_ms / 1000, started, time.time())


for _type in (FAIR_ON, FAIR_OFF, FAIR_LIMIT):
    app.job(_type)(_hold_and_stamp)


def read_stamps(folder: Path) -> list[tuple[int, float, float, float]]:
    """Every stamp of every process's file in `folder` (a torn last one left out)."""
    found: list[tuple[int, float, float, float]] = []
    for path in sorted(folder.glob("*.bin")):
        raw = path.read_bytes()
        whole = len(raw) - len(raw) % STAMP.size
        found += [STAMP.unpack_from(raw, at) for at in range(0, whole, STAMP.size)]
    return found


def stamps_done(folder: Path) -> int:
    """How many jobs the processes have stamped so far."""
    return sum(path.stat().st_size // STAMP.size for path in folder.glob("*.bin"))
