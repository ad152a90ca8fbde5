"""What a worker writes for a failed run: its retry, in the delay tier its attempt calls
for, or its dead letter. `stream_jobs.retry.decide` makes the decision; this writes it,
with the failure in the record's `sj-error` header, and logs it. A payload that does not
fit the handler's model is dead-lettered the same way, without a run.

Each write waits for the broker's ack (`GroupMember.write`): the job's outcome is durable
before its offset is finished.
"""

from __future__ import annotations

import logging
import random
from dataclasses import replace
from typing import Protocol

from stream_jobs.clock import now_ms
from stream_jobs.errors import PermanentError
from stream_jobs.failures import FailureInfo
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.logs import job_fields
from stream_jobs.naming import dlq_topic, tier_topic
from stream_jobs.outcomes import Outcome, Reason
from stream_jobs.record import JobRecord, Record, dead_letter_origin
from stream_jobs.retry import DeadLetter, RetryPolicy, decide
from stream_jobs.tracing import Hop, job_spans

log = logging.getLogger("stream_jobs.worker")

class Writer(Protocol):
    """Where a worker's records go: `GroupMember.write`, acknowledged by the broker."""

    async def write(self, topic: str, job: JobRecord) -> object: ...


class Retries:
    """The failed runs of one worker's type, written by `writer`."""

    def __init__(self, writer: Writer, prefix: str, policy: JobTypePolicy,
                 timeout_s: float, worker_id: str | None = None) -> None:
        self._writer = writer
        self._worker_id = worker_id  # named in each failure, as the worker's reports name it
        self._prefix = prefix
        self.policy = RetryPolicy(tiers=policy.retry_tiers, max_attempts=policy.max_attempts)
        self._timeout_s = timeout_s  # the handler's, for the log of a run past it
        self._spans = job_spans()  # a retry or letter is a hop of the job's trace, if traced

    async def failed(self, job: JobRecord, record: Record, error: Exception,
                     started_at_ms: int | None = None) -> Outcome | FailureInfo:
        """Retry or dead-letter `job`, whose run (started at `started_at_ms`) failed with
        `error`: `Outcome.RETRIED`, or the failure its dead letter carries. The failure
        names this worker, the run's start and its duration."""
        if isinstance(error, TimeoutError):
            reason = Reason.TIMEOUT
            log.warning("job %s (%s) attempt %d ran past its timeout of %g s", job.job_id,
                        job.job_type, job.attempt, self._timeout_s,
                        extra=job_fields(job, record, timeout_s=self._timeout_s))
        else:
            reason = Reason.PERMANENT if isinstance(error, PermanentError) else Reason.HANDLER_ERROR
        if self._spans is not None:
            self._spans.attempt_failed(error)
        now = now_ms()
        decision = decide(self.policy, attempt=job.attempt,
                          permanent=isinstance(error, PermanentError), now_ms=now,
                          rand=random.random())
        if isinstance(decision, DeadLetter):
            failure = self._failure(error, decision.reason, now, started_at_ms)
            await self.dead_letter(job, record, failure)
            log.warning("job %s (%s) dead-lettered after attempt %d: %s", job.job_id,
                        job.job_type, job.attempt, type(error).__name__,
                        extra=job_fields(job, record, reason=decision.reason))
            return failure
        failure = self._failure(error, reason, now, started_at_ms)
        retry = replace(with_failure(job, record, failure), attempt=decision.attempt,
                        not_before_ms=decision.not_before_ms)
        await self._write(tier_topic(self._prefix, job.job_type, decision.tier), retry,
                          Hop.RETRY, decision.tier)
        log.info("job %s (%s) attempt %d failed (%s, %s); attempt %d waits in delay tier %s",
                 job.job_id, job.job_type, job.attempt, reason, type(error).__name__,
                 decision.attempt, decision.tier,
                 extra=job_fields(job, record, reason=reason, tier=decision.tier))
        return Outcome.RETRIED

    def _failure(self, error: Exception, reason: str, now: int,
                 started_at_ms: int | None) -> FailureInfo:
        return FailureInfo.from_exception(error, reason, now, worker_id=self._worker_id,
                                          started_at_ms=started_at_ms)

    async def dead_letter(self, job: JobRecord, record: Record, failure: FailureInfo) -> None:
        """Write `job` to its type's DLQ, carrying `failure`."""
        await self._write(dlq_topic(self._prefix, job.job_type),
                          with_failure(job, record, failure), Hop.DEAD_LETTER)

    async def _write(self, topic: str, job: JobRecord, hop: Hop, tier: str | None = None
                     ) -> None:
        if self._spans is None:
            await self._writer.write(topic, job)
        else:
            await self._spans.send(self._writer.write, topic, job, hop, tier=tier)


def with_failure(job: JobRecord, record: Record, failure: FailureInfo) -> JobRecord:
    """`job` carrying `failure`, and where it was first read (kept over its retries)."""
    origin = job.origin or dead_letter_origin(record.topic, record.partition, record.offset)
    return replace(job, failure=failure, origin=origin)


__all__ = ["Retries", "Writer", "with_failure"]
