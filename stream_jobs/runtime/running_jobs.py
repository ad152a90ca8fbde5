"""The jobs in a worker's handlers now, from the moment a handler starts until it ends.

The worker's per-job cost is one insert and one pop of a plain dict (`RunningJobs` is one):
the run's `JobContext` (hashed by identity; it knows the job, its lane record's topic,
partition and offset) to its start in ms. What a report says (`RunningJob`s, oldest
first) is made from it only when a report is written.
"""

from __future__ import annotations

import heapq
import os
import socket
from typing import Any

from stream_jobs.context import JobContext
from stream_jobs.runtime.reports import RUNNING_SHOWN, RunningJob, package_version


class RunningJobs(dict[JobContext, int]):
    """When each run in a handler started (ms), by its context."""

    def oldest(self, cap: int = RUNNING_SHOWN) -> tuple[RunningJob, ...]:
        """The `cap` runs that started first, oldest first."""
        runs = heapq.nsmallest(cap, self.items(), key=lambda run: run[1])
        return tuple(RunningJob(ctx.job_id, ctx.attempt, ctx.topic, ctx.partition, ctx.offset,
                                started_ms)
                     for ctx, started_ms in runs)


def process_fields() -> dict[str, Any]:
    """Which process reports (host, pid, package version): asked at each report, since a
    worker process may be forked (`--processes N`) after this module is imported."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "version": _VERSION}


_VERSION = package_version()

__all__ = ["RunningJobs", "process_fields"]
