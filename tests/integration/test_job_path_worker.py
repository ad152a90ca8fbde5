"""The worker under pressure against the real stack: bounded buffers under a deep backlog,
a handler longer than max.poll.interval.ms, and partitions paused for backpressure
across a rebalance.

Nothing waits by sleeping: every wait polls a condition against a deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import asyncpg

from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.context import JobContext
from stream_jobs.kafka.admin import group_state
from stream_jobs.naming import worker_group
from stream_jobs.record import Record
from stream_jobs.runtime.dispatch import PartitionWork
from stream_jobs.runtime.worker import Worker
from stream_jobs.settings import Settings
from tests.waiting import until

from .conftest import Declare


def watch_buffers(worker: Worker) -> Counter[int]:
    """The most records each lane partition had buffered right after any fetch (the
    moment a buffer is fullest), recorded by wrapping the worker's `dispatch`."""
    most: Counter[int] = Counter()
    dispatch = worker.dispatch

    def recording(work: PartitionWork, records: list[Record]) -> None:
        dispatch(work, records)
        most[work.tp.partition] = max(most[work.tp.partition], work.buffered)

    worker.dispatch = recording  # type: ignore[method-assign]
    return most


def count_rebalances(worker: Worker) -> Counter[str]:
    """How often the group assigned partitions to this worker and revoked some of them
    (aiokafka also calls the listener with nothing revoked before the first join)."""
    calls: Counter[str] = Counter()
    adopt, release = worker.adopt, worker.release

    def adopting(tps: list[Any]) -> None:
        calls["assigned"] += 1
        adopt(tps)

    async def releasing(tps: list[Any]) -> None:
        if tps:
            calls["revoked"] += 1
        await release(tps)

    worker.adopt = adopting  # type: ignore[method-assign]
    worker.release = releasing  # type: ignore[method-assign]
    return calls


async def test_buffers_stay_bounded_under_a_deep_backlog(app: App, declare: Declare) -> None:
    await declare("deep.backlog", partitions=1, retry_tiers=["1s"])
    n, bound = 1_500, 40
    gate = asyncio.Event()
    ran: list[str] = []

    @app.job("deep.backlog", concurrency=4)
    async def work(job: dict[str, int], ctx: JobContext) -> None:
        await gate.wait()
        ran.append(ctx.job_id)

    async with app.client() as client:
        for start in range(0, n, 500):
            await client.enqueue_many(Job("deep.backlog", {"i": i})
                                      for i in range(start, min(start + 500, n)))
    worker = app.worker("deep.backlog", max_buffered=bound)
    most = watch_buffers(worker)
    polls = 0
    poll_once = worker.poll_once

    async def counting(timeout_ms: int = 200) -> int:
        nonlocal polls
        polls += 1
        return await poll_once(timeout_ms)

    worker.poll_once = counting  # type: ignore[method-assign]
    running = asyncio.create_task(worker.run(until_idle=True))
    try:
        # The handlers are held: the buffer fills, the partition is paused, and polling
        # goes on (a paused partition returns nothing) without the buffer growing.
        await until(lambda: any(w.paused for w in worker.partitions.values()),
                    "the partition to be paused", 30)
        paused_at = polls
        await until(lambda: polls >= paused_at + 10, "ten more polls while paused", 30)
        buffered_while_paused = worker.in_flight()
    finally:
        gate.set()
    await asyncio.wait_for(running, 120)

    # A partition is paused once a fetch leaves `max_buffered` or more buffered, and a
    # fetch returns at most `fetch_records`: the bound stream_jobs/runtime/member.py keeps.
    limit = bound - 1 + worker.fetch_records
    print(f"\n[bounded buffers] most buffered {most[0]} (bound {limit}), backlog {n}")
    assert bound <= most[0] <= limit, (most, limit)
    assert buffered_while_paused == most[0]  # ten polls while paused added nothing
    assert len(ran) == n == len(set(ran))
    assert worker.outcomes["succeeded"] == n


async def test_a_handler_longer_than_max_poll_interval_keeps_its_member_in_the_group(
        app: App, declare: Declare, settings: Settings) -> None:
    await declare("long.job", partitions=2, retry_tiers=["1s"])
    max_poll_interval_s = 1.0
    runs: list[tuple[str, float]] = []
    seen_by_long: list[Counter[str]] = []

    @app.job("long.job", timeout=30)
    async def long(job: dict[str, str], ctx: JobContext) -> None:
        began = time.monotonic()
        if job["name"] == "long":
            await asyncio.sleep(3 * max_poll_interval_s)  # the work itself, not a wait
            seen_by_long.append(rebalances.copy())
            # Back to the default for the shutdown, which may leave the consumer without
            # a poll for more than a second (aiokafka's heartbeat task would then leave
            # the group while the consumer closes, and close raises CancelledError).
            aiokafka_consumer._coordinator._max_poll_interval = 300.0
        runs.append((job["name"], time.monotonic() - began))

    worker = app.worker("long.job")
    # aiokafka makes the member leave its group when `getmany` is not called for this
    # long; 300 s in production, 1 s here, so a poll loop that waited on its handlers
    # would lose its partitions while the long job runs.
    aiokafka_consumer = worker.consumer._consumer  # type: ignore[attr-defined]
    aiokafka_consumer._max_poll_interval_ms = int(max_poll_interval_s * 1000)
    rebalances = count_rebalances(worker)
    async with app.client() as client:
        await client.enqueue("long.job", {"name": "long"})
        await client.enqueue("long.job", {"name": "short"})
    await worker.run(until_idle=True)

    assert sorted(name for name, _ in runs) == ["long", "short"]  # each ran once
    assert dict(runs)["long"] >= 3 * max_poll_interval_s
    assert worker.outcomes == Counter({"succeeded": 2})
    # Its partitions were assigned once, when it joined, and none was revoked while the
    # long job ran: the member stayed in the group and no rebalance happened.
    assert seen_by_long == [Counter({"assigned": 1})]
    assert rebalances["assigned"] == 1
    state, members = await group_state(settings, worker_group(settings.topic_prefix, "long.job"))
    assert (state, members) == ("Empty", 0)


async def test_partitions_paused_for_backpressure_resume_after_a_rebalance(
        app: App, declare: Declare, settings: Settings) -> None:
    await declare("paused.job", partitions=2, retry_tiers=["1s"])
    n = 400
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    await conn.execute("CREATE TABLE effects (job_id text NOT NULL)")
    gate = asyncio.Event()
    runs: Counter[str] = Counter()

    @app.job("paused.job", concurrency=2)
    async def paused(job: dict[str, int], ctx: JobContext) -> None:
        await gate.wait()
        runs[ctx.job_id] += 1
        async with ctx.once() as tx:
            await tx.execute("INSERT INTO effects VALUES ($1)", ctx.job_id)

    async with app.client() as client:
        ids = await client.enqueue_many(Job("paused.job", {"i": i}) for i in range(n))
    first = app.worker("paused.job", max_buffered=8, grace_s=5)
    second = app.worker("paused.job", max_buffered=8, grace_s=5)
    rebalances = count_rebalances(first)
    revoking = asyncio.Event()
    release = first.release

    async def releasing(tps: list[Any]) -> None:
        if tps:
            revoking.set()
        await release(tps)

    first.release = releasing  # type: ignore[method-assign]
    tasks = [asyncio.create_task(first.run())]
    try:
        # The handlers are held, so both partitions fill their buffers and are paused.
        await until(lambda: len(first.partitions) == 2 and all(
            w.paused for w in first.partitions.values()), "both partitions paused", 30)
        assert len(first.consumer.paused()) == 2
        tasks.append(asyncio.create_task(second.run()))
        await until(revoking.is_set, "the rebalance the second worker causes", 30)
        gate.set()  # the first worker's jobs in flight finish within its grace period

        def done() -> bool:
            return len(runs) == n and not first.in_flight() and not second.in_flight()

        await until(done, f"{n} jobs run (stuck paused partitions would stop them)", 60)
        # Both hold partitions now, and neither kept a partition paused from before.
        assert first.partitions
        assert second.partitions
        assert len(first.partitions) + len(second.partitions) == 2
        for worker in (first, second):
            assert worker.consumer.paused() == set()
            assert not any(w.paused for w in worker.partitions.values())
        assert rebalances["assigned"] >= 2
    finally:
        gate.set()
        for worker in (first, second):
            worker.request_stop()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)

    effects = Counter(r["job_id"] for r in await conn.fetch("SELECT job_id FROM effects"))
    await conn.close()
    assert set(effects) == set(ids)
    assert set(effects.values()) == {1}
    assert sum(runs.values()) == n, "no job ran twice: the revoked jobs finished in grace"
    assert first.outcomes["succeeded"] + second.outcomes["succeeded"] == n
    assert first.outcomes["succeeded"] > 0
    assert second.outcomes["succeeded"] > 0
