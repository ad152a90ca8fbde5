"""Fair dispatch: a worker of a type with `[fairness]` (docs/fairness.md).

`FairDispatcher` is the `Dispatcher` with three changes, and costs a type without
`[fairness]` nothing (it is not made for one):

- each lane's ready chains sit in a `TenantRotation`, so starts go round robin across
  tenants by weight; a chain is one key's records in offset order, so per-key order is
  what it was;
- at fetch time, a record of a noisy tenant (`NoisyJudge`), or of a key already in the
  overflow, whose key has nothing earlier waiting in the lane, is forwarded to the
  overflow lane (`Overflow`) instead of waiting; the overflow partition's records run in
  their own rotation with at most `overflow_share` of the slots while lane work is ready,
  and all of them when none is;
- with a `Gate` (per-tenant limits across the fleet, `stream_jobs.fairness.gate`), a
  chain whose tenant is refused a start goes back to the front of its tenant's queue and
  that tenant is held back, in every rotation, for the time the gate says; the other
  tenants' chains go on, and nothing polls meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from stream_jobs.errors import ConfigError
from stream_jobs.fairness.noisy import NoisyJudge
from stream_jobs.fairness.overflow import Overflow
from stream_jobs.fairness.rotation import TenantRotation
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.clients import KafkaClients
from stream_jobs.kafka.consumer import Consumer, copartitioned
from stream_jobs.kafka.scan import PartitionRange, scan
from stream_jobs.naming import lane_topic, overflow_topic
from stream_jobs.record import Record
from stream_jobs.runtime.dispatch import (
    Chain,
    Dispatcher,
    PartitionWork,
    ReadyQueue,
    Runner,
    record_size,
)
from stream_jobs.runtime.member import GroupMember
from stream_jobs.runtime.services import Service
from stream_jobs.storage import Storage
from stream_jobs.tenants import FairnessSpec, tenant_in

log = logging.getLogger("stream_jobs.consumer")

# How long a tenant is held back when its gate could not be asked (the database is away).
GATE_DOWN_WAIT_S = 1.0


class Gate(Protocol):
    """Per-tenant limits across the fleet (`stream_jobs.fairness.gate.TenantGate`)."""

    def limited(self, tenant: str) -> bool: ...

    async def acquire(self, tenant: str) -> float | None: ...

    async def release(self, tenant: str) -> None: ...


# Reads the keys of an overflow partition's records in [start, end): (partition, start, end).
ReadKeys = Callable[[int, int, int], Awaitable[list[bytes | None]]]


def chain_tenant(chain: Chain) -> str:
    """The tenant of a chain's next record (what its turn in a rotation is for)."""
    return tenant_in(chain.records[0].headers) if chain.records else ""


class FairDispatcher(Dispatcher):
    """A `Dispatcher` that serves tenants round robin, moves noisy tenants' records to the
    overflow lane and holds back tenants a `Gate` refuses (module docstring)."""

    def __init__(self, *, fairness: FairnessSpec, overflow: Overflow | None,
                 overflow_topic: str, read_keys: ReadKeys | None = None,
                 gate: Gate | None = None, **options: Any) -> None:
        super().__init__(**options)
        self._read_keys = read_keys
        weight_of = fairness.weight_of
        lanes: list[str | None] = [*self._queue_of] or [None]
        rotations = [TenantRotation(chain_tenant, weight_of) for _ in lanes]
        self._rotations_of_lanes = rotations
        self._queues = list(rotations)
        self._ready = rotations[0]
        self._queue_of = {t: q for t, q in zip(lanes, rotations, strict=True)
                          if t is not None}
        self._overflow_queue: TenantRotation[Chain] = TenantRotation(chain_tenant, weight_of)
        self._overflow_topic = overflow_topic
        self.overflow_cap = max(1, math.floor(self.concurrency * fairness.overflow_share))
        self.overflow_running = 0
        self.judge = NoisyJudge(fairness)
        self.overflow = overflow
        self.gate = gate
        # What runs beside it, started before the first fetch (the gate, when it has one).
        self.services: list[Service] = []
        self._counts: dict[PartitionWork, Counter[str]] = {}
        self._held_until: dict[str, asyncio.TimerHandle] = {}
        # Partitions whose overflow keys are being read: their fetched records, held.
        self._adopting: dict[int, list[tuple[PartitionWork, list[Record]]]] = {}
        # The noisy judge forgets tenants idle for a window, at most once a window.
        self._tidy_every_s = fairness.noisy_window_s
        self._tidy_at = 0.0

    def _rotations(self) -> list[TenantRotation[Chain]]:
        return [*self._rotations_of_lanes, self._overflow_queue]

    def work_for(self, tp: Any) -> PartitionWork:
        if tp.topic == self._overflow_topic:
            return PartitionWork(tp, self._overflow_queue)
        return super().work_for(tp)

    def dispatch(self, work: PartitionWork, records: list[Record]) -> None:
        waiting = self._adopting.get(work.tp.partition)
        if waiting is not None:  # the overflow's keys are being read: nothing runs yet
            waiting.append((work, records))
            return
        judge = self.judge
        now = time.monotonic()
        if now >= self._tidy_at:  # tenants gone quiet leave the judge's maps
            judge.forget_idle(now)
            self._tidy_at = now + self._tidy_every_s
        counts = self._counts.setdefault(work, Counter())
        screen = self.screen
        overflow = self.overflow
        partition = work.tp.partition
        for record in records:
            work.dispatched(record.offset, record_size(record))
            tenant = tenant_in(record.headers)
            judge.took(tenant)
            counts[tenant] += 1
            if screen is not None and screen(work, record):
                self._finished(work, record)
                continue
            key = self._chain_of(record)
            chain = work.chains.get(key)
            if chain is not None:
                chain.records.append(record)
                continue
            if overflow is not None and self._moves(work, tenant, record.key):
                overflow.forward(work, partition, record, self._forward_done(work))
                continue
            chain = work.chains[key] = Chain(work, key)
            chain.records.append(record)
            work.ready.append(chain)
        self._pump()

    def _forward_done(self, work: PartitionWork) -> Callable[[Record], None]:
        return lambda record: self._finished(work, record)

    def _finished(self, work: PartitionWork, record: Record) -> None:
        tenant = tenant_in(record.headers)
        self.judge.finished(tenant)
        counts = self._counts.get(work)
        if counts is not None:
            counts[tenant] -= 1
        if work.tp.topic == self._overflow_topic and self.overflow is not None:
            self.overflow.finished(work.tp.partition, record.key)
        super()._finished(work, record)

    async def assigned(self, consumer: Consumer, tps: Sequence[TopicPartition]) -> None:
        """Overflow partitions taken over: their unfinished records' keys are read first
        (they stay sticky until run). A partition whose keys cannot be read is not owned:
        its lane partition forwards nothing, which is always safe."""
        overflow = self.overflow
        read_keys = self._read_keys
        mine = [tp for tp in tps if tp.topic == self._overflow_topic]
        if overflow is None or read_keys is None or not mine:
            return
        # Until partition p's keys are known, what its lane and overflow partitions fetch
        # waits here: a lane job must not overtake an earlier overflow job of its key.
        for tp in mine:
            self._adopting[tp.partition] = []
        try:
            await self._adopt(consumer, mine, overflow, read_keys)
        finally:
            for tp in mine:
                for work, records in self._adopting.pop(tp.partition, []):
                    if not work.revoked:
                        self.dispatch(work, records)

    async def _adopt(self, consumer: Consumer, mine: list[TopicPartition],
                     overflow: Overflow, read_keys: ReadKeys) -> None:
        try:
            ends = await consumer.end_offsets(mine)
            firsts = await consumer.beginning_offsets(mine)
            for tp in mine:
                start = await consumer.committed(tp)
                start = firsts[tp] if start is None else max(start, firsts[tp])
                keys = await read_keys(tp.partition, start, ends[tp])
                overflow.adopt(tp.partition, keys)
        except Exception as exc:
            log.warning("%s: cannot read the overflow's waiting keys, so the lanes forward "
                        "nothing from the partitions not read: %s", self._name, exc)

    async def revoking(self, works: Sequence[PartitionWork], grace_s: float) -> None:
        """Forwards of revoked lane partitions land (within the grace period) before the
        commit; revoked overflow partitions are no longer owned."""
        overflow = self.overflow
        if overflow is None:
            return
        await overflow.settle(works, grace_s)
        for work in works:
            if work.tp.topic == self._overflow_topic:
                overflow.drop(work.tp.partition)

    def forget(self, work: PartitionWork) -> None:
        """Whatever of `work` was still counted in flight is not any more."""
        counts = self._counts.pop(work, None)
        if counts:
            for tenant, count in counts.items():
                for _ in range(max(0, count)):
                    self.judge.finished(tenant)

    def _ready_count(self) -> int:
        return sum(len(q) for q in self._queues) + len(self._overflow_queue)

    def _take(self) -> Chain | None:
        """Lanes by weight (`LanePicker`) and tenants by turn; the overflow while it runs
        under its cap, or whenever no lane has anything ready."""
        queues = self._queues
        picker = self._picker
        bucket = self._bucket
        overflow = self._overflow_queue
        while True:
            if bucket is not None and not bucket.has_token(time.monotonic()):
                if any(queues) or overflow:
                    self._wake_for_token(bucket)
                return None
            lanes_ready = any(queues)
            if overflow and (self.overflow_running < self.overflow_cap or not lanes_ready):
                queue: ReadyQueue = overflow
            elif lanes_ready:
                lane = picker.pick(queues) if picker is not None else 0
                assert lane is not None
                queue = queues[lane]
            else:
                return None
            chain = queue.popleft()
            work = chain.work
            if work.revoked or self._stopping.is_set():
                work.chains.pop(chain.key, None)
                continue
            if bucket is not None:
                bucket.try_take(time.monotonic())
            return chain

    def _moves(self, work: PartitionWork, tenant: str, key: bytes | None) -> bool:
        """Whether a lane record of `tenant` and `key` goes to the overflow now."""
        overflow = self.overflow
        if overflow is None or work.tp.topic == self._overflow_topic:
            return False
        partition = work.tp.partition
        return overflow.owns(partition) and (
            overflow.sticky(partition, key) or self.judge.is_noisy(tenant, time.monotonic()))

    def _move_chain(self, chain: Chain) -> None:
        """A lane chain whose turn came while its tenant is noisy (its records were fetched
        before the tenant was judged so) goes to the overflow whole, in order."""
        work = chain.work
        assert self.overflow is not None
        work.chains.pop(chain.key, None)
        done = self._forward_done(work)
        for record in chain.records:
            self.overflow.forward(work, work.tp.partition, record, done)
        chain.records.clear()

    async def _run_head(self, runner: Runner, chain: Chain) -> None:
        record = chain.records[0]
        tenant = tenant_in(record.headers)
        if self._moves(chain.work, tenant, record.key):
            self._move_chain(chain)
            return
        gate = self.gate
        granted = False
        if gate is not None and gate.limited(tenant):
            try:
                wait = await gate.acquire(tenant)
            except Exception as exc:  # the store is away: hold the tenant, keep the job
                log.warning("%s: cannot ask the limits of tenant %r: %s", self._name, tenant,
                            exc)
                wait = GATE_DOWN_WAIT_S
            if wait is not None:
                self._hold_back(chain, tenant, wait)
                return
            granted = True
        over = chain.work.tp.topic == self._overflow_topic
        if over:
            self.overflow_running += 1
        started = time.monotonic()
        try:
            await super()._run_head(runner, chain)
        finally:
            if over:
                self.overflow_running -= 1
            now = time.monotonic()
            self.judge.ran(tenant, now - started, now)
            if granted:
                assert gate is not None
                try:
                    await gate.release(tenant)
                except Exception as exc:  # its lease runs out on its own
                    log.warning("%s: cannot give back a slot of tenant %r: %s", self._name,
                                tenant, exc)

    def _hold_back(self, chain: Chain, tenant: str, wait_s: float) -> None:
        """`chain` goes back to the front of its tenant's queue; the tenant waits `wait_s`
        in every rotation, the others' chains go on."""
        work = chain.work
        if work.revoked or self._stopping.is_set():
            work.chains.pop(chain.key, None)
        else:
            work.ready.appendleft(chain)
        if tenant in self._held_until:
            return
        for rotation in self._rotations():
            rotation.hold(tenant)
        self._held_until[tenant] = asyncio.get_running_loop().call_later(
            max(wait_s, 0.001), self._release_hold, tenant)

    def _release_hold(self, tenant: str) -> None:
        self._held_until.pop(tenant, None)
        for rotation in self._rotations():
            rotation.release_hold(tenant)
        self._pump()

    def stop(self) -> None:
        for timer in self._held_until.values():
            timer.cancel()
        self._held_until.clear()
        super().stop()





def fair_consumer_options(policy: JobTypePolicy) -> dict[str, Any]:
    """The workers' group options a type with an overflow lane needs: the range assignor,
    which gives lane partition p and overflow partition p to the same member."""
    if not policy.has_overflow:
        return {}
    return copartitioned()


def fair_dispatcher(member: GroupMember, policy: JobTypePolicy, ordering: str,
                    kafka: KafkaClients, storage: Storage) -> FairDispatcher:
    """The dispatcher of `member` (a type's worker) for its `[fairness]` table, with the
    type's per-tenant limits from `storage` (where it keeps them)."""
    fairness = policy.fairness
    assert fairness is not None
    if ordering == "partition":
        raise ConfigError(f"{policy.origin}: [fairness] needs ordering \"key\" or \"unordered\": "
                          f"under ordering \"partition\" every job of a partition waits for "
                          "the one before it, so no tenant can go first.")
    topic = overflow_topic(member.settings.topic_prefix, policy.job_type)
    old = member.dispatcher
    overflow = (Overflow(member.producer, topic, member.stopping)
                if policy.has_overflow else None)

    async def read_keys(partition: int, start: int, end: int) -> list[bytes | None]:
        if end <= start:
            return []
        reader = kafka.consumer(member.settings, enable_auto_commit=False)
        await reader.start()
        try:
            return [r.key async for r in scan(reader, topic,
                                              [PartitionRange(partition, start, end)])]
        finally:
            await reader.stop()

    gate = storage.tenant_gate(policy.job_type, fairness, f"{member.group_id} {os.getpid()}")
    fair = FairDispatcher(
        fairness=fairness, overflow=overflow, overflow_topic=topic, read_keys=read_keys,
        gate=gate, concurrency=old.concurrency, handle=member.handle,
        chain_of=member.chain_of, on_finished=member.relieve, stopping=member.stopping,
        lane_weights=[(lane_topic(member.settings.topic_prefix, policy.job_type, lane), w)
                      for lane, w in policy.lane_weights],
        name=member.group_id)
    fair.services = [gate] if gate is not None else []
    return fair


def fair_services(dispatcher: Dispatcher) -> list[Service]:
    """What a fair dispatcher needs running before the first fetch: its limits' gate."""
    return list(dispatcher.services) if isinstance(dispatcher, FairDispatcher) else []


__all__ = ["GATE_DOWN_WAIT_S", "FairDispatcher", "Gate", "chain_tenant", "fair_consumer_options",
           "fair_dispatcher", "fair_services"]
