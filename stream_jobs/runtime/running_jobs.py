"""The jobs in a worker's handlers now, read from its runners when a report is written.

A runner holds the context of the job whose handler it calls (`Runner.ctx`, set and
cleared around the call for cancels) and the loop time by which that call must end
(`Runner.deadline`, the call's start plus the handler's timeout): so what runs, and since
when, costs the per-job path nothing. A run's start is that deadline less the timeout,
turned from loop time into wall-clock milliseconds.
"""

from __future__ import annotations

import heapq
import math
import os
import socket
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from stream_jobs.runtime.dispatch import PartitionWork, Runner
from stream_jobs.runtime.reports import RUNNING_SHOWN, RunningJob, package_version


def in_handlers(runners: Iterable[Runner], *, timeout_s: float, now_ms: int,
                loop_now_s: float, cap: int = RUNNING_SHOWN
                ) -> tuple[tuple[RunningJob, ...], int]:
    """(the `cap` runs that started first, oldest first; how many runs there are), of the
    runners in a handler call now. `now_ms` and `loop_now_s` are one moment on the wall
    clock and on the loop's clock."""
    runs = []
    for runner in runners:
        ctx = runner.ctx
        if ctx is None or math.isinf(runner.deadline):
            continue
        started_ms = now_ms - round((loop_now_s - (runner.deadline - timeout_s)) * 1000)
        runs.append((min(started_ms, now_ms), ctx))
    oldest = heapq.nsmallest(cap, runs, key=lambda run: run[0])
    return tuple(RunningJob(ctx.job_id, ctx.attempt, ctx.topic, ctx.partition, ctx.offset,
                            started_ms) for started_ms, ctx in oldest), len(runs)


def held_headers(works: Iterable[PartitionWork]) -> Iterator[Sequence[tuple[str, bytes]]]:
    """The headers of every record the worker holds fetched and unfinished (in its
    handlers or waiting for a runner): what its report counts by tenant."""
    for work in works:
        for chain in work.chains.values():
            for record in chain.records:
                yield record.headers


def process_fields() -> dict[str, Any]:
    """Which process reports (host, pid, package version): asked at each report, since a
    worker process may be forked (`--processes N`) after this module is imported."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "version": _VERSION}


_VERSION = package_version()

__all__ = ["held_headers", "in_handlers", "process_fields"]
