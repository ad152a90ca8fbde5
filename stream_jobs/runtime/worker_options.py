"""`Worker`'s keyword options as one type, for `App.worker` to take them checked, and the
default of the one that needs a reason."""

from __future__ import annotations

from typing import TypedDict

from stream_jobs.client import JobClient
from stream_jobs.kafka.clients import KafkaClients
from stream_jobs.schedules import Scheduler
from stream_jobs.storage import Storage

# Records a partition may have fetched but not finished before it is paused. Well above
# one fetch (up to 500 records): aiokafka drops the rest of a paused partition's fetch and
# the broker then resends whole record batches, decoded again up to the position, so
# pausing after every fetch cost a draining worker about a third of its time (measured).
DEFAULT_MAX_BUFFERED = 2000


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


__all__ = ["DEFAULT_MAX_BUFFERED", "WorkerOptions"]
