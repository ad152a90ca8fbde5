"""The fair dispatcher without a broker: the overflow's bounded, work-conserving share of
the slots, and a tenant held back by its limits while the others go on, without polling.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import pytest

from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.context import JobContext
from stream_jobs.errors import ConfigError
from stream_jobs.kafka import TopicPartition
from stream_jobs.runtime.dispatch import PartitionWork, Runner
from stream_jobs.runtime.fair_dispatch import FairDispatcher
from stream_jobs.tenants import FairnessSpec
from stream_jobs.testing.plugin import StartTester
from tests.waiting import until

LANE = "jobs.t"
OVERFLOW = "jobs.t.overflow"


@dataclass
class Rec:
    topic: str
    partition: int
    offset: int
    timestamp: int = 0
    key: bytes | None = None
    value: bytes | None = b"{}"
    headers: list[tuple[str, bytes]] = field(default_factory=list)


def records(topic: str, tenant: str, first: int, count: int) -> list[Rec]:
    return [Rec(topic, 0, first + i, headers=[("sj-tenant", tenant.encode())])
            for i in range(count)]


class Handler:
    """Runs a record until its topic's event is set; notes what runs and what ran."""

    def __init__(self) -> None:
        self.running: list[Rec] = []
        self.done: list[Rec] = []
        self.go = {LANE: asyncio.Event(), OVERFLOW: asyncio.Event()}

    async def __call__(self, work: PartitionWork, record: Rec, runner: Runner) -> None:
        self.running.append(record)
        try:
            await self.go[record.topic].wait()
        finally:
            self.running.remove(record)
        self.done.append(record)

    def release(self) -> None:
        for event in self.go.values():
            event.set()


def dispatcher(handle: Handler, *, concurrency: int, gate: object = None,
               **fairness: object) -> FairDispatcher:
    def chain_of(record: Rec) -> Hashable:
        return record.offset

    return FairDispatcher(fairness=FairnessSpec(**fairness),  # type: ignore[arg-type]
                          overflow=None, overflow_topic=OVERFLOW, gate=gate,  # type: ignore[arg-type]
                          concurrency=concurrency, handle=handle,  # type: ignore[arg-type]
                          chain_of=chain_of, on_finished=lambda work: None,
                          stopping=asyncio.Event())


async def test_the_overflow_takes_its_share_while_lanes_wait_and_all_when_they_do_not(
        ) -> None:
    handle = Handler()
    fair = dispatcher(handle, concurrency=8, overflow_share=0.25)
    lane = fair.work_for(TopicPartition(LANE, 0))
    over = fair.work_for(TopicPartition(OVERFLOW, 0))
    fair.dispatch(over, records(OVERFLOW, "a", 0, 40))  # type: ignore[arg-type]
    fair.dispatch(lane, records(LANE, "b", 0, 40))  # type: ignore[arg-type]
    await until(lambda: len(handle.running) == 8, "eight running")
    in_overflow = [r for r in handle.running if r.topic == OVERFLOW]
    assert len(in_overflow) == 2  # 25 % of 8 while the lane has work ready
    # The lane's jobs run through; the overflow keeps its two slots meanwhile.
    handle.go[LANE].set()
    await until(lambda: sum(r.topic == LANE for r in handle.done) == 40, "the lane done")
    # Nothing ready in the lane: the overflow takes every slot (work-conserving).
    await until(lambda: len(handle.running) == 8, "eight running again")
    assert all(r.topic == OVERFLOW for r in handle.running)
    handle.go[OVERFLOW].set()
    await until(lambda: len(handle.done) == 80, "all done")
    fair.stop()


class Gate:
    """Refuses tenant a (come back in 50 ms) until `opened`; counts the questions."""

    def __init__(self) -> None:
        self.asked: dict[str, int] = {}
        self.opened = False
        self.held = 0
        self.most_held = 0

    def limited(self, tenant: str) -> bool:
        return tenant == "a"

    async def acquire(self, tenant: str) -> float | None:
        self.asked[tenant] = self.asked.get(tenant, 0) + 1
        if not self.opened:
            return 0.05
        self.held += 1
        self.most_held = max(self.most_held, self.held)
        return None

    async def release(self, tenant: str) -> None:
        self.held -= 1


async def test_a_refused_tenant_waits_without_holding_up_the_others_or_polling() -> None:
    handle = Handler()
    handle.release()
    gate = Gate()
    fair = dispatcher(handle, concurrency=4, gate=gate)
    lane = fair.work_for(TopicPartition(LANE, 0))
    fair.dispatch(lane, records(LANE, "a", 0, 30))  # type: ignore[arg-type]
    fair.dispatch(lane, records(LANE, "b", 30, 30))  # type: ignore[arg-type]
    await until(lambda: len(handle.done) == 30, "b's 30 jobs done")
    assert {r.headers[0][1] for r in handle.done} == {b"b"}
    await asyncio.sleep(0.3)  # a measurement window: how often is a asked meanwhile?
    assert gate.asked["a"] <= 0.35 / 0.05 + 2, gate.asked  # once per wait, not a loop
    gate.opened = True
    await until(lambda: len(handle.done) == 60, "a's jobs done once let through")
    assert gate.held == 0  # every granted start was given back
    fair.stop()


async def test_the_job_tester_runs_a_type_with_fairness_and_its_overflow(
        job_tester: StartTester) -> None:
    ran: list[tuple[str | None, int]] = []
    app = App()

    @app.job("bulk.import", ordering="key", concurrency=4)
    async def run(job: dict[str, Any], ctx: JobContext) -> None:
        ran.append((ctx.tenant, job["n"]))

    t = job_tester(app, types={"bulk.import": {"partitions": 2, "fairness": {
        "noisy_min_jobs": 5}}})
    await t.enqueue_many([Job("bulk.import", {"n": n}, tenant="flood", key=f"f{n}")
                          for n in range(300)])
    await t.enqueue_many([Job("bulk.import", {"n": n}, tenant="quiet", key="q")
                          for n in range(10)])
    await t.run_until_idle()
    assert len(ran) == 310
    assert [n for tenant, n in ran if tenant == "quiet"] == list(range(10))


async def test_a_type_ordered_by_partition_cannot_have_fairness(
        job_tester: StartTester) -> None:
    app = App()

    @app.job("bulk.import", ordering="partition")
    async def run(job: dict[str, Any], ctx: JobContext) -> None:
        pass

    t = job_tester(app, types={"bulk.import": {"fairness": {}}})
    await t.enqueue("bulk.import", {})
    with pytest.raises(ConfigError, match='needs ordering "key" or "unordered"'):
        await t.run_until_idle()


async def test_tenants_gone_quiet_leave_the_noisy_judge() -> None:
    handle = Handler()
    handle.release()
    fair = dispatcher(handle, concurrency=4, noisy_window_s=0.01)
    lane = fair.work_for(TopicPartition(LANE, 0))
    for n in range(50):
        fair.dispatch(lane, records(LANE, f"t{n}", n, 1))  # type: ignore[arg-type]
    await until(lambda: len(handle.done) == 50, "every tenant's job ran")
    assert len(fair.judge.tenants_seen()) == 50

    def tidied() -> bool:
        fair.dispatch(lane, [])  # a fetch that brought nothing still tidies, once a window
        return not fair.judge.tenants_seen()

    await until(tidied, "the judge forgot the 50 idle tenants")
    fair.stop()
