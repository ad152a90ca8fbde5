"""Dispatch: which fetched record runs next, on which runner, and when it may start.

A group member (`stream_jobs.runtime.member`) hands each fetch to its `Dispatcher`, which
keeps the records of every assigned partition in chains (one key, or one partition, in
offset order) and runs chains' heads on `Runner`s: at most `concurrency` tasks, each
taking the next ready chain's head as soon as it is done with one, so a record costs no
task of its own. A runner's `deadline` (set by the member around the part that may time
out) is enforced by one watchdog timer rather than a timer per record. A record whose
handler outlives its runner (a sync handler's thread, which cannot be stopped) leaves a
`hold`: its slot and its chain stay taken until the hold resolves.

Flow control is off unless asked for, so the default path stays the fast one: topics may
be lanes with weights, each lane keeping its own ready queue and
`stream_jobs.lanes.LanePicker` choosing which lane starts next; a `TokenBucket` holds
starts to a rate (`set_rate`); and a `screen` may finish records at fetch time without
starting them (heartbeats, expired jobs).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from stream_jobs.errors import Abandoned
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.consumer import Consumer
from stream_jobs.lanes import LanePicker
from stream_jobs.logs import job_fields
from stream_jobs.offsets import OffsetTracker
from stream_jobs.ratelimit import TokenBucket
from stream_jobs.record import Record

if TYPE_CHECKING:
    from stream_jobs.context import JobContext

log = logging.getLogger("stream_jobs.consumer")

# A runner lets other tasks run after this many records in a row (handlers that never
# await would otherwise hold the loop, and fetches, heartbeats and commits would wait).
RUNNER_YIELD_EVERY = 64
# Jobs waiting for their group commit that may lend their slot at once (`lend_slot`): two
# default-sized batches' worth, one committing while the next fills.
MAX_LENT_SLOTS = 1000
# How often the watchdog looks for runners past their deadline: a deadline fires at most
# this late.
WATCHDOG_TICK_S = 0.05


@dataclass(eq=False, slots=True)
class Runner:
    """A task that runs the heads of ready chains, one record at a time."""

    task: asyncio.Task[None] | None = None
    # The partition whose record it runs now; None between records. `record` is that
    # record (left as it was between records; read by the stall monitor while `work` is set).
    work: PartitionWork | None = None
    record: Record | None = None
    # Loop time by which the current step must end (`math.inf`: none); the member sets
    # it around a handler call and reads `expired` when the call is cancelled.
    deadline: float = math.inf
    expired: bool = False
    # Set when revocation's grace period ran out on its record: the record is abandoned.
    abandoned: bool = False
    # Resolved when the current record is done (created by `record_done_of` only).
    record_done: asyncio.Future[None] | None = None
    # Set by the member when the record's handler runs on after the record is done (a
    # sync handler's thread): until it resolves, the slot and the chain stay taken.
    hold: asyncio.Future[None] | None = None
    # The context of the job whose handler it calls now (None outside the call): a cancel
    # finds a running job here (`stream_jobs.runtime.admission`), at no cost per job.
    ctx: JobContext | None = None


@dataclass(eq=False)
class Chain:
    """Records that run one after another in offset order (one key, or one partition).

    A chain is either running its head or waiting in its lane's ready queue, never both.
    """

    work: PartitionWork
    key: Hashable
    records: deque[Record] = field(default_factory=deque)


class ReadyQueue(Protocol):
    """Chains waiting for a slot: a `deque`, or fair dispatch's `TenantRotation`."""

    def __len__(self) -> int: ...

    def append(self, chain: Chain, /) -> None: ...

    def appendleft(self, chain: Chain, /) -> None: ...

    def popleft(self) -> Chain: ...


@dataclass(eq=False)
class PartitionWork:
    """What one member holds for one assigned partition."""

    tp: TopicPartition
    # The ready queue of the partition's lane: chains waiting for a dispatch slot.
    ready: ReadyQueue = field(default_factory=lambda: deque[Chain]())
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


def record_size(record: Record) -> int:
    return len(record.value) if record.value is not None else 0


Handle = Callable[[PartitionWork, Record, Runner], Awaitable[None]]
Screen = Callable[[PartitionWork, Record], bool]


class Dispatcher:
    """Runs fetched records' chains on at most `concurrency` runners.

    `handle(work, record, runner)` finishes one record (returning marks it finished,
    `Abandoned` or any other exception leaves it unfinished); `chain_of(record)` says
    which records run in order; `on_finished(work)` is told after each finished record.
    """

    def __init__(self, *, concurrency: int, handle: Handle,
                 chain_of: Callable[[Record], Hashable],
                 on_finished: Callable[[PartitionWork], None], stopping: asyncio.Event,
                 lane_weights: Sequence[tuple[str, int]] = (), name: str = "") -> None:
        self.concurrency = concurrency
        self._handle = handle
        self._chain_of = chain_of
        self._on_finished = on_finished
        self._stopping = stopping
        self._name = name
        # One ready queue per lane (topic -> queue); one queue when lanes are not weighted.
        self._ready: ReadyQueue = deque()
        self._queues: list[ReadyQueue] = [self._ready]
        self._queue_of: dict[str, ReadyQueue] = {}
        self._picker: LanePicker | None = None
        if len(lane_weights) > 1:
            self._queues = [deque() for _ in lane_weights]
            self._queue_of = {topic: q for (topic, _), q in zip(lane_weights, self._queues,
                                                                 strict=True)}
            self._picker = LanePicker([weight for _, weight in lane_weights])
        self._bucket: TokenBucket | None = None
        self._token_timer: asyncio.TimerHandle | None = None
        # Finishes a record at fetch time, without starting it, when it returns True.
        self.screen: Screen | None = None
        self.runners: set[Runner] = set()
        self._lent = 0
        # Slots taken by handlers that outlived their runners (`Runner.hold`).
        self._held = 0
        self._watchdog: asyncio.TimerHandle | None = None

    def work_for(self, tp: TopicPartition) -> PartitionWork:
        """Fresh state for a newly assigned partition, on its lane's ready queue."""
        return PartitionWork(tp, self._queue_of.get(tp.topic, self._queues[0]))

    def dispatch(self, work: PartitionWork, records: list[Record]) -> None:
        """Track fetched records (offset order), extend their chains, start what fits."""
        screen = self.screen
        for record in records:
            size = record_size(record)
            work.dispatched(record.offset, size)
            if screen is not None and screen(work, record):
                work.finished(record.offset, size)
                continue
            key = self._chain_of(record)
            chain = work.chains.get(key)
            if chain is None:
                chain = work.chains[key] = Chain(work, key)
                chain.records.append(record)
                work.ready.append(chain)
            else:
                chain.records.append(record)
        self._pump()

    def _pump(self) -> None:
        """Start runners while fewer than `concurrency` run and chains are ready.

        Tasks exist only for running records' runners, so a deep buffer costs no tasks and
        no waiters. A runner that finds nothing it may start ends.
        """
        ready = self._ready_count()
        # A runner whose job only waits for its group commit lent its slot (`lend_slot`);
        # a held slot has no runner that would take a ready chain.
        active = len(self.runners) - self._lent
        for _ in range(min(self.concurrency - self._held, ready) - active):
            runner = Runner()
            self.runners.add(runner)
            runner.task = asyncio.create_task(self._run(runner))

    def _ready_count(self) -> int:
        """Chains that may start now."""
        return sum(len(q) for q in self._queues) if self._picker else len(self._ready)

    def forget(self, work: PartitionWork) -> None:
        """`work`'s partition was revoked and its state dropped (a hook: fair dispatch
        forgets what it counted of it)."""

    async def assigned(self, consumer: Consumer, tps: Sequence[TopicPartition]) -> None:
        """Partitions assigned, their state made (a hook for fair dispatch)."""

    async def revoking(self, works: Sequence[PartitionWork], grace_s: float) -> None:
        """Partitions about to be released (a hook for fair dispatch)."""

    def lend_slot(self) -> LentSlot:
        """Around a running job's wait for its group commit: the job holds no resource of
        the handler's meanwhile, so another job may start in its slot. That keeps
        `concurrency` jobs recording while earlier ones wait, so the batches fill. Up to
        `MAX_LENT_SLOTS` at once; the chain of the waiting job stays held (key order)."""
        return LentSlot(self)

    def _lend(self) -> bool:
        if self._lent >= MAX_LENT_SLOTS:
            return False
        self._lent += 1
        self._pump()
        return True

    def _take_back(self) -> None:
        self._lent -= 1

    def _take(self) -> Chain | None:
        """The next chain to run a record of, or None if none may start now. Chains of a
        revoked partition (or all, once stopping) are dropped unstarted: their records stay
        unfinished and go to the next owner."""
        if self._picker is None and self._bucket is None:
            ready = self._ready
            while ready:
                chain = ready.popleft()
                if chain.work.revoked or self._stopping.is_set():
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
            if work.revoked or self._stopping.is_set():
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
                if len(self.runners) - self._lent + self._held > self.concurrency:
                    break  # started in a lent slot, which is back (or a slot is held)
                if ran % RUNNER_YIELD_EVERY == 0:
                    await asyncio.sleep(0)
        finally:
            self.runners.discard(runner)
            if runner.abandoned:
                self._pump()  # the chains it would have taken next

    async def _run_head(self, runner: Runner, chain: Chain) -> None:
        work = chain.work
        record = chain.records[0]
        runner.work = work
        runner.record = record
        finished = False
        try:
            await self._handle(work, record, runner)
            finished = True
        except Abandoned:
            pass
        except Exception:
            # A bug in our own code, not in a handler: the offset stays unfinished, so the
            # partition stops committing and the record is delivered again after a restart.
            log.exception("%s: unexpected error on %s; its offset stays uncommitted",
                          self._name, work.tp, extra=job_fields(None, record))
        finally:
            runner.work = None
            runner.deadline = math.inf
            if finished:
                chain.records.popleft()
                self._finished(work, record)
            hold = runner.hold
            if hold is not None:
                runner.hold = None
                self._hold(chain, finished, hold)
            elif finished and chain.records and not work.revoked:
                work.ready.append(chain)
            else:
                work.chains.pop(chain.key, None)
            done = runner.record_done
            if done is not None:
                runner.record_done = None
                if not done.done():
                    done.set_result(None)

    def _finished(self, work: PartitionWork, record: Record) -> None:
        """`record` is done: its offset may be committed past."""
        work.finished(record.offset, record_size(record))
        self._on_finished(work)

    def _hold(self, chain: Chain, finished: bool, hold: asyncio.Future[None]) -> None:
        """Keep a slot and `chain` (its key's next records wait in it) until `hold` ends;
        then the chain goes on as `_run_head` would have sent it on."""
        self._held += 1

        def release(_: asyncio.Future[None]) -> None:
            self._held -= 1
            work = chain.work
            if finished and chain.records and not work.revoked:
                work.ready.append(chain)
            else:
                work.chains.pop(chain.key, None)
            self._pump()

        hold.add_done_callback(release)

    @property
    def held(self) -> int:
        """Slots taken by handlers that outlived their runners."""
        return self._held

    def runners_on(self, works: Iterable[PartitionWork]) -> list[Runner]:
        """The runners busy with a record of one of `works` now."""
        chosen = set(works)
        return [r for r in self.runners if r.work in chosen]

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
        for runner in self.runners:
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

    def stop(self) -> None:
        """Cancel the timers (the token timer and the watchdog)."""
        for timer in (self._token_timer, self._watchdog):
            if timer is not None:
                timer.cancel()
        self._token_timer = self._watchdog = None


class LentSlot:
    """`with dispatcher.lend_slot():` (a class: it runs once per job on the hot path)."""

    __slots__ = ("_dispatcher", "_lent")

    def __init__(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher
        self._lent = False

    def __enter__(self) -> None:
        self._lent = self._dispatcher._lend()

    def __exit__(self, *exc: object) -> None:
        if self._lent:
            self._dispatcher._take_back()
