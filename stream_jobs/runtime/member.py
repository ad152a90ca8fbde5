"""A consumer-group member that commits only what is finished.

Shared by the worker (lanes, group `T.worker`) and the relay (delay tiers, group
`T.relay`). It owns the aiokafka consumer, one `OffsetTracker` per assigned partition,
backpressure by pausing partitions, periodic commits, and the rebalance contract:
revoked partitions stop dispatching, in-flight work gets a bounded grace period, the
tracker's position is committed, and buffers are dropped. Subclasses say what to do
with a record (`handle`) and which records run in order (`chain_of`).

Records run on `Runner`s: at most `concurrency` tasks, each taking the next ready chain's
head as soon as it is done with one, so a record costs no task of its own. A runner's
`deadline` (set by the subclass around the part that may time out) is enforced by one
watchdog timer per member rather than a timer per record.

Flow control (off unless asked for, so the default path is unchanged): topics may be
lanes with weights (`lane_weights`), each lane keeping its own ready queue and
`stream_jobs.lanes.LanePicker` choosing which lane starts next; a `TokenBucket`
(`set_rate`) holds starts to a rate; and a `screen` may finish records at fetch time
without starting them (heartbeats, expired jobs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    KafkaError,
    TopicAuthorizationFailedError,
)

from stream_jobs.clock import now_ms
from stream_jobs.errors import Abandoned, BadRecord
from stream_jobs.failures import FailureInfo
from stream_jobs.kafka.connection import access_denied, connect_error, kafka_client_kwargs
from stream_jobs.kafka.producer import JobProducer, until_acked
from stream_jobs.lanes import LanePicker
from stream_jobs.naming import dlq_topic
from stream_jobs.offsets import OffsetTracker
from stream_jobs.ratelimit import TokenBucket
from stream_jobs.record import JobRecord, Record, dead_letter_headers, dead_letter_origin
from stream_jobs.settings import Settings

log = logging.getLogger("stream_jobs.consumer")

# A runner lets other tasks run after this many records in a row (handlers that never
# await would otherwise hold the loop, and fetches, heartbeats and commits would wait).
RUNNER_YIELD_EVERY = 64
# Jobs waiting for their group commit that may lend their slot at once (`lend_slot`): two
# default-sized batches' worth, one committing while the next fills.
MAX_LENT_SLOTS = 1000
# Bytes of record values a partition may have fetched but not finished before it pauses,
# whatever the record count allows (2,000 records of 1 MB would be 2 GB).
MAX_BUFFERED_BYTES = 16 * 1024 * 1024
# How often the watchdog looks for runners past their deadline: a deadline fires at most
# this late.
WATCHDOG_TICK_S = 0.05


@dataclass(eq=False, slots=True)
class Runner:
    """A task that runs the heads of ready chains, one record at a time."""

    task: asyncio.Task[None] | None = None
    # The partition whose record it runs now; None between records.
    work: PartitionWork | None = None
    # Loop time by which the current step must end (`math.inf`: none); the subclass sets
    # it around a handler call and reads `expired` when the call is cancelled.
    deadline: float = math.inf
    expired: bool = False
    # Set when revocation's grace period ran out on its record: the record is abandoned.
    abandoned: bool = False
    # Resolved when the current record is done (created by `release` only).
    record_done: asyncio.Future[None] | None = None


@dataclass(eq=False)
class Chain:
    """Records that run one after another in offset order (one key, or one partition).

    A chain is either running its head or waiting in the member's ready queue, never both.
    """

    work: PartitionWork
    key: Hashable
    records: deque[Record] = field(default_factory=deque)


@dataclass(eq=False)
class PartitionWork:
    """What one member holds for one assigned partition."""

    tp: TopicPartition
    # The ready queue of the partition's lane: chains waiting for a dispatch slot.
    ready: deque[Chain] = field(default_factory=deque)
    tracker: OffsetTracker | None = None
    revoked: bool = False
    paused: bool = False
    # Records fetched and not finished, and their values' bytes (large jobs fill the
    # buffer sooner than their count says).
    buffered: int = 0
    buffered_bytes: int = 0
    chains: dict[Hashable, Chain] = field(default_factory=dict)

    def dispatched(self, offset: int, size: int = 0) -> None:
        if self.tracker is None:
            self.tracker = OffsetTracker(offset)
        self.tracker.dispatched(offset)
        self.buffered += 1
        self.buffered_bytes += size

    def finished(self, offset: int, size: int = 0) -> None:
        # Also while revoked: work finishing in the grace period is committed.
        if self.tracker is not None:
            self.tracker.finished(offset)
        self.buffered -= 1
        self.buffered_bytes -= size


def over_buffer(work: PartitionWork, max_records: int) -> bool:
    """Whether the partition holds enough to pause its fetching: `max_records` records, or
    `MAX_BUFFERED_BYTES` of values."""
    return work.buffered >= max_records or work.buffered_bytes >= MAX_BUFFERED_BYTES


def drained_enough(work: PartitionWork, max_records: int) -> bool:
    """Whether a partition paused by `over_buffer` may fetch again: half of both drained."""
    return (work.buffered <= max_records // 2
            and work.buffered_bytes <= MAX_BUFFERED_BYTES // 2)


def _size(record: Record) -> int:
    return len(record.value) if record.value is not None else 0


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, member: GroupMember) -> None:
        self._member = member

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        await self._member.release(list(revoked))

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        self._member.adopt(list(assigned))


class GroupMember(ABC):
    """One member of a consumer group that dispatches records and commits finished offsets."""

    def __init__(self, settings: Settings, group_id: str, topics: list[str], *,
                 job_type: str, producer: JobProducer, concurrency: int, grace_s: float,
                 commit_interval_s: float, max_buffered: int, fetch_records: int = 500,
                 lane_weights: Sequence[tuple[str, int]] = ()) -> None:
        self.settings = settings
        self.job_type = job_type
        self.producer = producer
        # Set when the member is asked to stop: writes still failing then are abandoned.
        self.stopping = asyncio.Event()
        self.concurrency = concurrency
        # One ready queue per lane (topic -> queue); one queue when lanes are not weighted.
        self._ready: deque[Chain] = deque()
        self._queues: list[deque[Chain]] = [self._ready]
        self._queue_of: dict[str, deque[Chain]] = {}
        self._picker: LanePicker | None = None
        if len(lane_weights) > 1:
            self._queues = [deque() for _ in lane_weights]
            self._queue_of = {topic: q for (topic, _), q in zip(lane_weights, self._queues,
                                                                 strict=True)}
            self._picker = LanePicker([weight for _, weight in lane_weights])
        self._bucket: TokenBucket | None = None
        self._token_timer: asyncio.TimerHandle | None = None
        # Finishes a record at fetch time, without starting it, when it returns True.
        self.screen: Callable[[PartitionWork, Record], bool] | None = None
        self._runners: set[Runner] = set()
        self._lent = 0
        self._watchdog: asyncio.TimerHandle | None = None
        self.group_id = group_id
        self.topics = topics
        self.grace_s = grace_s
        self.commit_interval_s = commit_interval_s
        self.max_buffered = max_buffered
        self.fetch_records = fetch_records
        self.partitions: dict[TopicPartition, PartitionWork] = {}
        kwargs = kafka_client_kwargs(settings)
        # A fetch may wait for a whole rebalance; it needs more than the default 40 s.
        kwargs["request_timeout_ms"] = max(settings.kafka_request_timeout_ms, 40_000)
        self.consumer = AIOKafkaConsumer(
            **kwargs,
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
        )
        self._last_commit = 0.0

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

    # -- dispatch ---------------------------------------------------------------------------

    def dispatch(self, work: PartitionWork, records: list[Record]) -> None:
        """Track fetched records (offset order), extend their chains, start what fits."""
        screen = self.screen
        for record in records:
            size = _size(record)
            work.dispatched(record.offset, size)
            if screen is not None and screen(work, record):
                work.finished(record.offset, size)
                continue
            key = self.chain_of(record)
            chain = work.chains.get(key)
            if chain is None:
                chain = work.chains[key] = Chain(work, key)
                work.ready.append(chain)
            chain.records.append(record)
        self._pump()

    def _pump(self) -> None:
        """Start runners while fewer than `concurrency` run and chains are ready.

        Tasks exist only for running records' runners, so a deep buffer costs no tasks and
        no waiters. A runner that finds nothing it may start ends.
        """
        ready = sum(len(q) for q in self._queues) if self._picker else len(self._ready)
        # A runner whose job only waits for its group commit lent its slot (`lend_slot`).
        active = len(self._runners) - self._lent
        for _ in range(min(self.concurrency, ready) - active):
            runner = Runner()
            self._runners.add(runner)
            runner.task = asyncio.create_task(self._run(runner))

    def lend_slot(self) -> _LentSlot:
        """Around a running job's wait for its group commit: the job holds no resource of
        the handler's meanwhile, so another job may start in its slot. That keeps
        `concurrency` jobs recording while earlier ones wait, so the batches fill. Up to
        `MAX_LENT_SLOTS` at once; the chain of the waiting job stays held (key order)."""
        return _LentSlot(self)

    def _take(self) -> Chain | None:
        """The next chain to run a record of, or None if none may start now. Chains of a
        revoked partition (or all, once stopping) are dropped unstarted: their records stay
        unfinished and go to the next owner."""
        if self._picker is None and self._bucket is None:
            ready = self._ready
            while ready:
                chain = ready.popleft()
                if chain.work.revoked or self.stopping.is_set():
                    chain.work.chains.pop(chain.key, None)
                    continue
                return chain
            return None
        return self._take_flow()

    def _take_flow(self) -> Chain | None:
        """`_take` with weighted lanes and/or a rate: the picker chooses the lane, the
        bucket decides whether anything may start now (if not, a timer comes back when a
        token is due). A token is checked before the pick so a refused start costs no
        lane its turn."""
        queues = self._queues
        picker = self._picker
        bucket = self._bucket
        while True:
            if bucket is not None and not bucket.has_token(time.monotonic()):
                if any(queues):
                    self._wake_for_token(bucket)
                return None
            lane = picker.pick(queues) if picker is not None else (0 if queues[0] else None)
            if lane is None:
                return None
            chain = queues[lane].popleft()
            work = chain.work
            if work.revoked or self.stopping.is_set():
                work.chains.pop(chain.key, None)
                continue
            if bucket is not None:
                bucket.try_take(time.monotonic())
            return chain

    async def _run(self, runner: Runner) -> None:
        """A runner's life: run ready chains' heads until none may start now."""
        try:
            ran = 0
            while (chain := self._take()) is not None:
                await self._run_head(runner, chain)
                ran += 1
                if len(self._runners) - self._lent > self.concurrency:
                    break  # started in a lent slot, which is back: the slot is over
                if ran % RUNNER_YIELD_EVERY == 0:
                    await asyncio.sleep(0)
        finally:
            self._runners.discard(runner)
            if runner.abandoned:
                self._pump()  # the chains it would have taken next

    async def _run_head(self, runner: Runner, chain: Chain) -> None:
        work = chain.work
        record = chain.records[0]
        runner.work = work
        finished = False
        try:
            await self.handle(work, record, runner)
            finished = True
        except Abandoned:
            pass
        except Exception:
            # A bug in our own code, not in a handler: the offset stays unfinished, so the
            # partition stops committing and the record is delivered again after a restart.
            log.exception("%s: unexpected error on %s; its offset stays uncommitted",
                          self.group_id, work.tp)
        finally:
            runner.work = None
            runner.deadline = math.inf
            if finished:
                chain.records.popleft()
                work.finished(record.offset, _size(record))
                self.relieve(work)
            if finished and chain.records and not work.revoked:
                work.ready.append(chain)
            else:
                work.chains.pop(chain.key, None)
            done = runner.record_done
            if done is not None:
                runner.record_done = None
                if not done.done():
                    done.set_result(None)

    def watch(self) -> None:
        """Make sure the watchdog runs: call after setting a runner's deadline."""
        if self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().call_later(WATCHDOG_TICK_S,
                                                                   self._watch)

    def _watch(self) -> None:
        """Cancel runners past their deadline; come back while any deadline is set."""
        self._watchdog = None
        now = asyncio.get_running_loop().time()
        armed = False
        for runner in self._runners:
            if runner.deadline == math.inf or runner.expired:
                continue
            if runner.deadline <= now and runner.task is not None:
                runner.expired = True
                runner.task.cancel()
            else:
                armed = True
        if armed:
            self.watch()

    def _wake_for_token(self, bucket: TokenBucket) -> None:
        if self._token_timer is not None:
            return
        delay = bucket.wait_s(time.monotonic())
        if delay != float("inf"):
            self._token_timer = asyncio.get_running_loop().call_later(delay, self._token_due)

    def _token_due(self) -> None:
        self._token_timer = None
        self._pump()

    def set_rate(self, rate_per_s: float | None) -> None:
        """Start jobs at most `rate_per_s` a second from now on (None: no limit)."""
        if self._token_timer is not None:
            self._token_timer.cancel()
            self._token_timer = None
        now = time.monotonic()
        if rate_per_s is None:
            self._bucket = None
        elif self._bucket is None:
            self._bucket = TokenBucket(rate_per_s, now)
        else:
            self._bucket.set_rate(rate_per_s, now)
        self._pump()

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        try:
            await self.consumer.start()
        except KafkaConnectionError as exc:
            await self.consumer.stop()
            raise await connect_error(self.settings, exc) from exc
        self.consumer.subscribe(self.topics, listener=_Listener(self))

    async def poll_once(self, timeout_ms: int = 200) -> int:
        """Fetch one batch, dispatch it, apply backpressure, commit if due; records fetched."""
        try:
            batches = await self.consumer.getmany(timeout_ms=timeout_ms,
                                                  max_records=self.fetch_records)
        except (GroupAuthorizationFailedError, TopicAuthorizationFailedError) as exc:
            raise access_denied(self.settings, f"read {', '.join(self.topics)} in consumer "
                                f"group {self.group_id} (Read on the topics and the group)"
                                ) from exc
        count = 0
        for tp, records in batches.items():
            work = self.partitions.get(tp)
            if work is None or work.revoked or not records:
                continue
            count += len(records)
            self.dispatch(work, records)
            if not work.paused and over_buffer(work, self.max_buffered):
                self.pause(work)
        loop = asyncio.get_running_loop()
        if loop.time() - self._last_commit >= self.commit_interval_s:
            await self.commit()
        return count

    async def stop(self) -> None:
        """Stop dispatching, give in-flight work the grace period, commit, leave the group."""
        for timer in (self._token_timer, self._watchdog):
            if timer is not None:
                timer.cancel()
        self._token_timer = self._watchdog = None
        with contextlib.suppress(Exception):
            await self.release(list(self.partitions))
        await self.consumer.stop()

    # -- durable writes -----------------------------------------------------------------------

    async def write(self, topic: str, job: JobRecord) -> None:
        """Write `job` and wait for the ack, retrying; `Abandoned` once stopping."""
        await until_acked(lambda: self.producer.send(topic, job), self.stopping)

    async def dead_letter_raw(self, record: Record, bad: BadRecord) -> None:
        """An undecodable record goes to the type's DLQ with its bytes as they were."""
        headers = dead_letter_headers(
            record.headers,
            failure=FailureInfo.from_exception(bad, bad.reason, now_ms()),
            origin=dead_letter_origin(record.topic, record.partition, record.offset),
            job_type=self.job_type)
        target = dlq_topic(self.settings.topic_prefix, self.job_type)
        await until_acked(lambda: self.producer.send_raw(target, record.key, record.value,
                                                         headers), self.stopping)

    # -- flow control -----------------------------------------------------------------------

    def pause(self, work: PartitionWork) -> None:
        work.paused = True
        self.consumer.pause(work.tp)

    def resume(self, work: PartitionWork) -> None:
        if work.paused and not work.revoked:
            work.paused = False
            self.consumer.resume(work.tp)

    def relieve(self, work: PartitionWork) -> None:
        """Resume a partition paused for backpressure once half its buffer has drained."""
        if work.paused and drained_enough(work, self.max_buffered):
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
        except KafkaError as exc:
            # A rebalance is under way or we were fenced: the new owner starts from the
            # last successful commit, so at worst finished work is seen again (dedup).
            log.warning("commit of %s failed: %s", self.group_id, exc)
            return
        for work in works:
            if work.tp in offsets and work.tracker is not None:
                work.tracker.mark_committed(offsets[work.tp])

    async def release(self, tps: list[TopicPartition]) -> None:
        """Revocation: stop, wait up to the grace period, cancel the rest, commit, drop."""
        works = [self.partitions[tp] for tp in tps if tp in self.partitions]
        for work in works:
            work.revoked = True
        busy = [r for r in self._runners if r.work in works]
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
            late = [r for r in self._runners if r.work in works and r.task is not None]
            for runner in late:
                runner.abandoned = True
                assert runner.task is not None
                runner.task.cancel()
            if late:
                log.warning("%s: %d jobs did not finish within the %.0f s grace period; "
                            "they will run again on the partition's next owner",
                            self.group_id, len(late), self.grace_s)
                await asyncio.gather(*(r.task for r in late if r.task is not None),
                                     return_exceptions=True)
        await self.commit(works)
        for work in works:
            self.partitions.pop(work.tp, None)

    def adopt(self, tps: list[TopicPartition]) -> None:
        """Assignment: fresh state per partition; pauses from before are re-evaluated."""
        for tp in tps:
            if tp not in self.partitions:
                self.partitions[tp] = PartitionWork(tp, self._queue_of.get(tp.topic,
                                                                           self._queues[0]))
        # Nothing is buffered for a fresh assignment, so nothing should stay paused.
        stale = [tp for tp in self.consumer.paused() if tp in self.partitions
                 and not self.partitions[tp].paused]
        if stale:
            self.consumer.resume(*stale)

    # -- idleness (drain primitive) ---------------------------------------------------------

    def in_flight(self) -> int:
        return sum(w.buffered for w in self.partitions.values())

    async def caught_up(self) -> bool:
        """Nothing buffered, everything committed, and every assigned partition read to its end."""
        if self.in_flight():
            return False
        assignment = list(self.consumer.assignment())
        if not assignment:
            return False
        ends = await self.consumer.end_offsets(assignment)
        for tp in assignment:
            work = self.partitions.get(tp)
            committed = await self.consumer.committed(tp)
            position = (work.tracker.position if work is not None and work.tracker is not None
                        else committed or 0)
            if position < ends[tp] or (committed or 0) < position:
                return False
        return True


class _LentSlot:
    """`with member.lend_slot():` (a class: it runs once per job on the hot path)."""

    __slots__ = ("_lent", "_member")

    def __init__(self, member: GroupMember) -> None:
        self._member = member
        self._lent = False

    def __enter__(self) -> None:
        member = self._member
        if member._lent < MAX_LENT_SLOTS:
            member._lent += 1
            self._lent = True
            member._pump()

    def __exit__(self, *exc: object) -> None:
        if self._lent:
            self._member._lent -= 1
