"""Every error stream-jobs raises on purpose. Driver errors are wrapped where they enter.

A `StreamJobsError` carries a sentence a user can act on; the CLI prints it without a
traceback and exits non-zero.
"""

from __future__ import annotations


class StreamJobsError(Exception):
    """Root of all stream-jobs errors; its message tells the user what to do."""


class ConfigError(StreamJobsError):
    """A setting, a topics/*.toml file or a handler declaration is invalid."""


class UnknownStatement(StreamJobsError):
    """A `JobTester`'s in-memory tables met a statement of the runtime's own that they
    cannot apply (a gap in stream-jobs' test kit, not in the handler under test)."""


class StackError(StreamJobsError):
    """The local development stack (Kafka, Postgres) cannot be started or reached."""


class PrerequisiteMissing(StackError):
    """A tool the local stack needs (Java, Maven, PostgreSQL) is not installed or not reachable."""


class PortInUse(StackError):
    """A port the local stack wants is held by a process that is not ours."""


class BrokerUnavailable(StreamJobsError):
    """No Kafka broker answered at the configured bootstrap servers."""


class BrokerError(StreamJobsError):
    """Kafka answered a request of ours with an error, or not in time (a fetch, an offsets
    or metadata question, an admin request)."""


class CommitRefused(BrokerError):
    """Kafka refused a commit of consumer offsets: a rebalance moved on, or we were fenced."""


class AuthenticationFailed(StreamJobsError):
    """Kafka refused our SASL credentials, or its TLS certificate did not verify."""


class AccessDenied(StreamJobsError):
    """Kafka's ACLs do not let our principal do what was asked (read, write, join a group)."""


class DatabaseUnavailable(StreamJobsError):
    """The Postgres server at the configured database URL did not answer or refused us."""


class DedupWriteFailed(StreamJobsError):
    """`ctx.once_sync()` could not write or commit a job's dedup row through the handler's
    own connection."""


class UnknownJobType(StreamJobsError):
    """A job type that no topics/*.toml file declares was named."""


class PayloadError(StreamJobsError):
    """A payload cannot be encoded, is too large, or fails its type's model."""


class PayloadTooLarge(PayloadError):
    """A payload is over its type's size limit (max_payload_bytes)."""


class NotAuthorized(StreamJobsError):
    """A gateway request lacks the bearer token that write and operator routes need."""


class PublishError(StreamJobsError):
    """The broker did not acknowledge a record; nothing is known to be written."""


class TopicPlanError(StreamJobsError):
    """Kafka cannot be made to match topics/ without losing data (e.g. shrinking partitions)."""


class PermanentError(StreamJobsError):
    """Raised by a handler for a failure that retrying cannot fix: the job goes to the DLQ now."""


class BadRecord(StreamJobsError):
    """A consumed record cannot be a job (too large, bad headers, bad JSON): it is dead-lettered."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        # The code the dead letter carries, e.g. "bad-json" (a `Reason`, kept as its text).
        self.reason = str(reason)
        self.message = message

    def __reduce__(self) -> tuple[type[BadRecord], tuple[str, str]]:
        # Exception pickles its args, which here would lose the reason.
        return (type(self), (self.reason, self.message))


class AlreadyDone(StreamJobsError):
    """A job's dedup row exists: an earlier run committed its effects (an outcome)."""


class RolledBackWithOthers(StreamJobsError):
    """A job's `ctx.once()` block ran, but the transaction it shared with other jobs
    (group commit) was rolled back because another job's body failed: nothing of this
    job was written, and the worker runs it again at once, not as a new attempt."""


class Abandoned(StreamJobsError):
    """A record left unfinished on purpose (revocation, shutdown): its next owner gets it."""


class LetterNotFound(StreamJobsError):
    """No dead letter of the type has the job ID that was asked for."""


class BadCursor(StreamJobsError):
    """A page cursor this list did not give out (damaged, edited, or another list's)."""


class DlqRefused(StreamJobsError):
    """Kafka refused what a DLQ tool asked: the drain position, a commit, a deletion."""


class ReplayInterrupted(StreamJobsError):
    """A replay stopped part-way (the broker failed); the message says where to resume."""


class GroupInUse(StreamJobsError):
    """A consumer group has active members, so its committed offsets cannot be moved."""


class NotInTransaction(StreamJobsError):
    """An enqueue meant for a transaction had none (autocommit, ctx.enqueue outside once())."""


class OutboxWriteError(StreamJobsError):
    """A job could not be written to the outbox in the caller's transaction (roll it back)."""


class JobNotFound(StreamJobsError):
    """No job with the given ID was found (not finished, and in none of the topics scanned)."""


class NotInDelayTier(StreamJobsError):
    """Retry now was asked for a job that is not waiting in a delay tier."""


class AlreadyReleased(StreamJobsError):
    """Retry now was asked for an attempt that was retried now before."""


class CancelPending(StreamJobsError):
    """A cancel waited for a run that holds the job's dedup row and did not stop in time."""


class JobInterrupted(StreamJobsError):
    """A run stopped for a cancel that did not complete: it failed, and is retried."""


class RunGivenUp(StreamJobsError):
    """A handler thread asked for a fencing token after its job stopped waiting for it."""


class RunFailed(StreamJobsError):
    """A job's run ended with an error, carried as `error` (the handler's own, a timeout,
    an interrupt); the worker's handler calls raise it, so that they return the value."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


class LeadershipLost(StreamJobsError):
    """A scheduler's lock session ended or failed: it no longer leads its type's schedules."""


class ResultError(StreamJobsError):
    """A handler's return value cannot be kept as its result (not JSON, or too large)."""


class ResultTooLarge(ResultError):
    """A handler returned a result over the result size limit (max_result_bytes)."""


class ResultTimeout(StreamJobsError):
    """`client.result` waited its timeout and the job has no result yet."""


class ResultNotKept(StreamJobsError):
    """A job finished, but no result of it is kept (its type has no keep_result, or pruned)."""


class JobNotSucceeded(StreamJobsError):
    """`client.result` of a job that ended without a result: dead-lettered, cancelled, expired."""

    def __init__(self, message: str, *, job_id: str = "", state: str = "failed",
                 reason: str | None = None) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.state = state  # "failed", "cancelled", "expired", "superseded"
        self.reason = reason  # what the dead letter or the cancellation said

    def __reduce__(self) -> tuple[type[JobNotSucceeded], tuple[str], dict[str, object]]:
        return (type(self), (str(self),), {"job_id": self.job_id, "state": self.state,
                                           "reason": self.reason})


class JobFailed(JobNotSucceeded):
    """The job was dead-lettered: retries ran out, or it failed for good."""


class JobCancelled(JobNotSucceeded):
    """The job was cancelled (or superseded by a newer one) before it succeeded."""


class JobExpired(JobNotSucceeded):
    """The job passed its expiry before it ran."""


class UnknownWorkflow(StreamJobsError):
    """No batch or chain has the ID that was asked for."""


class FinishFailed(StreamJobsError):
    """A job's finish transaction (dedup row, effects, result, counters) did not commit."""


class NotSettled(StreamJobsError):
    """A `JobTester` run did not come to rest: a job still running at its time limit, or
    work that keeps making more work (stream_jobs.testing)."""
