"""How a job ends, and why a failure or a dead letter happened: the names, in one place.

Worker counters, reports, stats, metrics and dead-letter headers all spell these the
same way, since they are what users filter on (`dlq list --reason timeout`,
`stream_jobs_jobs_total{outcome="retried"}`). Both are `StrEnum`s, so a member is its
string wherever a string is expected (JSON, headers, label values).
"""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    """How a job left its lane; exactly one per delivery."""

    SUCCEEDED = "succeeded"
    RETRIED = "retried"  # failed with attempts left: sent to a delay tier
    DEAD_LETTERED = "dead_lettered"  # no attempts left, or permanently bad
    EXPIRED = "expired"  # past its expiry: finished without running
    DUPLICATE = "duplicate"  # its dedup row existed: finished without running
    CANCELLED = "cancelled"  # cancelled before it started, or interrupted by a cancel
    SUPERSEDED = "superseded"  # debounced: a newer job of its key ran instead


class Reason(StrEnum):
    """Why a job failed or was dead-lettered (`FailureInfo.reason`, `BadRecord.reason`)."""

    # A run that failed (the job retries while it has attempts left).
    HANDLER_ERROR = "handler-error"
    TIMEOUT = "timeout"
    # Dead-lettered after a run.
    PERMANENT = "permanent"
    MAX_ATTEMPTS = "max-attempts"
    # Dead-lettered without a run: the record is not a job this worker can run.
    INVALID_PAYLOAD = "invalid-payload"
    MISSING_VALUE = "missing-value"
    TOO_LARGE = "too-large"
    MISSING_HEADER = "missing-header"
    BAD_HEADER = "bad-header"
    WRONG_TYPE = "wrong-type"
    BAD_JSON = "bad-json"
