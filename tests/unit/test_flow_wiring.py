"""The group member's dispatch with lanes, a rate and a screen, without a broker: records
are handed to `dispatch` as a fetch would, and the subclass notes what started when."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Hashable
from dataclasses import replace

from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.producer import JobProducer
from stream_jobs.record import Record
from stream_jobs.runtime.dispatch import PartitionWork, Runner
from stream_jobs.runtime.member import GroupMember
from stream_jobs.settings import Settings

from .fake_records import FakeRecord

LANES = [("t.high", 6), ("t", 3), ("t.low", 1)]




class Member(GroupMember):
    def __init__(self, *, concurrency: int, lanes: list[tuple[str, int]]) -> None:
        settings = Settings()
        super().__init__(settings, "g", [t for t, _ in lanes], job_type="t",
                         producer=JobProducer(settings), concurrency=concurrency, grace_s=1,
                         commit_interval_s=1, max_buffered=1_000_000, lane_weights=lanes)
        self.started: list[tuple[str, float]] = []

    def chain_of(self, record: Record) -> Hashable:
        return record.offset

    async def handle(self, work: PartitionWork, record: Record, runner: Runner) -> None:
        self.started.append((record.topic, time.monotonic()))
        await asyncio.sleep(0)


def fill(member: Member, per_lane: int) -> None:
    for topic, _ in LANES:
        tp = TopicPartition(topic, 0)
        member.adopt([tp])
    for topic, _ in LANES:
        work = member.partitions[TopicPartition(topic, 0)]
        member.dispatch(work, [FakeRecord(topic, 0, i) for i in range(per_lane)])


async def until_started(member: Member, n: int) -> None:
    deadline = time.monotonic() + 10
    while len(member.started) < n:
        assert time.monotonic() < deadline, f"{len(member.started)} of {n} started"
        await asyncio.sleep(0.001)


async def test_lanes_start_by_weight_and_high_finishes_first() -> None:
    member = Member(concurrency=1, lanes=LANES)
    fill(member, 60)
    await until_started(member, 180)
    order = [topic for topic, _ in member.started]
    first = order[:100]
    assert (first.count("t.high"), first.count("t"), first.count("t.low")) == (60, 30, 10)
    assert order.index("t.low") < 10  # low is not kept waiting for high to drain


async def test_a_rate_spaces_the_starts() -> None:
    member = Member(concurrency=8, lanes=LANES[1:2])
    member.set_flow(replace(member.flow, rate_per_s=100))
    fill_start = time.monotonic()
    member.adopt([TopicPartition("t", 0)])
    member.dispatch(member.partitions[TopicPartition("t", 0)],
                    [FakeRecord("t", 0, i) for i in range(30)])
    await until_started(member, 30)
    elapsed = member.started[-1][1] - fill_start
    assert 0.25 <= elapsed <= 1.0  # 29 tokens after the first, at 100/s: 0.29 s
    member.set_flow(member.base_flow)


async def test_a_screened_record_is_finished_without_starting() -> None:
    member = Member(concurrency=4, lanes=LANES[1:2])
    member.screen = lambda work, record: record.key == b"skip"  # type: ignore[method-assign]
    member.set_flow(replace(member.flow, screen=True))
    tp = TopicPartition("t", 0)
    member.adopt([tp])
    work = member.partitions[tp]
    member.dispatch(work, [FakeRecord("t", 0, 0, key=b"skip"), FakeRecord("t", 0, 1),
                           FakeRecord("t", 0, 2, key=b"skip")])
    # Only the job started; the others finished on arrival.
    assert len(member.dispatcher.runners) == 1
    await until_started(member, 1)
    deadline = time.monotonic() + 10
    while member.dispatcher.runners:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.001)
    assert len(member.started) == 1
    assert work.tracker is not None
    assert work.tracker.position == 3
