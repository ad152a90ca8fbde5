"""The group member's runners without a broker: records are handed to `dispatch` as a fetch
would, and the subclass's `handle` does what each test needs."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Hashable

from hypothesis import given, settings
from hypothesis import strategies as st

from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.producer import JobProducer
from stream_jobs.record import Record
from stream_jobs.runtime.dispatch import RUNNER_YIELD_EVERY, PartitionWork, Runner
from stream_jobs.runtime.member import GroupMember
from stream_jobs.settings import Settings

from .fake_records import FakeRecord

Handle = Callable[["Member", PartitionWork, Record, Runner], Awaitable[None]]




class Member(GroupMember):
    def __init__(self, handle: Handle, *, concurrency: int, grace_s: float = 1.0) -> None:
        settings_ = Settings()
        super().__init__(settings_, "g", ["t"], job_type="t", producer=JobProducer(settings_),
                         concurrency=concurrency, grace_s=grace_s, commit_interval_s=1,
                         max_buffered=1_000_000)
        self._handle = handle
        self.running = 0
        self.most_running = 0
        self.done: list[Record] = []

    def chain_of(self, record: Record) -> Hashable:
        return record.key if record.key is not None else record.offset

    async def handle(self, work: PartitionWork, record: Record, runner: Runner) -> None:
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await self._handle(self, work, record, runner)
        finally:
            self.running -= 1
        self.done.append(record)

    async def commit(self, only: object = None) -> None:
        """No broker: nothing to commit to."""


def feed(member: Member, partition: int, keys: list[int | None]) -> PartitionWork:
    tp = TopicPartition("t", partition)
    member.adopt([tp])
    work = member.partitions[tp]
    member.dispatch(work, [FakeRecord("t", partition, offset,
                                      key=None if key is None else b"%d" % key)
                           for offset, key in enumerate(keys)])
    return work


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.001)


@settings(max_examples=40, deadline=None)
@given(keys=st.lists(st.one_of(st.none(), st.integers(0, 4)), min_size=1, max_size=60),
       steps=st.lists(st.integers(0, 3), min_size=1, max_size=60),
       concurrency=st.integers(1, 8))
def test_runners_keep_key_order_and_the_concurrency_bound(
        keys: list[int | None], steps: list[int], concurrency: int) -> None:
    async def handle(member: Member, work: PartitionWork, record: Record,
                     runner: Runner) -> None:
        for _ in range(steps[record.offset % len(steps)]):
            await asyncio.sleep(0)

    async def scenario() -> None:
        member = Member(handle, concurrency=concurrency)
        work = feed(member, 0, keys)
        await until(lambda: len(member.done) == len(keys), "all records finish")
        assert member.most_running <= concurrency
        for key in {k for k in keys if k is not None}:
            offsets = [r.offset for r in member.done if r.key == b"%d" % key]
            assert offsets == sorted(offsets)
        assert work.tracker is not None
        assert work.tracker.position == len(keys)
        await until(lambda: not member.dispatcher.runners, "runners end when nothing is ready")

    asyncio.run(scenario())


async def test_handlers_that_never_await_still_let_the_loop_run() -> None:
    async def handle(member: Member, work: PartitionWork, record: Record,
                     runner: Runner) -> None:
        return None

    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    other = asyncio.create_task(ticker())
    member = Member(handle, concurrency=1)
    n = 20 * RUNNER_YIELD_EVERY
    feed(member, 0, [None] * n)
    await until(lambda: len(member.done) == n, "all records finish")
    other.cancel()
    # One runner ran them all, and let the other task in every RUNNER_YIELD_EVERY records.
    assert ticks >= 20


async def test_a_runner_past_its_deadline_is_cancelled_with_expired_set() -> None:
    cut: list[float] = []

    async def handle(member: Member, work: PartitionWork, record: Record,
                     runner: Runner) -> None:
        began = asyncio.get_running_loop().time()
        runner.deadline = began + 0.1
        member.watch()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            assert runner.expired
            runner.expired = False
            assert runner.task is not None
            runner.task.uncancel()
            cut.append(asyncio.get_running_loop().time() - began)

    member = Member(handle, concurrency=2)
    work = feed(member, 0, [None, None])
    await until(lambda: len(member.done) == 2, "both records are cut off and finish")
    assert all(0.09 <= t < 2 for t in cut), cut
    assert work.tracker is not None
    assert work.tracker.position == 2
    # The watchdog stops once no deadline is set.
    await until(lambda: member.dispatcher._watchdog is None, "the watchdog stops")


async def test_release_abandons_what_outlives_the_grace_period_and_spares_the_rest() -> None:
    release_stuck = asyncio.Event()

    async def handle(member: Member, work: PartitionWork, record: Record,
                     runner: Runner) -> None:
        assert runner.deadline == math.inf
        if work.tp.partition == 0:
            await asyncio.Event().wait()  # stuck: only revocation ends it
        else:
            await release_stuck.wait()

    member = Member(handle, concurrency=4, grace_s=0.1)
    stuck = feed(member, 0, [None, None])
    other = feed(member, 1, [None])
    await until(lambda: member.running == 3, "three records run")
    await member.release([stuck.tp])
    assert stuck.tp not in member.partitions
    assert stuck.tracker is not None
    assert stuck.tracker.position == 0  # abandoned: uncommitted, delivered again later
    assert member.running == 1
    release_stuck.set()
    await until(lambda: len(member.done) == 1, "the other partition's record finishes")
    assert other.tracker is not None
    assert other.tracker.position == 1
