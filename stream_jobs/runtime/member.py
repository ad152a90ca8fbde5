"""A consumer-group member that commits only what is finished.

Shared by the worker (lanes, group `T.worker`), the relay (delay tiers, group `T.relay`)
and shadow mode. It owns the group's `Consumer`, one `OffsetTracker` per assigned
partition (in its `PartitionWork`), backpressure by pausing partitions, periodic
commits, and the rebalance contract: revoked partitions stop dispatching, in-flight work
gets a bounded grace period, the tracker's position is committed, and buffers are
dropped. Subclasses say what to do with a record (`handle`), which records run in order
(`chain_of`) and, when their `Flow` screens, which to finish at fetch time (`screen`).
Which record runs next, and when, is the `Dispatcher`'s (`stream_jobs.runtime.dispatch`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stream_jobs.clock import now_ms
from stream_jobs.errors import BadRecord, CommitRefused
from stream_jobs.failures import FailureInfo
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.clients import AIOKAFKA, KafkaClients, Producer
from stream_jobs.kafka.producer import Written, until_acked
from stream_jobs.naming import dlq_topic
from stream_jobs.record import JobRecord, Record, dead_letter_headers, dead_letter_origin
from stream_jobs.runtime.dispatch import Dispatcher, LentSlot, PartitionWork, Runner
from stream_jobs.settings import Settings

log = logging.getLogger("stream_jobs.consumer")

# Bytes of record values a partition may have fetched but not finished before it pauses,
# whatever the record count allows (2,000 records of 1 MB would be 2 GB).
MAX_BUFFERED_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Flow:
    """How much a member takes in and how fast it starts it. A member keeps the one it was
    made with (`base_flow`) until `set_flow` gives it another: the worker does, from the
    type's rate limit and its share of the partitions."""

    # Records a partition may have fetched but not finished before it is paused.
    max_buffered: int
    # Records one fetch may return.
    fetch_records: int = 500
    # Starts per second (None: as fast as slots free up).
    rate_per_s: float | None = None
    # Whether `GroupMember.screen` sees each record at fetch time.
    screen: bool = False


def over_buffer(work: PartitionWork, max_records: int) -> bool:
    """Whether the partition holds enough to pause its fetching: `max_records` records, or
    `MAX_BUFFERED_BYTES` of values."""
    return work.buffered >= max_records or work.buffered_bytes >= MAX_BUFFERED_BYTES


def drained_enough(work: PartitionWork, max_records: int) -> bool:
    """Whether a partition paused by `over_buffer` may fetch again: half of both drained."""
    return (work.buffered <= max_records // 2
            and work.buffered_bytes <= MAX_BUFFERED_BYTES // 2)


class GroupMember(ABC):
    """One member of a consumer group that dispatches records and commits finished offsets."""

    def __init__(self, settings: Settings, group_id: str, topics: list[str], *,
                 job_type: str, producer: Producer, concurrency: int, grace_s: float,
                 commit_interval_s: float, max_buffered: int, fetch_records: int = 500,
                 lane_weights: Sequence[tuple[str, int]] = (),
                 kafka: KafkaClients = AIOKAFKA,
                 consumer_options: Mapping[str, Any] | None = None) -> None:
        self.settings = settings
        self.job_type = job_type
        self.producer = producer
        # Set when the member is asked to stop: writes still failing then are abandoned.
        self.stopping = asyncio.Event()
        self.group_id = group_id
        self.topics = topics
        self.grace_s = grace_s
        self.commit_interval_s = commit_interval_s
        self.base_flow = self.flow = Flow(max_buffered, fetch_records)
        self.partitions: dict[TopicPartition, PartitionWork] = {}
        self.dispatcher = Dispatcher(concurrency=concurrency, handle=self.handle,
                                     chain_of=self.chain_of, on_finished=self.relieve,
                                     stopping=self.stopping, lane_weights=lane_weights,
                                     name=group_id)
        self.consumer = kafka.consumer(
            settings,
            # A fetch may wait for a whole rebalance; it needs more than the default 40 s.
            request_timeout_ms=max(settings.kafka_request_timeout_ms, 40_000),
            group_id=group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=10_000,
            heartbeat_interval_ms=2_000,
            # Revocation waits up to grace_s for in-flight jobs; the group must wait too.
            rebalance_timeout_ms=int((grace_s + 30) * 1000),
            max_poll_interval_ms=300_000,
            # Small fetch buffers keep a worker's memory flat whatever the backlog; a record
            # larger than them is still returned whole (the broker always sends one batch).
            max_partition_fetch_bytes=256 * 1024,
            fetch_max_bytes=4 * 1024 * 1024,
            **(consumer_options or {}),
        )
        self._last_commit = 0.0
        # What the idle watch (`stream_jobs.runtime.idle`) reads: records fetched and
        # rebalances seen so far (it only grows: equal values mean nothing came in between),
        # whether the group has given this member its partitions (possibly none) since the
        # last revocation, and a poll that fetched nothing (it paces the watch's checks).
        self.taken_in = 0
        self.joined = False
        self.empty_poll = asyncio.Event()

    # -- subclass hooks -------------------------------------------------------------------

    @abstractmethod
    def chain_of(self, record: Record) -> Hashable:
        """Records with the same chain run one after another in offset order."""

    @abstractmethod
    async def handle(self, work: PartitionWork, record: Record, runner: Runner) -> None:
        """Finish one record. Returning marks it finished; raising leaves it unfinished.

        `runner` runs it; to bound a step, set `runner.deadline` (loop time) and call
        `watch()`: past the deadline the runner is cancelled with `runner.expired` set.
        """

    def screen(self, work: PartitionWork, record: Record) -> bool:
        """With `Flow.screen`: True finishes `record` at fetch time, without starting it."""
        return False

    # -- dispatch and flow ------------------------------------------------------------------

    @property
    def concurrency(self) -> int:
        return self.dispatcher.concurrency

    @property
    def max_buffered(self) -> int:
        return self.flow.max_buffered

    @property
    def fetch_records(self) -> int:
        return self.flow.fetch_records

    def set_flow(self, flow: Flow) -> None:
        """Take in and start work as `flow` says from now on."""
        self.flow = flow
        self.dispatcher.screen = self.screen if flow.screen else None
        self.dispatcher.set_rate(flow.rate_per_s)

    def dispatch(self, work: PartitionWork, records: list[Record]) -> None:
        self.dispatcher.dispatch(work, records)

    def watch(self) -> None:
        """Make sure the watchdog runs: call after setting a runner's deadline."""
        self.dispatcher.watch()

    def lend_slot(self) -> LentSlot:
        """See `Dispatcher.lend_slot`: a job waiting for its group commit lends its slot."""
        return self.dispatcher.lend_slot()

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        await self.consumer.start()
        self.consumer.subscribe(self.topics, listener=self)

    async def poll_once(self, timeout_ms: int = 200) -> int:
        """Fetch one batch, dispatch it, apply backpressure, commit if due; records fetched."""
        batches = await self.consumer.getmany(timeout_ms=timeout_ms,
                                              max_records=self.flow.fetch_records)
        count = 0
        max_buffered = self.flow.max_buffered
        for tp, records in batches.items():
            work = self.partitions.get(tp)
            if work is None or work.revoked or not records:
                continue
            count += len(records)
            self.dispatch(work, records)
            if not work.paused and over_buffer(work, max_buffered):
                self.pause(work)
        loop = asyncio.get_running_loop()
        if loop.time() - self._last_commit >= self.commit_interval_s:
            await self.commit()
        self.taken_in += count
        if not count:
            self.empty_poll.set()
        return count

    async def stop(self) -> None:
        """Stop dispatching, give in-flight work the grace period, commit, leave the group."""
        self.dispatcher.stop()
        with contextlib.suppress(Exception):
            await self.release(list(self.partitions))
        await self.consumer.stop()

    # -- durable writes -----------------------------------------------------------------------

    async def write(self, topic: str, job: JobRecord) -> Written:
        """Write `job` and wait for the ack, retrying; `Abandoned` once stopping."""
        return await until_acked(lambda: self.producer.send(topic, job), self.stopping)

    async def dead_letter_raw(self, record: Record, bad: BadRecord) -> FailureInfo:
        """An undecodable record goes to the type's DLQ with its bytes as they were; the
        failure its letter carries."""
        failure = FailureInfo.from_exception(bad, bad.reason, now_ms())
        headers = dead_letter_headers(
            record.headers,
            failure=failure,
            origin=dead_letter_origin(record.topic, record.partition, record.offset),
            job_type=self.job_type)
        target = dlq_topic(self.settings.topic_prefix, self.job_type)
        await until_acked(lambda: self.producer.send_raw(target, record.key, record.value,
                                                         headers), self.stopping)
        return failure

    # -- backpressure -------------------------------------------------------------------------

    def pause(self, work: PartitionWork) -> None:
        work.paused = True
        self.consumer.pause(work.tp)

    def resume(self, work: PartitionWork) -> None:
        if work.paused and not work.revoked:
            work.paused = False
            self.consumer.resume(work.tp)

    def relieve(self, work: PartitionWork) -> None:
        """Resume a partition paused for backpressure once half its buffer has drained."""
        if work.paused and drained_enough(work, self.flow.max_buffered):
            self.resume(work)

    # -- commits and rebalance --------------------------------------------------------------

    async def commit(self, only: Iterable[PartitionWork] | None = None) -> None:
        """Commit each tracker's position (the lowest unfinished offset)."""
        self._last_commit = asyncio.get_running_loop().time()
        works = list(self.partitions.values()) if only is None else list(only)
        offsets = {w.tp: w.tracker.position for w in works
                   if w.tracker is not None and w.tracker.needs_commit}
        if not offsets:
            return
        try:
            await self.consumer.commit(offsets)
        except CommitRefused as exc:
            # A rebalance is under way or we were fenced: the new owner starts from the
            # last successful commit, so at worst finished work is seen again (dedup).
            log.warning("commit of %s failed: %s", self.group_id, exc.__cause__ or exc,
                        extra={"group": self.group_id, "partitions": _named(offsets)})
            return
        for work in works:
            if work.tp in offsets and work.tracker is not None:
                work.tracker.mark_committed(offsets[work.tp])

    async def release(self, tps: list[TopicPartition]) -> None:
        """Revocation: stop, wait up to the grace period, cancel the rest, commit, drop."""
        works = [self.partitions[tp] for tp in tps if tp in self.partitions]
        for work in works:
            work.revoked = True
        busy = self.dispatcher.runners_on(works)
        if busy:
            loop = asyncio.get_running_loop()
            waits: list[asyncio.Future[None]] = []
            for runner in busy:
                if runner.record_done is None:
                    runner.record_done = loop.create_future()
                waits.append(runner.record_done)
            await asyncio.wait(waits, timeout=self.grace_s)
            # No await since the wait: a runner still on one of these partitions has been
            # on the same record all along.
            late = [r for r in self.dispatcher.runners_on(works) if r.task is not None]
            for runner in late:
                runner.abandoned = True
                assert runner.task is not None
                runner.task.cancel()
            if late:
                log.warning("%s: %d jobs did not finish within the %.0f s grace period; "
                            "they will run again on the partition's next owner",
                            self.group_id, len(late), self.grace_s,
                            extra={"group": self.group_id, "partitions": _named(tps)})
                await asyncio.gather(*(r.task for r in late if r.task is not None),
                                     return_exceptions=True)
        await self.commit(works)
        for work in works:
            self.partitions.pop(work.tp, None)
            self.dispatcher.forget(work)

    def adopt(self, tps: list[TopicPartition]) -> None:
        """Assignment: fresh state per partition; pauses from before are re-evaluated."""
        for tp in tps:
            if tp not in self.partitions:
                self.partitions[tp] = self.dispatcher.work_for(tp)
        # Nothing is buffered for a fresh assignment, so nothing should stay paused.
        stale = [tp for tp in self.consumer.paused() if tp in self.partitions
                 and not self.partitions[tp].paused]
        if stale:
            self.consumer.resume(*stale)

    # -- idleness (drain primitive) ---------------------------------------------------------

    def in_flight(self) -> int:
        return sum(w.buffered for w in self.partitions.values())

    async def caught_up(self) -> bool:
        """Nothing buffered, everything committed, and every assigned partition read to its
        end. False until the group has given this member its partitions; true for a member
        the group gave none (more members than partitions), which has nothing to read."""
        if self.in_flight() or not self.joined:
            return False
        assignment = list(self.consumer.assignment())
        if not assignment:
            return True
        ends = await self.consumer.end_offsets(assignment)
        for tp in assignment:
            work = self.partitions.get(tp)
            committed = await self.consumer.committed(tp)
            position = (work.tracker.position if work is not None and work.tracker is not None
                        else committed or 0)
            if position < ends[tp] or (committed or 0) < position:
                return False
        return True

    # -- the group's rebalance listener (`stream_jobs.kafka.consumer.RebalanceListener`) ---

    async def on_revoked(self, revoked: list[TopicPartition]) -> None:
        self.joined = False
        self.taken_in += 1
        if revoked:
            log.info("%s: rebalance revoked %s", self.group_id, ", ".join(_named(revoked)),
                     extra={"group": self.group_id, "partitions": _named(revoked)})
        await self.dispatcher.revoking([self.partitions[tp] for tp in revoked
                                        if tp in self.partitions], self.grace_s)
        await self.release(revoked)

    async def on_assigned(self, assigned: list[TopicPartition]) -> None:
        log.info("%s: rebalance assigned %s", self.group_id,
                 ", ".join(_named(assigned)) or "nothing",
                 extra={"group": self.group_id, "partitions": _named(assigned)})
        # Made before the first await: a fetch may return the new partitions' records
        # while this callback still runs, and they need somewhere to go.
        self.adopt(assigned)
        await self.dispatcher.assigned(self.consumer, assigned)
        self.taken_in += 1
        self.joined = True


def _named(tps: Iterable[TopicPartition]) -> list[str]:
    """`topic/partition` of each, sorted: how log lines name a set of partitions."""
    return sorted(f"{tp.topic}/{tp.partition}" for tp in tps)
