"""Periodic jobs: fire times (pure), firings and their job IDs (pure), the state table,
the leader's advisory lock, and the scheduler loop. See docs/schedules.md."""

from stream_jobs.schedules.firings import LATE_S, MAX_CATCH_UP, Due, due_firings, firing_job_id
from stream_jobs.schedules.scheduler import PayloadFunc, Scheduler

__all__ = ["LATE_S", "MAX_CATCH_UP", "Due", "PayloadFunc", "Scheduler", "due_firings",
           "firing_job_id"]
