"""The worker: runs one job type's handlers on its lanes, plus that type's delay relay.

`stream-jobs worker MODULE:app --type T` is one deployable unit per type: the consumer
group `P.T.worker` on T's lanes and the relay (`P.T.relay`) on T's delay tiers, sharing
one producer. Each job ends in exactly one outcome (see `Outcome`); its offset is marked
finished only once that outcome is durable (a retry or dead letter acknowledged by the
broker), so no path drops a job.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Hashable
from dataclasses import replace
from enum import StrEnum

from stream_jobs.app import JobHandler
from stream_jobs.consumer import GroupMember, PartitionWork, Record
from stream_jobs.context import JobContext, ms_to_datetime
from stream_jobs.dedup import DedupStore
from stream_jobs.errors import AlreadyDone, BadRecord, PermanentError, StreamJobsError
from stream_jobs.naming import dlq_topic, lane_topic, stats_topic, tier_topic, worker_group
from stream_jobs.producer import JobProducer
from stream_jobs.record import (
    FailureInfo,
    JobRecord,
    dead_letter_origin,
    decode_record,
)
from stream_jobs.relay import Relay
from stream_jobs.reports import WorkerReport, ensure_stats_topic, new_worker_id
from stream_jobs.retry import DeadLetter, RetryPolicy, decide
from stream_jobs.settings import Settings
from stream_jobs.topics import JobTypePolicy

log = logging.getLogger("stream_jobs.worker")


class Outcome(StrEnum):
    """How a job left its lane; exactly one per delivery."""

    SUCCEEDED = "succeeded"
    RETRIED = "retried"  # failed with attempts left: sent to a delay tier
    DEAD_LETTERED = "dead_lettered"  # no attempts left, or permanently bad
    EXPIRED = "expired"  # past its expiry: finished without running
    DUPLICATE = "duplicate"  # its dedup row existed: finished without running


def _now_ms() -> int:
    return int(time.time() * 1000)


class Worker(GroupMember):
    """Handlers for one job type with bounded concurrency, retries, dead letters and a relay."""

    def __init__(self, settings: Settings, policy: JobTypePolicy, handler: JobHandler, *,
                 grace_s: float = 10.0, commit_interval_s: float = 0.5,
                 max_buffered: int | None = None, relay: bool = True,
                 dedup: DedupStore | None = None, report_interval_s: float = 5.0) -> None:
        prefix = settings.topic_prefix
        lanes = [lane_topic(prefix, policy.job_type, lane) for lane in policy.priorities]
        super().__init__(settings, worker_group(prefix, policy.job_type), lanes,
                         job_type=policy.job_type, producer=JobProducer(settings),
                         concurrency=handler.concurrency, grace_s=grace_s,
                         commit_interval_s=commit_interval_s,
                         max_buffered=max_buffered or max(2 * handler.concurrency, 256))
        self.policy = policy
        self.handler = handler
        self.retry_policy = RetryPolicy(tiers=policy.retry_tiers,
                                        max_attempts=policy.max_attempts)
        self.dedup = dedup or DedupStore(settings)
        self._owns_dedup = dedup is None
        self.relay = Relay(settings, policy, self.producer, grace_s=grace_s) if relay else None
        self.outcomes: Counter[str] = Counter()
        self.dead_letter_reasons: Counter[str] = Counter()
        self.worker_id = new_worker_id()
        self.report_interval_s = report_interval_s
        self._started_at_ms = _now_ms()

    # -- running ----------------------------------------------------------------------------

    async def run(self, *, until_idle: bool = False) -> None:
        """Process jobs until `stop()` (or SIGTERM via the CLI); with `until_idle`, until
        the lanes and tiers are read to their ends and nothing is in flight or held."""
        await self.producer.start()
        reporter: asyncio.Task[None] | None = None
        try:
            await self.start()
            if self.relay is not None:
                await self.relay.start()
            reporter = asyncio.create_task(self._report_every())
            try:
                await self._loop(until_idle)
            finally:
                if self.relay is not None:
                    await self.relay.stop()
                await self.stop()
                reporter.cancel()
                await asyncio.gather(reporter, return_exceptions=True)
                await self._report(final=True)
        finally:
            await self.producer.stop()
            if self._owns_dedup:
                await self.dedup.close()

    def report(self, *, final: bool = False) -> WorkerReport:
        """This worker's counters now (what it publishes to `P._stats`)."""
        return WorkerReport(
            job_type=self.policy.job_type, worker_id=self.worker_id, at_ms=_now_ms(),
            started_at_ms=self._started_at_ms,
            outcomes={str(k): v for k, v in self.outcomes.items()},
            dead_letter_reasons=dict(self.dead_letter_reasons), in_flight=self.in_flight(),
            released=self.relay.released if self.relay is not None else 0, final=final,
            interval_s=self.report_interval_s)

    async def _report_every(self) -> None:
        try:
            await ensure_stats_topic(self.settings)
        except StreamJobsError as exc:
            log.warning("cannot create the stats topic; reports are skipped: %s", exc)
        while True:
            await self._report()
            await asyncio.sleep(self.report_interval_s)  # a period, not a wait for a condition

    async def _report(self, *, final: bool = False) -> None:
        report = self.report(final=final)
        try:
            await self.producer.send_raw(stats_topic(self.settings.topic_prefix),
                                         self.worker_id.encode(), report.to_json(), [])
        except StreamJobsError as exc:
            log.warning("worker report not written: %s", exc)

    def request_stop(self) -> None:
        """Ask `run` to drain and return (safe from a signal handler on the loop)."""
        self.stopping.set()

    async def _loop(self, until_idle: bool) -> None:
        idle_rounds = 0
        while not self.stopping.is_set():
            fetched = await self.poll_once()
            if self.relay is not None:
                fetched += await self.relay.poll_once(timeout_ms=0 if fetched else 50)
            if not until_idle:
                continue
            if fetched or self.in_flight() or (self.relay and self.relay.in_flight()):
                idle_rounds = 0
                continue
            idle_rounds = idle_rounds + 1 if await self._idle() else 0
            if idle_rounds >= 2:
                return

    async def _idle(self) -> bool:
        await self.commit()
        if self.relay is not None:
            await self.relay.commit()
            if not await self.relay.caught_up():
                return False
        return await self.caught_up()

    # -- one job ----------------------------------------------------------------------------

    def chain_of(self, record: Record) -> Hashable:
        ordering = self.handler.ordering
        if ordering == "partition":
            return None
        if ordering == "key" and record.key is not None:
            return record.key
        return record.offset

    async def handle(self, work: PartitionWork, record: Record) -> None:
        self.outcomes[await self._run_job(record)] += 1

    async def _run_job(self, record: Record) -> Outcome:
        try:
            job = decode_record(key=record.key, value=record.value, headers=record.headers,
                                expected_type=self.policy.job_type,
                                max_payload_bytes=self._payload_limit(), check_json=False)
        except BadRecord as bad:
            await self.dead_letter_raw(record, bad)
            self.dead_letter_reasons[bad.reason] += 1
            return Outcome.DEAD_LETTERED
        now = _now_ms()
        if job.expires_at_ms is not None and now >= job.expires_at_ms:
            return Outcome.EXPIRED
        try:
            payload = self.handler.parse_payload(job.payload)
        except BadRecord as bad:
            failure = FailureInfo.from_exception(bad, bad.reason, now)
            await self.write(dlq_topic(self.settings.topic_prefix, job.job_type),
                             self._with_failure(job, record, failure))
            self.dead_letter_reasons[bad.reason] += 1
            return Outcome.DEAD_LETTERED
        ctx = JobContext(
            job_id=job.job_id, job_type=job.job_type, attempt=job.attempt,
            key=job.key.decode(errors="replace") if job.key is not None else None,
            enqueued_at=ms_to_datetime(job.enqueued_at_ms), lane=job.lane,
            topic=record.topic, partition=record.partition, offset=record.offset,
            _dedup=self.dedup,
        )
        try:
            async with asyncio.timeout(self.handler.timeout_s):
                await self.handler.func(payload, ctx)
        except AlreadyDone:
            return Outcome.DUPLICATE
        except TimeoutError as exc:
            return await self._failed(job, record, exc, "timeout")
        except Exception as exc:
            reason = "permanent" if isinstance(exc, PermanentError) else "handler-error"
            return await self._failed(job, record, exc, reason)
        return Outcome.SUCCEEDED

    async def _failed(self, job: JobRecord, record: Record, exc: BaseException,
                      reason: str) -> Outcome:
        now = _now_ms()
        decision = decide(self.retry_policy, attempt=job.attempt,
                          permanent=isinstance(exc, PermanentError), now_ms=now,
                          rand=random.random())
        prefix = self.settings.topic_prefix
        if isinstance(decision, DeadLetter):
            failure = FailureInfo.from_exception(exc, decision.reason, now)
            await self.write(dlq_topic(prefix, job.job_type),
                             self._with_failure(job, record, failure))
            self.dead_letter_reasons[decision.reason] += 1
            log.warning("job %s (%s) dead-lettered after attempt %d: %s", job.job_id,
                        job.job_type, job.attempt, type(exc).__name__)
            return Outcome.DEAD_LETTERED
        failure = FailureInfo.from_exception(exc, reason, now)
        retry = replace(self._with_failure(job, record, failure), attempt=decision.attempt,
                        not_before_ms=decision.not_before_ms)
        await self.write(tier_topic(prefix, job.job_type, decision.tier), retry)
        return Outcome.RETRIED

    def _with_failure(self, job: JobRecord, record: Record, failure: FailureInfo) -> JobRecord:
        origin = job.origin or dead_letter_origin(record.topic, record.partition, record.offset)
        return replace(job, failure=failure, origin=origin)

    def _payload_limit(self) -> int:
        return self.policy.max_payload_bytes or self.settings.max_payload_bytes
