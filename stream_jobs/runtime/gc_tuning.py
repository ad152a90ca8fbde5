"""The garbage collector while a worker runs: start-up heap frozen, young generation larger.

Reference counting frees nearly every object a job makes the moment the job is done; the
cyclic collector is only for cycles. CPython runs it on the young generation after every
700 net new container objects, and a worker keeps many jobs' objects alive at once: the
fetched records, and with `ctx.once_deferred()` hundreds of jobs suspended until their
batch commits. At 700, a collection finds most young objects still alive and promotes
them, and the older generations' collections walk them again and again: measured, a
quarter of a deferred worker's CPU (`ops/bench/`), and nothing for a no-op worker. So
while any worker of the process runs, the young threshold is `YOUNG_THRESHOLD`
(`STREAM_JOBS_WORKER_GC_YOUNG_THRESHOLD`), more than the objects in flight; the older
thresholds are kept. Cyclic garbage waits a little longer for its collection (at most
that many objects). A handler that keeps many objects of its own alive sees fewer but
longer young collections (about 1 ms per 1,000 live young objects); 700 restores
CPython's default, 0 leaves the thresholds alone.

Start-up survivors (modules, the app, the clients) are frozen out of the collector's
reach too, so a full collection does not walk that whole heap, stopping the loop for tens
of milliseconds under load; they are still freed by reference counting.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from stream_jobs.settings import YOUNG_THRESHOLD


class _Tuning:
    """The thresholds to restore, while at least one worker runs."""

    def __init__(self) -> None:
        self.running = 0
        self.saved: tuple[int, int, int] = gc.get_threshold()


_tuning = _Tuning()


@contextmanager
def worker_collector(young_threshold: int = YOUNG_THRESHOLD) -> Iterator[None]:
    """Around a worker's loop: freeze what exists, raise the young threshold to
    `young_threshold` (never lower one the application set higher; 0: leave it), and
    restore the thresholds when the last worker of the process stops."""
    gc.collect()
    gc.freeze()
    if _tuning.running == 0:
        _tuning.saved = gc.get_threshold()
        young, *older = _tuning.saved
        if young_threshold:
            gc.set_threshold(max(young, young_threshold), *older)
    _tuning.running += 1
    try:
        yield
    finally:
        _tuning.running -= 1
        if _tuning.running == 0:
            gc.set_threshold(*_tuning.saved)
