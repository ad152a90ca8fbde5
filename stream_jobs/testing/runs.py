"""One run of a `JobTester`: the app's real workers on the in-memory broker, until rest.

A run starts a `Worker` per handled type (its relay too), each as `stream-jobs worker`
runs it, and waits until the app is at rest: every lane and tier partition read to its
end and nothing fetched still running, except records the relays hold for a later time.
Then it moves the virtual clock (`virtual_time.next_stop`): to the next held record's due
time or schedule firing, fires what is due, wakes the relays to look at the clock, and
waits for rest again. When there is nothing left to move to, it stops the workers, which
drain and commit as on SIGTERM; held records stay in their tiers (uncommitted, so the
next run's relay holds them again), as a stopped worker leaves them.

Finishing a job is not a broker call, so rest is looked for on every change of the
broker and, between changes, on a short timer (1 ms, doubling to 50 ms).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Protocol

from stream_jobs.client import JobClient
from stream_jobs.errors import NotSettled
from stream_jobs.kafka import TopicPartition
from stream_jobs.runtime.member import GroupMember
from stream_jobs.runtime.stalls import job_fields_of
from stream_jobs.runtime.worker import Worker
from stream_jobs.testing.memory_kafka import MemoryConsumer, MemoryKafka
from stream_jobs.testing.schedules import VirtualSchedules
from stream_jobs.testing.virtual_time import VirtualClock, next_stop

# How long the workers may take to drain once a run is over (they are at rest then).
STOP_WAIT_S = 30.0
_WAIT_FIRST_S, _WAIT_MAX_S = 0.001, 0.05


class OutboxDrain(Protocol):
    """The outbox relay of a tester on Postgres: moves committed rows to the broker."""

    async def drain(self) -> int: ...


def member_busy(member: GroupMember, consumer: MemoryConsumer, kafka: MemoryKafka,
                now_ms: int, holding: dict[TopicPartition, int]) -> str | None:
    """What keeps one group member from rest, or None. A partition whose head its relay
    holds for a later time is at rest whatever is behind that head."""
    if not consumer.joined:
        return f"{member.group_id} has not joined its group yet"
    for tp in sorted(consumer.assignment()):
        due = holding.get(tp)
        if due is not None and due > now_ms:
            continue
        work = member.partitions.get(tp)
        if work is not None and work.buffered:
            return (f"{work.buffered} records of {tp.topic} partition {tp.partition} are "
                    f"running or waiting in {member.group_id}")
        if consumer.fetch_position(tp) < kafka.broker.end(tp):
            return f"{tp.topic} partition {tp.partition} is not read to its end yet"
    return None


def worker_busy(worker: Worker, kafka: MemoryKafka, now_ms: int) -> str | None:
    """What keeps a worker (or its relay) from rest, or None."""
    if worker.threads is not None and worker.threads.busy:
        return f"{worker.threads.busy} handler threads of {worker.policy.job_type} still run"
    if worker.dispatcher.held:
        return f"{worker.dispatcher.held} handler calls of {worker.policy.job_type} outlived " \
               "their timeout and still run"
    busy = member_busy(worker, kafka.members[worker.group_id], kafka, now_ms, {})
    if busy is None and worker.relay is not None:
        relay = worker.relay
        busy = member_busy(relay, kafka.members[relay.group_id], kafka, now_ms, relay.holding)
    return busy


def running_jobs(workers: Sequence[Worker]) -> list[str]:
    """The jobs handlers are running now, as "job ID (type) attempt n"."""
    found = []
    for worker in workers:
        for runner in worker.dispatcher.runners:
            if runner.work is not None and runner.record is not None:
                fields = job_fields_of(runner.record)
                found.append(f"job {fields.get('job_id', '?')} ({worker.policy.job_type}) "
                             f"attempt {fields.get('attempt', '?')}")
    return found


class WorkerRun:
    """`async with WorkerRun(...) as run: await run.settle(until_ms)` (see the module)."""

    def __init__(self, workers: Sequence[Worker], kafka: MemoryKafka, clock: VirtualClock,
                 schedules: VirtualSchedules, client: JobClient, *,
                 outbox: OutboxDrain | None = None, timeout_s: float = 60.0,
                 max_moves: int = 10_000) -> None:
        self.workers = list(workers)
        self._kafka = kafka
        self._clock = clock
        self._schedules = schedules
        self._client = client
        self._outbox = outbox
        self._timeout_s = timeout_s
        self._max_moves = max_moves
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> WorkerRun:
        self._tasks = [asyncio.create_task(w.run(), name=f"tester {w.group_id}")
                       for w in self.workers]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for worker in self.workers:
            worker.request_stop()
        self._kafka.broker.changed()  # fetches waiting now return, so the loops see it
        if not self._tasks:
            return
        done, pending = await asyncio.wait(self._tasks, timeout=STOP_WAIT_S)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        failed = [t.exception() for t in done if not t.cancelled() and t.exception()]
        if failed and exc_info[0] is None:
            raise failed[0]  # type: ignore[misc]

    def holds(self) -> list[int]:
        """When each record held in a delay tier is due (virtual Unix ms)."""
        return [due for w in self.workers if w.relay is not None
                for due in w.relay.holding.values()]

    async def settle(self, until_ms: int | None) -> None:
        """Run until rest; move the clock as `next_stop` says and run again, until it says
        stop (see the module)."""
        moves = 0
        while True:
            await self._rest()
            if self._outbox is not None and await self._outbox.drain():
                continue
            now = self._clock.now_ms()
            stop = next_stop(now, self.holds(), self._schedules.next_fires_ms(), until_ms)
            if stop is None:
                return
            moves += 1
            if moves > self._max_moves:
                raise NotSettled(
                    f"The jobs did not come to rest after the clock moved {self._max_moves} "
                    "times: something keeps making new delayed work (a job that always "
                    "fails into a schedule's next firing?). Use advance() for a bounded time.")
            self._clock.move_to(stop)
            await self._schedules.fire_due(stop, self._client)
            for worker in self.workers:
                if worker.relay is not None:
                    worker.relay.recheck()

    async def _rest(self) -> None:
        """Wait until every worker is at rest; NotSettled past the time limit."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        wait_s = _WAIT_FIRST_S
        broker = self._kafka.broker
        while True:
            for task in self._tasks:
                if task.done():
                    with contextlib.suppress(asyncio.CancelledError):
                        task.result()  # raises what ended it
                    raise NotSettled(f"A worker stopped on its own ({task.get_name()}).")
            now = self._clock.now_ms()
            busy = next((b for w in self.workers if (b := worker_busy(w, self._kafka, now))),
                        None)
            if busy is None:
                return
            if loop.time() >= deadline:
                running = running_jobs(self.workers)
                still = f"; still running: {', '.join(running)}" if running else ""
                raise NotSettled(f"The jobs were not at rest after {self._timeout_s:g} s "
                                 f"(JobTester timeout_s): {busy}{still}.")
            changed = await broker.wait_for_change(wait_s)
            wait_s = _WAIT_FIRST_S if changed else min(wait_s * 2, _WAIT_MAX_S)


__all__ = ["OutboxDrain", "WorkerRun", "member_busy", "running_jobs", "worker_busy"]
