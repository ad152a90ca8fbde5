"""The delay relay: holds records in a type's delay tiers until they are due, then
produces them back to their lane.

Group `P.T.relay` reads each tier partition in order. When the head record is not due
the partition is paused and a timer is set (no busy polling, no sleeping inside a poll, so
`max.poll.interval.ms` never matters). A record is held at most one tier delay; if it is
still not due (a delay longer than the largest tier), it hops: it is written again to the
tier that fits what remains, and the partition moves on. Offsets are committed only
after the broker acknowledged the release or the hop.

A cancelled job (its ID in the worker's set of cancelled IDs, docs/control.md) is
finished here, counted `cancelled`, instead of being released or hopped; a held one is
woken by its cancel, so a job delayed an hour ends as soon as it is cancelled. An attempt
`stream-jobs retry-now` released early (its copy is in the lane already) is finished the
same way, woken by its notice, counted in `released_early` (not an outcome: the copy's
run is the attempt's outcome).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import replace

from stream_jobs.cancels.rules import ReleasedKey
from stream_jobs.clock import now_ms
from stream_jobs.errors import Abandoned, BadRecord
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.clients import AIOKAFKA, KafkaClients, Producer
from stream_jobs.logs import job_fields
from stream_jobs.naming import lane_topic, parse_topic, relay_group, tier_topic
from stream_jobs.outcomes import Outcome
from stream_jobs.record import (
    JobRecord,
    Record,
    decode_record,
)
from stream_jobs.retry import RetryPolicy, tier_for_delay
from stream_jobs.runtime.dispatch import PartitionWork, Runner
from stream_jobs.runtime.member import GroupMember
from stream_jobs.settings import Settings
from stream_jobs.tracing import Hop, job_spans

log = logging.getLogger("stream_jobs.relay")

# One chain per tier partition bounds the relay's work; no further limit is needed.
_UNBOUNDED = 1_000_000


class Relay(GroupMember):
    """Moves due records from a type's delay tiers back to its lanes (a service of its
    worker's, `stream_jobs.runtime.services`)."""

    name = "delay relay"

    def __init__(self, settings: Settings, policy: JobTypePolicy, producer: Producer, *,
                 grace_s: float = 10.0, commit_interval_s: float = 0.5,
                 max_buffered: int = 1000, kafka: KafkaClients = AIOKAFKA,
                 cancelled: set[str] | None = None,
                 outcomes: Counter[str] | None = None,
                 ended: Callable[[JobRecord], Awaitable[None]] | None = None,
                 released: set[ReleasedKey] | None = None) -> None:
        prefix = settings.topic_prefix
        tiers = [tier_topic(prefix, policy.job_type, tier) for tier in policy.retry_tiers]
        super().__init__(settings, relay_group(prefix, policy.job_type), tiers,
                         job_type=policy.job_type, producer=producer,
                         concurrency=_UNBOUNDED, grace_s=grace_s,
                         commit_interval_s=commit_interval_s, max_buffered=max_buffered,
                         kafka=kafka)
        self.policy = policy
        self.retry_policy = RetryPolicy(tiers=policy.retry_tiers, max_attempts=policy.max_attempts)
        self.released = 0
        self.hops = 0
        self._wake: dict[TopicPartition, asyncio.Event] = {}
        # Tier partitions whose head is held now, with the wall time (Unix ms) it waits for.
        self.holding: dict[TopicPartition, int] = {}
        # The worker's: cancelled IDs (kept current by its cancel watch) and its counters.
        self._cancelled: set[str] = cancelled if cancelled is not None else set()
        self.outcomes: Counter[str] = outcomes if outcomes is not None else Counter()
        self.held_jobs: dict[TopicPartition, str] = {}  # the job ID of each held head
        # The worker's: attempts released early by retry-now (stream_jobs/retry_now/).
        self._released: set[ReleasedKey] = released if released is not None else set()
        self.released_early = 0  # tier records finished because retry-now released them
        # The worker's record of a cancelled job's end (kept results, batch counters).
        self._ended = ended
        self._spans = job_spans()  # None unless something records traces

    def on_cancel(self, job_id: str) -> None:
        """A cancel arrived: wake the partition holding that job, which then finishes it."""
        for tp, held in list(self.held_jobs.items()):
            if held == job_id and (event := self._wake.pop(tp, None)) is not None:
                event.set()

    def chain_of(self, record: Record) -> Hashable:
        return None  # one chain per partition: strictly in order

    async def release(self, tps: list[TopicPartition]) -> None:
        # Held records are not work in progress: wake them so they give up at once.
        for tp in tps:
            event = self._wake.pop(tp, None)
            if event is not None:
                event.set()
        await super().release(tps)

    async def stop(self) -> None:
        self.stopping.set()
        await super().stop()

    def recheck(self) -> None:
        """Wake every held record to read the clock again now: one that is due goes, the
        others are held again. For a clock that jumps (`stream_jobs.testing`'s virtual
        one); the system clock's records wake by their timers."""
        for tp in list(self.holding):
            event = self._wake.pop(tp, None)
            if event is not None:
                event.set()

    async def handle(self, work: PartitionWork, record: Record, runner: Runner) -> None:
        prefix = self.settings.topic_prefix
        try:
            job = decode_record(key=record.key, value=record.value, headers=record.headers,
                                expected_type=self.policy.job_type,
                                max_payload_bytes=self.policy.payload_limit(self.settings))
        except BadRecord as bad:
            await self.dead_letter_raw(record, bad)
            log.warning("record %s/%d/%d in a delay tier is not a job, dead-lettered: %s",
                        record.topic, record.partition, record.offset, bad.reason,
                        extra=job_fields(None, record, reason=bad.reason))
            return
        if job.job_id in self._cancelled:
            await self._cancelled_here(job)
            return
        if self._released and self._passed_early(job):
            return
        tier = parse_topic(prefix, record.topic).tier or self.policy.retry_tiers[0]
        due = job.not_before_ms or 0
        now = now_ms()
        if due > now:
            hold_until = min(due, record.timestamp + self.retry_policy.max_hold_ms(tier))
            # A timer may wake a millisecond early against the wall clock; waking early
            # must not count as "still not due", which would send the record round again.
            self.held_jobs[work.tp] = job.job_id
            try:
                while hold_until > now:
                    await self._hold(work, hold_until, (hold_until - now) / 1000)
                    if job.job_id in self._cancelled:
                        await self._cancelled_here(job)
                        return
                    if self._released and self._passed_early(job):
                        return
                    now = now_ms()
            finally:
                self.held_jobs.pop(work.tp, None)
        if due > now:
            hop = tier_for_delay(self.policy.retry_tiers, (due - now) / 1000)
            await self._write(tier_topic(prefix, job.job_type, hop), job, Hop.DELAY, hop)
            self.hops += 1
            return
        lane = job.lane if job.lane in self.policy.priorities else "default"
        await self._write(lane_topic(prefix, job.job_type, lane),
                          replace(job, not_before_ms=None), Hop.RELEASE, tier)
        self.released += 1

    async def _write(self, topic: str, job: JobRecord, hop: Hop, tier: str) -> None:
        """A release or a hop, in its send span when traced: the job's next attempt (or
        hop) is its child, and it links to the write of the record it moves."""
        if self._spans is None:
            await self.write(topic, job)
        else:
            await self._spans.send(self.write, topic, job, hop, tier=tier)

    def _passed_early(self, job: JobRecord) -> bool:
        """Whether `job`'s attempt was released early (its copy is in the lane): then it
        is finished here, not released."""
        if (job.job_id, job.requeues, job.attempt) not in self._released:
            return False
        self.released_early += 1
        log.info("job %s (%s) attempt %d was retried now: its tier record is not released",
                 job.job_id, job.job_type, job.attempt, extra=job_fields(job, None))
        return True

    async def _cancelled_here(self, job: JobRecord) -> None:
        if self._ended is not None:
            await self._ended(job)
        self.outcomes[Outcome.CANCELLED] += 1

    async def _hold(self, work: PartitionWork, until_ms: int, seconds: float) -> None:
        """Pause the partition until the head is due, or until revocation (or `recheck`)
        wakes us."""
        wake = self._wake.setdefault(work.tp, asyncio.Event())
        self.pause(work)
        self.holding[work.tp] = until_ms
        try:
            # A held record lends its runner's slot: the dispatcher starts runners for the
            # chains that are ready only while its runners are fewer than them, so a head
            # fetched later on another partition would otherwise wait for this one's time.
            with self.lend_slot(), contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), seconds)
        finally:
            self.holding.pop(work.tp, None)
            self.resume(work)
        if work.revoked or self.stopping.is_set():
            raise Abandoned("revoked while holding a delayed record")
