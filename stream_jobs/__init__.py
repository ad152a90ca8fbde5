"""stream-jobs: a Kafka-only distributed job system."""

from stream_jobs.errors import PermanentError, StreamJobsError
from stream_jobs.settings import Settings

__version__ = "0.1.0"

__all__ = ["PermanentError", "Settings", "StreamJobsError", "__version__"]
