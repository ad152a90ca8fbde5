"""The worker: runs one job type's handlers on its lanes, plus that type's delay relay.

A `Worker` is everything one type needs in a process: the consumer group `P.T.worker` on
T's lanes and the relay (`P.T.relay`) on T's delay tiers, sharing one producer, and the
type's scheduler when it has schedules. `stream-jobs worker APP` runs a `Worker` per type
in one process (`stream_jobs.runtime.host`), or in each of `--processes N`. Each job
ends in exactly one outcome (see `Outcome`); its offset is marked finished only once that
outcome is durable (a retry or dead letter acknowledged by the broker), so no path drops
a job.

A job goes through three phases (`Worker.handle`): *admit* (debounce, cancel, expiry:
`stream_jobs.runtime.admission`, docs/control.md), *run* (its handler, in its finish
transaction if it has one: `stream_jobs.results.finish`) and *end*, the one place its
outcome is counted, a dead letter's reason too, its kept row written and its unique key
given back. Flow control: docs/flow-control.md (`stream_jobs.runtime.flow_control`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Hashable, Sequence
from functools import partial

from stream_jobs.client import JobClient
from stream_jobs.clock import now_ms
from stream_jobs.context import JobContext
from stream_jobs.dedup.store import Dedup
from stream_jobs.errors import AlreadyDone, BadRecord, RunFailed
from stream_jobs.failures import FailureInfo
from stream_jobs.fairness.tally import TenantDwell
from stream_jobs.handlers import JobHandler
from stream_jobs.histogram import DurationHistogram
from stream_jobs.history.windows import SlotTallies
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.clients import AIOKAFKA, KafkaClients
from stream_jobs.logs import job_fields
from stream_jobs.naming import dlq_topic, lane_topic, overflow_topic, tier_topic, worker_group
from stream_jobs.outcomes import Outcome
from stream_jobs.record import HEADER_WORKFLOW, JobRecord, Record, decode_record
from stream_jobs.results.finish import Finisher, ending_row, record_ending
from stream_jobs.retry_now.rules import released_original
from stream_jobs.runtime.admission import Admission, holds_key
from stream_jobs.runtime.calls import call_finished, handler_call
from stream_jobs.runtime.delay_relay import Relay
from stream_jobs.runtime.dispatch import PartitionWork, Runner
from stream_jobs.runtime.fair_dispatch import (
    fair_consumer_options,
    fair_dispatcher,
    fair_services,
)
from stream_jobs.runtime.flow_control import FlowControlled, header_expires_at_ms
from stream_jobs.runtime.gc_tuning import worker_collector
from stream_jobs.runtime.heartbeats import is_heartbeat
from stream_jobs.runtime.heartbeats import report_interval_s as heartbeat_report_interval_s
from stream_jobs.runtime.idle import IdleWatch, run_until_idle
from stream_jobs.runtime.member import GroupMember
from stream_jobs.runtime.reports import WorkerReport, new_worker_id, publish, publish_every
from stream_jobs.runtime.retries import Retries
from stream_jobs.runtime.services import Loop, Service, running
from stream_jobs.runtime.stalls import LoopWatch
from stream_jobs.runtime.throttle import ControlFollower
from stream_jobs.runtime.worker_options import DEFAULT_MAX_BUFFERED
from stream_jobs.runtime.worker_report import report_of
from stream_jobs.schedules import Scheduler
from stream_jobs.settings import Settings
from stream_jobs.storage import PostgresStorage, Storage
from stream_jobs.tracing import job_spans

log = logging.getLogger("stream_jobs.worker")
# Runs again of a job whose ctx.once() was rolled back by another job's failure (the
# first in a careful batch, where that cannot happen but for a claim cut short).
RERUNS_AFTER_ROLLBACK = 2

# How a job ends: its outcome, or the failure it was dead-lettered with.
Ended = Outcome | FailureInfo


class Worker(FlowControlled):
    """Handlers for one job type with bounded concurrency, retries, dead letters and a relay."""

    def __init__(self, settings: Settings, policy: JobTypePolicy, handler: JobHandler, *,
                 grace_s: float = 10.0, commit_interval_s: float = 0.5,
                 max_buffered: int | None = None, relay: bool = True,
                 storage: Storage | None = None, report_interval_s: float = 5.0,
                 control: bool = True, children: JobClient | None = None,
                 scheduler: Scheduler | None = None, kafka: KafkaClients = AIOKAFKA) -> None:
        prefix = settings.topic_prefix
        lanes = [lane_topic(prefix, policy.job_type, lane) for lane in policy.priorities]
        lanes += [overflow_topic(prefix, policy.job_type)] if policy.has_overflow else []
        weights = [(lane_topic(prefix, policy.job_type, lane), weight)
                   for lane, weight in policy.lane_weights]
        super().__init__(settings, worker_group(prefix, policy.job_type), lanes,
                         job_type=policy.job_type, producer=kafka.producer(settings),
                         concurrency=handler.concurrency, grace_s=grace_s,
                         commit_interval_s=commit_interval_s,
                         max_buffered=max_buffered or max(2 * handler.concurrency,
                                                          DEFAULT_MAX_BUFFERED),
                         lane_weights=weights, kafka=kafka,
                         consumer_options=fair_consumer_options(policy))
        self.kafka = kafka
        self.policy = policy
        self.handler = handler
        self.worker_id = new_worker_id()
        # A failed run's retry or dead letter, written (and a payload that does not fit).
        self.retries = Retries(self, prefix, policy, handler.timeout_s, self.worker_id)
        # The database's part (docs/design/layout.md): the app's, or Postgres's own.
        storage = storage or PostgresStorage(settings)
        if policy.fairness is not None:  # tenants round robin, the overflow, their limits
            self.dispatcher = fair_dispatcher(self, policy, handler.ordering, kafka, storage)
        self.dedup: Dedup = storage.dedup_store()
        self.children = children  # checks and makes the child jobs of ctx.enqueue()
        # Results, batch members, chain steps: what a job that needs it commits at its end.
        self.finisher = Finisher.of(storage.finish_store(self.dedup), settings, policy.job_type,
                                    handler.keep_result_s)
        self.outcomes: Counter[str] = Counter()
        # The same counts per slot of time, with run durations and dwell times (history).
        self.slots = SlotTallies(self.outcomes, settings.history_window_s)
        # Dwell by tenant, from one report to the next: a [fairness] type's (docs/fairness.md).
        self.tenant_dwell = TenantDwell() if policy.fairness is not None else None
        # Cancels, unique keys, debounce: the hot path reads the set of cancelled IDs directly.
        self.admission = Admission(settings, policy.job_type, stopping=self.stopping,
                                   interruptible=not handler.sync,
                                   cancels=storage.cancel_feed(policy.job_type),
                                   keys=storage.key_store(),
                                   runners=lambda: self.dispatcher.runners)
        self._cancelled = self.admission.cancelled
        self.relay = self._new_relay(grace_s, kafka) if relay else None
        self.dead_letter_reasons: Counter[str] = Counter()
        # Handler run times, kept only while metrics are on (`stream_jobs.runtime.metrics`).
        self.durations: DurationHistogram | None = None
        self.report_interval_s = heartbeat_report_interval_s(report_interval_s,
                                                             policy.heartbeat_interval_s)
        self.started_at_ms = now_ms()
        # Flow control: the type's limit in force, this worker's share of it, heartbeats.
        self.init_flow(policy, control=control)
        # The type's schedules (`App.worker` passes them): fired by whichever worker leads.
        self.scheduler = scheduler
        # On the loop, or (a plain `def`) on `concurrency` threads: chosen once, here.
        self._call_handler, self.threads = handler_call(self, handler)
        self.loop_watch = LoopWatch(self.group_id, lambda: self.dispatcher.runners)
        self.spans = job_spans()  # None unless something records traces (docs/tracing.md)

    def _new_relay(self, grace_s: float, kafka: KafkaClients) -> Relay:
        """The type's delay relay: the worker's producer, cancels, retried-now attempts and
        counters, woken by each cancel and each attempt retried now."""
        relay = Relay(self.settings, self.policy, self.producer, grace_s=grace_s, kafka=kafka,
                      cancelled=self._cancelled, outcomes=self.outcomes,
                      ended=partial(self._record_end, outcome=Outcome.CANCELLED),
                      released=self.admission.released)
        self.admission.subscribe(relay.on_cancel, on_release=relay.on_cancel)
        return relay

    # -- running ----------------------------------------------------------------------------

    async def run(self, *, until_idle: bool = False) -> None:
        """Process jobs until `request_stop()` (or SIGTERM via the CLI); with `until_idle`,
        until this type is idle: its lanes and tiers read to their ends and committed,
        nothing running or held (a retry not due yet is waited for). That is this type
        alone: several types, and the outbox their jobs write through, are
        `stream_jobs.runtime.host.WorkerHost`'s to watch (`stream_jobs.runtime.idle`)."""
        await self.producer.start()
        prefix = self.settings.topic_prefix
        await self.producer.warm([*self.topics, dlq_topic(prefix, self.policy.job_type),
                                  *(tier_topic(prefix, self.policy.job_type, tier)
                                    for tier in self.policy.retry_tiers)])
        first, beside = self._services()
        try:
            # Joined while the cancels and the control topic are read: the first fetch knows
            # every cancel, and a type throttled at run time never starts a job at its TOML
            # rate.
            await asyncio.gather(self.start(), *(service.start() for service in first))
            self.loop_watch.start()
            async with running(beside):
                try:
                    with worker_collector(self.settings.worker_gc_young_threshold):
                        if until_idle:
                            await run_until_idle(IdleWatch([self]), self._loop,
                                                 self.request_stop)
                        else:
                            await self._loop()
                finally:
                    await self.stop()  # drained while the services beside it still run
        finally:
            self.loop_watch.stop()
            for service in reversed(first):  # started or not: the gather may have failed
                await service.stop()
            if self.threads is not None:
                self.threads.close()
            await self.producer.stop()
            await self.dedup.close()

    def _services(self) -> tuple[list[Service], list[Service]]:
        """What runs beside the lanes, each list in start order (stopped in reverse): what
        the first fetch needs, started while the consumer joins (the cancels, the control
        topic), then what starts once it joined and stops once it drained (the reports,
        whose last is the final one, the delay relay, heartbeats, the type's schedules)."""
        first: list[Service] = [self.admission, *fair_services(self.dispatcher)]
        if self.control:
            follower = ControlFollower(self.settings, self._on_control)
            first.append(Loop("control", follower.follow,
                              ready=partial(self._catch_up, follower), ended=follower.stop))
        beside: list[Service] = [Loop("reports", self._report_every,
                                      ended=partial(self._report, final=True))]
        if self.relay is not None:
            beside.append(self.relay)
        if self.heartbeat_interval_s is not None:
            beside.append(Loop("heartbeats", self._heartbeat_every))
        if self.scheduler is not None:
            beside.append(Loop("schedules", self.scheduler.run))
        return first, beside

    def report(self, *, final: bool = False) -> WorkerReport:
        """This worker's counters now (what it publishes to `P._stats`)."""
        return report_of(self, final=final)

    async def _report_every(self) -> None:
        await publish_every(self.settings, self.producer, self.worker_id, self.report,
                            self.report_interval_s, kafka=self.kafka)

    async def _report(self, *, final: bool = False) -> None:
        await publish(self.settings, self.producer, self.worker_id, self.report(final=final))

    def screen(self, work: PartitionWork, record: Record) -> bool:
        """Finish at fetch time what needs no handler: heartbeats always, and under a rate
        limit jobs already expired, so stale work never waits for (or spends) a token."""
        if is_heartbeat(record.key, record.headers):
            self._beat(work.tp, record.timestamp)
            return True
        if self.rate_share_per_s is not None:
            expires_at = header_expires_at_ms(record.headers)
            now = now_ms()
            if (expires_at is not None and now >= expires_at
                    and not holds_key(record.headers) and not self._ends_recorded(record.headers)):
                self.slots.tick(now)
                self.outcomes[Outcome.EXPIRED] += 1
                return True
        return False

    def _ends_recorded(self, headers: Sequence[tuple[str, bytes]]) -> bool:
        """Whether a record's job gets a row when it ends (so it is not screened out)."""
        return self.finisher.keep_s is not None or any(n == HEADER_WORKFLOW for n, _ in headers)

    def request_stop(self) -> None:
        """Ask `run` to drain and return (safe from a signal handler on the loop)."""
        self.stopping.set()

    async def _loop(self) -> None:
        # The relay polls its tiers in a task of its own: a lane fetch never waits for a
        # tier fetch's long poll, nor a due retry for the lanes'.
        ended = asyncio.Event()
        relaying = (asyncio.create_task(self._relay_loop(self.relay, ended))
                    if self.relay is not None else None)
        try:
            while not self.stopping.is_set():
                if relaying is not None and relaying.done():
                    await relaying  # it ended with an error: raise it here
                await self.poll_once()
        finally:
            ended.set()
            if relaying is not None:
                await relaying

    async def _relay_loop(self, relay: Relay, ended: asyncio.Event) -> None:
        while not (ended.is_set() or self.stopping.is_set()):
            await relay.poll_once()

    # -- idleness (what `stream_jobs.runtime.idle` reads) -----------------------------------

    def busy(self) -> bool:
        """Work in memory: jobs fetched and not finished, records a delay tier holds until
        they are due, handlers still running on a thread or past their runner."""
        return bool(self.in_flight() or self.dispatcher.held
                    or (self.relay is not None and self.relay.in_flight())
                    or (self.threads is not None and self.threads.busy))

    def intake(self) -> int:
        """Records fetched from the lanes and the delay tiers, and rebalances, so far."""
        return self.taken_in + (self.relay.taken_in if self.relay is not None else 0)

    async def drained(self) -> bool:
        """The lanes and the delay tiers read to their ends, and committed. (The polls
        commit, every `commit_interval_s`: a commit from here could overtake theirs.)"""
        members: list[GroupMember] = [self] if self.relay is None else [self, self.relay]
        return all(await asyncio.gather(*(member.caught_up() for member in members)))

    # -- one job: admitted, run, ended ------------------------------------------------------

    def chain_of(self, record: Record) -> Hashable:
        ordering = self.handler.ordering
        if ordering == "partition":
            return None
        if ordering == "key" and record.key is not None:
            return record.key
        return record.offset

    async def handle(self, work: PartitionWork, record: Record, runner: Runner) -> None:
        """One record's job, in three phases: `_admit` (may it run?), `_run` (its handler)
        and `_end` (its outcome recorded), in its attempt's process span when traced. A
        record that is not a job is dead-lettered; the original of an attempt retried now
        (stream_jobs/retry_now/) is skipped, counted `duplicate`."""
        try:
            job = decode_record(key=record.key, value=record.value, headers=record.headers,
                                expected_type=self.policy.job_type,
                                max_payload_bytes=self.policy.payload_limit(self.settings),
                                check_json=False)
        except BadRecord as bad:
            await self._not_a_job(record, bad)
            return
        released = self.admission.released  # attempts retried now: their copy runs instead
        if released and released_original(record.headers, released):
            self.slots.tick(now_ms())
            self.outcomes[Outcome.DUPLICATE] += 1
            return
        # Traced: the attempt in its process span (no await between here and the phases).
        attempt = None if self.spans is None else self.spans.begin_attempt(
            job, record, self.group_id)
        try:
            ended: Ended | None = await self._admit(job)
            if ended is None:
                started = time.time()  # the run's dwell and duration, for its history slot
                dwell_s = started - max(job.enqueued_at_ms, job.not_before_ms or 0) / 1000
                ended = await self._run(job, record, runner, started)
                await self._end(job, ended, started, dwell_s)
            else:
                await self._end(job, ended)
        except BaseException as exc:
            if attempt is not None:
                attempt.failed(exc)
            raise
        if attempt is not None:
            attempt.ended(ended)

    async def _admit(self, job: JobRecord) -> Outcome | None:
        """None if `job` may run, else how it ends unrun: superseded by a newer job of its
        debounce key, cancelled, or expired. The debounce question is the one await: from
        the cancel check on nothing awaits until the handler runs (a chain step reads its
        parent's result first), so a cancel is seen here or finds the run in `runner.ctx`
        and stops it."""
        if job.debounce_key is not None and await self.admission.superseded(job):
            return Outcome.SUPERSEDED
        cancelled = self._cancelled
        if cancelled and job.job_id in cancelled:
            return Outcome.CANCELLED
        expires_at = job.expires_at_ms
        if expires_at is not None and now_ms() >= expires_at:
            return Outcome.EXPIRED
        return None

    async def _run(self, job: JobRecord, record: Record, runner: Runner,
                   started: float) -> Ended:
        """The handler's run (from `started`, wall clock) on the job's payload, in its
        finish transaction if it has one, and how it ended: succeeded, duplicate,
        cancelled, or retried or dead-lettered (a payload that does not fit, unrun)."""
        try:
            payload = self.handler.parse_payload(job.payload)
        except BadRecord as bad:
            failure = FailureInfo.from_exception(bad, bad.reason, now_ms())
            await self.retries.dead_letter(job, record, failure)
            log.warning("job %s (%s) dead-lettered without a run: %s", job.job_id,
                        job.job_type, bad.reason,
                        extra=job_fields(job, record, reason=bad.reason))
            return failure
        if job.attempt > 1:
            log.info("job %s (%s) retry: attempt %d starts", job.job_id, job.job_type,
                     job.attempt, extra=job_fields(job, record))
        finish = self.finisher.finish_for(job)
        for run in range(1 + RERUNS_AFTER_ROLLBACK):
            ctx = JobContext(job, topic=record.topic, partition=record.partition,
                             offset=record.offset, dedup=self.dedup, lend_slot=self.lend_slot,
                             children=self.children, finish=finish, careful=run > 0)
            error: Exception | None = None
            try:
                if finish is not None:
                    await call_finished(self._call_handler, finish, runner, payload, ctx,
                                        self.lend_slot)
                else:  # a cancel meanwhile finds the run in `runner.ctx`, and stops it
                    await self._call_handler(runner, payload, ctx)
            except RunFailed as failed:
                error = failed.error
            if not ctx.rolled_back_with_others or ctx.cancelled or run == RERUNS_AFTER_ROLLBACK:
                break
            # Another job's failure rolled back the transaction this run's ctx.once()
            # shared: nothing of it was written. It runs again now, in a savepoint of
            # its own, on a fresh payload (the handler may have changed the last one).
            log.info("job %s (%s) runs again: its ctx.once() was rolled back with another "
                     "job's failure", job.job_id, job.job_type, extra=job_fields(job, record))
            payload = self.handler.parse_payload(job.payload)
        if ctx.cancelled and await self.admission.confirmed(job):
            # Whatever the run did: its ctx.once() could not commit (the cancel holds the
            # dedup row), and a failure is not retried.
            return Outcome.CANCELLED
        if error is None:
            return Outcome.SUCCEEDED
        if isinstance(error, AlreadyDone):
            met_cancel = await self.admission.cancelled_instead(job)
            return Outcome.CANCELLED if met_cancel else Outcome.DUPLICATE
        return await self.retries.failed(job, record, error, int(started * 1000))

    async def _end(self, job: JobRecord | None, ended: Ended, started: float | None = None,
                   dwell_s: float = 0.0) -> None:
        """The one place a job's end is recorded, once its outcome is durable (a retry or
        a dead letter acknowledged by the broker): the row of a job that keeps one and did
        not succeed (its result says why, its batch counts it), its unique key given back
        unless it waits in a delay tier, then its outcome and a dead letter's reason
        counted (with, for a run that `started` at that wall-clock time, its duration and
        `dwell_s` in its history slot).
        `job` is None for a record that is not a job."""
        if isinstance(ended, FailureInfo):
            outcome, failure = Outcome.DEAD_LETTERED, ended
        else:
            outcome, failure = ended, None
        if job is not None:
            if outcome is not Outcome.SUCCEEDED:
                await self._record_end(job, outcome, failure)
            if (job.unique_key is not None or job.debounce_key is not None) \
                    and outcome is not Outcome.RETRIED:
                await self.admission.give_back(job)  # finished: its unique key is free again
        if failure is not None:
            self.dead_letter_reasons[failure.reason] += 1
        now = time.time()
        self.slots.tick(int(now * 1000))
        self.outcomes[outcome] += 1
        if started is not None:
            self.slots.observe(now - started, dwell_s)
            if self.tenant_dwell is not None:
                self.tenant_dwell.observe(job.tenant if job else None, dwell_s)

    async def _record_end(self, job: JobRecord, outcome: Outcome,
                          failure: FailureInfo | None = None) -> None:
        """The row of a job that keeps one (a kept result, a batch member, a chain step)
        and did not succeed: its result says why, its batch counts it. Also the relay's,
        for a job cancelled in a delay tier (which the relay counts)."""
        ending = ending_row(outcome, failure)
        if ending is not None:
            await record_ending(self.finisher, job, *ending, self.stopping)

    # -- what the phases use ----------------------------------------------------------------

    async def _not_a_job(self, record: Record, bad: BadRecord) -> None:
        """A record that failed to decode: a heartbeat is taken in, anything else is
        dead-lettered as it was and ended."""
        if is_heartbeat(record.key, record.headers):
            # Written by a worker whose TOML turned heartbeats on: not a job, not bad.
            self._beat(TopicPartition(record.topic, record.partition), record.timestamp)
            return
        failure = await self.dead_letter_raw(record, bad)
        log.warning("record %s/%d/%d is not a job, dead-lettered without a run: %s",
                    record.topic, record.partition, record.offset, bad.reason,
                    extra=job_fields(None, record, reason=bad.reason))
        await self._end(None, failure)
