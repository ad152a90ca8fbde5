"""`Worker`'s keyword options as one type, for `App.worker` to take them checked."""

from __future__ import annotations

from typing import TypedDict

from stream_jobs.client import JobClient
from stream_jobs.kafka.clients import KafkaClients
from stream_jobs.schedules import Scheduler
from stream_jobs.storage import Storage


class WorkerOptions(TypedDict, total=False):
    """`Worker`'s keyword options, as `App.worker` takes them (what they mean: `Worker`)."""

    grace_s: float
    commit_interval_s: float
    max_buffered: int | None
    relay: bool
    storage: Storage | None
    report_interval_s: float
    control: bool
    children: JobClient | None
    scheduler: Scheduler | None
    kafka: KafkaClients


__all__ = ["WorkerOptions"]
