"""stream-jobs: a Kafka-only distributed job system.

Jobs are keyed records in per-type Kafka topics; workers run each partition with
out-of-order completion tracking; failures hop through delay tiers to a DLQ; a Postgres
dedup table makes a job's effects happen once per job ID.
"""

from stream_jobs.app import App
from stream_jobs.client import Job, JobClient, SyncJobClient
from stream_jobs.context import JobContext
from stream_jobs.errors import PermanentError, StreamJobsError
from stream_jobs.outcomes import Outcome
from stream_jobs.runtime.worker import Worker
from stream_jobs.settings import Settings

__version__ = "0.1.0"

__all__ = [
    "App",
    "Job",
    "JobClient",
    "JobContext",
    "Outcome",
    "PermanentError",
    "Settings",
    "StreamJobsError",
    "SyncJobClient",
    "Worker",
    "__version__",
]
