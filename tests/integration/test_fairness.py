"""Fair dispatch and the overflow lane against the real stack (docs/fairness.md).

A tenant's flood is enqueued ahead of quiet tenants' jobs, each tenant on keys of its
own and a few keys shared by all. With `[fairness]` the flood moves to `P.T.overflow`
and the quiet tenants run long before it is done; every job runs once; each key's jobs
run in the order they were enqueued, through the lane and the overflow alike. Without
`[fairness]` the quiet tenants wait behind the whole flood (the same test, the table
removed: what the feature changes).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.job_ids import new_job_id
from stream_jobs.kafka.producer import JobProducer
from stream_jobs.naming import lane_topic, overflow_topic
from stream_jobs.record import JobRecord
from stream_jobs.runtime.fair_dispatch import FairDispatcher
from stream_jobs.runtime.worker import Worker
from stream_jobs.settings import Settings
from tests.waiting import until

from .conftest import Declare
from .database import connect
from .topic_reader import read_topic

pytestmark = pytest.mark.integration

FLOOD = 2000
QUIET_TENANTS = ("b", "c", "d", "e")
QUIET_EACH = 15
KEYS = 12


@pytest.fixture
async def running() -> AsyncIterator[Callable[[Worker], asyncio.Task[None]]]:
    started: list[tuple[Worker, asyncio.Task[None]]] = []

    def start(worker: Worker) -> asyncio.Task[None]:
        task = asyncio.create_task(worker.run())
        started.append((worker, task))
        return task

    yield start
    for worker, _ in started:
        worker.request_stop()
    for result in await asyncio.gather(*(t for _, t in started), return_exceptions=True):
        if isinstance(result, BaseException):
            raise result


async def enqueue_flood_then_quiet(settings: Settings, job_type: str) -> int:
    """Tenant a's flood, then the quiet tenants' jobs, one send each: keys shared by all,
    each job's payload its key's sequence number. The number of jobs."""
    topic = lane_topic(settings.topic_prefix, job_type)
    seq: dict[str, int] = {}

    def job(tenant: str, i: int) -> tuple[str, JobRecord]:
        # Every fifth job on a key all tenants share; the flood's others each on a key
        # of its own (a bulk import: one entity each), the quiet tenants' on a few.
        own = i if tenant == "a" else i % KEYS
        key = f"shared{i % 2}" if i % 5 == 0 else f"{tenant}{own}"
        seq[key] = seq.get(key, 0) + 1
        return topic, JobRecord(new_job_id(), job_type, b'{"seq": %d}' % seq[key],
                                key.encode(), enqueued_at_ms=int(time.time() * 1000),
                                tenant=tenant)

    async with JobProducer(settings) as producer:
        await producer.send_many([job("a", i) for i in range(FLOOD)])
        await producer.send_many([job(t, i) for i in range(QUIET_EACH)
                                  for t in QUIET_TENANTS])
    return FLOOD + QUIET_EACH * len(QUIET_TENANTS)


async def run_flood(app: App, settings: Settings, declare: Declare, job_type: str,
                    running: Callable[[Worker], asyncio.Task[None]], **toml: Any
                    ) -> list[tuple[str, str, int]]:
    """(tenant, key, seq) of each run, in the order the runs started."""
    await declare(job_type, partitions=2, **toml)
    started: list[tuple[str, str, int]] = []

    @app.job(job_type, concurrency=8, ordering="key")
    async def run(job: dict[str, Any], ctx: JobContext) -> None:
        started.append((ctx.tenant or "", ctx.key or "", job["seq"]))
        await asyncio.sleep(0.002)

    total = await enqueue_flood_then_quiet(settings, job_type)
    global _worker, _started
    _started = started
    _worker = app.worker(job_type, relay=False)
    running(_worker)
    await until(lambda: len(started) >= total, f"all {total} jobs ran", within_s=120)
    return started


def last_quiet_start(started: list[tuple[str, str, int]]) -> int:
    """When the last quiet job on a key of its own started (a shared key's jobs follow
    the flood's earlier jobs of that key, wherever those are)."""
    return max(i for i, (tenant, key, _) in enumerate(started)
               if tenant in QUIET_TENANTS and not key.startswith("shared"))


def assert_key_order(started: list[tuple[str, str, int]]) -> None:
    by_key: dict[str, list[int]] = {}
    for _, key, seq in started:
        by_key.setdefault(key, []).append(seq)
    for key, seqs in by_key.items():
        assert seqs == sorted(seqs), f"key {key} ran out of order: {seqs[:40]}"


async def test_a_flood_moves_to_the_overflow_and_quiet_tenants_go_first(
        app: App, settings: Settings, declare: Declare,
        running: Callable[[Worker], asyncio.Task[None]]) -> None:
    started = await run_flood(app, settings, declare, "fair.flood", running,
                              retry_tiers=["1s"], fairness={"noisy_min_jobs": 30})
    total = FLOOD + QUIET_EACH * len(QUIET_TENANTS)
    assert len(started) == total  # each once: no duplicate run, none lost
    # The quiet tenants' jobs sat behind 2,000 of the flood's: those on keys of their own
    # all started within the first quarter of the runs, not at the end.
    assert last_quiet_start(started) < total // 4, last_quiet_start(started)
    assert_key_order(started)
    moved = await read_topic(settings, overflow_topic(settings.topic_prefix, "fair.flood"))
    assert len(moved) > FLOOD // 2, len(moved)
    # Of the quiet tenants' jobs, only those on a key the flood shares followed it there.
    assert {r.key for r in moved if r.headers[-1] != ("sj-tenant", b"a")} <= {
        b"shared0", b"shared1"}


async def test_without_fairness_the_quiet_tenants_wait_behind_the_flood(
        app: App, settings: Settings, declare: Declare,
        running: Callable[[Worker], asyncio.Task[None]]) -> None:
    started = await run_flood(app, settings, declare, "fair.none", running,
                              retry_tiers=["1s"])
    total = FLOOD + QUIET_EACH * len(QUIET_TENANTS)
    assert last_quiet_start(started) > total * 3 // 4
    assert_key_order(started)


async def test_order_and_once_hold_while_workers_join_and_leave_mid_flood(
        app: App, settings: Settings, declare: Declare,
        running: Callable[[Worker], asyncio.Task[None]]) -> None:
    """Two rebalances while a flood moves to the overflow: a second worker joins (lane and
    overflow partitions move to it, and it reads the overflow's waiting keys), then the
    first leaves. Each job's effect happens once, and each key's effects happen in the
    order its jobs were enqueued."""
    await declare("fair.moves", partitions=4, retry_tiers=["1s"],
                  fairness={"noisy_min_jobs": 30})
    conn = await connect(settings)
    await conn.execute("CREATE TABLE effects (n serial PRIMARY KEY, job_id text UNIQUE,"
                       " key text, seq int, tenant text)")

    @app.job("fair.moves", concurrency=8, ordering="key")
    async def run(job: dict[str, Any], ctx: JobContext) -> None:
        async with ctx.once() as tx:
            await tx.execute("INSERT INTO effects (job_id, key, seq, tenant) "
                             "VALUES ($1, $2, $3, $4)", ctx.job_id, ctx.key, job["seq"],
                             ctx.tenant)
        await asyncio.sleep(0.02)  # slow enough that the flood outlasts a rebalance

    total = await enqueue_flood_then_quiet(settings, "fair.moves")

    async def effects() -> int:
        return int(await conn.fetchval("SELECT count(*) FROM effects"))

    first = app.worker("fair.moves", relay=False)
    running(first)
    await until(lambda: _at_least(effects, 300), "the first worker is under way")
    second = app.worker("fair.moves", relay=False)
    running(second)
    await until(lambda: sum(second.outcomes.values()) >= 100,
                "the second worker took partitions over and ran jobs of them")
    assert sum(first.outcomes.values()) < total  # it still had work when it shared
    first.request_stop()
    await until(lambda: _at_least(effects, total), f"all {total} effects", within_s=120)
    rows = await conn.fetch("SELECT key, seq, tenant FROM effects ORDER BY n")
    await conn.close()
    assert len(rows) == total  # each once (the job ID is unique), none lost
    assert_key_order([(r["tenant"], r["key"], r["seq"]) for r in rows])
    moved = await read_topic(settings, overflow_topic(settings.topic_prefix, "fair.moves"))
    assert moved, "the flood went through the overflow"


async def _at_least(count: Callable[[], Any], n: int) -> bool:
    return bool(await count() >= n)


async def test_a_tenants_concurrency_holds_across_workers_and_others_go_on(
        app: App, settings: Settings, declare: Declare,
        running: Callable[[Worker], asyncio.Task[None]]) -> None:
    """`tenant_concurrency = 6`, and 3 for tenant a, with two workers of 8 slots each: a
    never runs more than 3 jobs at once across both and reaches 3, b runs more than a but
    never more than 6, and b's jobs are not held up behind a's."""
    await declare("fair.limits", partitions=2, retry_tiers=["1s"],
                  fairness={"tenant_concurrency": 6, "overflow": False,
                            "tenants": {"a": {"concurrency": 3}}})
    now: dict[str, int] = {"a": 0, "b": 0}
    most: dict[str, int] = {"a": 0, "b": 0}
    done: list[tuple[str, str]] = []

    @app.job("fair.limits", concurrency=8, ordering="unordered")
    async def run(job: dict[str, Any], ctx: JobContext) -> None:
        tenant = ctx.tenant or ""
        now[tenant] += 1
        most[tenant] = max(most[tenant], now[tenant])
        try:
            await asyncio.sleep(0.05)
        finally:
            now[tenant] -= 1
        done.append((tenant, ctx.job_id))

    topic = lane_topic(settings.topic_prefix, "fair.limits")
    async with JobProducer(settings) as producer:
        await producer.send_many([(topic, JobRecord(
            new_job_id(), "fair.limits", b"{}", None, tenant=tenant,
            enqueued_at_ms=int(time.time() * 1000)))
            for tenant in ["a"] * 60 + ["b"] * 60])
    for _ in range(2):
        running(app.worker("fair.limits", relay=False))

    def ran(tenant: str) -> int:  # jobs, not runs: a rebalance may run a job again
        return len({job_id for t, job_id in done if t == tenant})

    await until(lambda: ran("b") == 60, "b's 60 jobs ran", within_s=60)
    assert ran("a") < 45  # a, at 3 at a time, was still at it
    await until(lambda: ran("a") == 60, "a's jobs ran too", within_s=60)
    assert most["a"] == 3  # reached, never passed
    assert 3 < most["b"] <= 6


async def test_a_tenant_quiet_again_stays_in_the_lane(
        app: App, settings: Settings, declare: Declare,
        running: Callable[[Worker], asyncio.Task[None]]) -> None:
    """Once the flood has run and its tenant's measures have faded (a 1 s window here),
    and its keys have drained from the overflow, its new jobs run from the lane."""
    await declare("fair.calm", partitions=2, retry_tiers=["1s"],
                  fairness={"noisy_min_jobs": 30, "noisy_window": "1s"})
    ran: list[str] = []

    @app.job("fair.calm", concurrency=8, ordering="key")
    async def run(job: dict[str, Any], ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    total = await enqueue_flood_then_quiet(settings, "fair.calm")
    worker = app.worker("fair.calm", relay=False)
    running(worker)
    await until(lambda: len(set(ran)) == total, f"the {total} jobs of the flood ran")
    fair = worker.dispatcher
    assert isinstance(fair, FairDispatcher)
    assert fair.overflow is not None
    assert fair.overflow.forwarded > 0
    await until(lambda: not fair.judge.noisy(time.monotonic()), "tenant a is quiet again")
    assert fair.overflow.sticky_keys() == 0  # its keys drained with the overflow
    moved = fair.overflow.forwarded
    async with JobProducer(settings) as producer:
        await producer.send_many([(lane_topic(settings.topic_prefix, "fair.calm"), JobRecord(
            new_job_id(), "fair.calm", b"{}", b"shared0", tenant="a",
            enqueued_at_ms=int(time.time() * 1000))) for _ in range(20)])
    await until(lambda: len(set(ran)) == total + 20, "a's new jobs ran")
    assert fair.overflow.forwarded == moved  # from the lane, none forwarded
