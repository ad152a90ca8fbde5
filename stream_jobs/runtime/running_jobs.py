"""The jobs in a worker's handlers now, from the moment a handler starts until it ends.

The worker's per-job cost is one insert and one pop of a plain dict (`RunningJobs` is one):
keyed by the run's `id()`, holding the job, its lane record and its start in ms. What a
report says (`RunningJob`s, oldest first) is made from it only when a report is written.
"""

from __future__ import annotations

import heapq
import os
import socket
from typing import Any

from stream_jobs.record import JobRecord, Record
from stream_jobs.runtime.reports import RUNNING_SHOWN, RunningJob, package_version

# A run in a handler: its job, its lane record, and when its handler started (ms).
Run = tuple[JobRecord, Record, int]


class RunningJobs(dict[int, Run]):
    """The runs in handlers by the `id()` of something that lives as long as the run."""

    def oldest(self, cap: int = RUNNING_SHOWN) -> tuple[RunningJob, ...]:
        """The `cap` runs that started first, oldest first."""
        runs = heapq.nsmallest(cap, self.values(), key=lambda run: run[2])
        return tuple(RunningJob(job.job_id, job.attempt, record.topic, record.partition,
                                record.offset, started_ms)
                     for job, record, started_ms in runs)


def process_fields() -> dict[str, Any]:
    """Which process reports (host, pid, package version): asked at each report, since a
    worker process may be forked (`--processes N`) after this module is imported."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "version": _VERSION}


_VERSION = package_version()

__all__ = ["Run", "RunningJobs", "process_fields"]
