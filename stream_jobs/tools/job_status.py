"""`stream-jobs job ID` and `GET /jobs/{id}`: the lookup (`stream_jobs.lookup`), and a
waiting job that a live worker's latest report lists in its handler shown as running.

The reports are asked only for a job the lookup finds pending, and only the live
workers of its type count: one read of the last seconds of `P._stats`
(`stream_jobs.tools.worker_reports`), never a scan of the reports' history.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from stream_jobs.errors import StreamJobsError
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.lookup import JobLocation, RunningOn, locate_job
from stream_jobs.settings import Settings
from stream_jobs.tools.running import RunningView
from stream_jobs.tools.worker_reports import read_running


async def locate(settings: Settings, types: Mapping[str, JobTypePolicy], job_id: str, *,
                 job_type: str | None = None, **options: Any) -> JobLocation:
    """`locate_job(...)` (same options), then a pending job found running."""
    found = await locate_job(settings, types, job_id, job_type=job_type, **options)
    if found.status != "pending" or found.job_type is None:
        return found
    try:
        view = await read_running(settings, types, job_type=found.job_type)
    except StreamJobsError as exc:
        return replace(found, notes=(*found.notes, f"The workers' reports were not read "
                                     f"({exc}): a running job shows as pending."))
    return running_location(found, view)


def running_location(found: JobLocation, view: RunningView) -> JobLocation:
    """`found` as running if a live worker of `view` lists it in a handler."""
    row = view.find(found.job_id)
    if row is None:
        return found
    job = row.job
    return found.running(RunningOn(row.worker_id, job.attempt, job.topic, job.partition,
                                   job.offset, job.started_at_ms, row.running_for_s(view.at_ms)))


__all__ = ["locate", "running_location"]
