"""Operators see tenants, against the real stack: `stats T --tenants` counts the jobs
waiting by tenant exactly (and says "at least" at its bound), the workers' reports give
in flight and dwell; the overflow lane `P.T.overflow` shows like a lane in `stats`,
`topics list`, `waiting` and `job`, also for a job the worker itself moved there.

Nothing waits by sleeping: every wait polls a condition against a deadline.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
import pytest

from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.context import JobContext
from stream_jobs.fairness.census import TenantCensus
from stream_jobs.job_ids import new_job_id
from stream_jobs.job_types import JobTypePolicy, load_job_types
from stream_jobs.kafka.producer import JobProducer
from stream_jobs.kafka.topics import apply
from stream_jobs.lookup import locate_job
from stream_jobs.naming import overflow_topic
from stream_jobs.record import JobRecord
from stream_jobs.settings import Settings
from stream_jobs.tools.tenant_stats import collect_tenants
from stream_jobs.waiting import waiting_page
from tests.integration.cli_env import settings_env

from .conftest import Declare
from .topic_reader import read_topic

pytestmark = pytest.mark.integration

STREAM_JOBS = Path(sys.executable).with_name("stream-jobs")
POLL_S = 0.05
FAIR = "ten.views"


async def _until(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(POLL_S)


async def _declare_fair(settings: Settings, **extra: str) -> JobTypePolicy:
    """`topics/ten.views.toml` with a [fairness] table, applied (the overflow lane made)."""
    lines = "".join(f"{key} = {value}\n" for key, value in extra.items())
    (settings.topics_dir / f"{FAIR}.toml").write_text(
        f"partitions = 2\n{lines}\n[fairness]\noverflow = true\n")
    types = load_job_types(settings.topics_dir)
    await apply(settings, types)
    return types[FAIR]


def _job(tenant: str | None) -> JobRecord:
    return JobRecord(job_id=new_job_id(), job_type=FAIR, payload=b"{}", key=None, attempt=1,
                     enqueued_at_ms=int(time.time() * 1000), tenant=tenant)


async def _cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    proc = await asyncio.create_subprocess_exec(
        str(STREAM_JOBS), *args, env=settings_env(settings, COLUMNS="80"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return subprocess.CompletedProcess(args, proc.returncode or 0, out.decode(), err.decode())


def _by_name(census: TenantCensus) -> dict[str, tuple[int, int, int]]:
    return {name: (f.waiting, f.overflow, f.in_flight) for name, f in census.top}


async def test_waiting_by_tenant_is_exact_and_the_overflow_lane_shows_like_a_lane(
        app: App, settings: Settings) -> None:
    await _declare_fair(settings)
    types = load_job_types(settings.topics_dir)
    overflow = overflow_topic(settings.topic_prefix, FAIR)
    plan = {"acme": 7, "globex": 3, None: 2}
    async with app.client() as client:
        await client.enqueue_many([Job(FAIR, {"n": n}, tenant=tenant)
                                   for tenant, count in plan.items() for n in range(count)])
    async with JobProducer(settings) as producer:
        moved = [_job("acme") for _ in range(2)]  # as the forwarding writes them
        for record in moved:
            await producer.send(overflow, record)

    census = await collect_tenants(settings, types, FAIR)
    assert _by_name(census) == {"acme": (7, 2, 0), "globex": (3, 0, 0), "": (2, 0, 0)}
    assert (census.complete, census.scanned, census.workers) == (True, 14, 0)
    bounded = await collect_tenants(settings, types, FAIR, max_records=5)
    assert not bounded.complete
    assert bounded.scanned <= 5

    document, table, stats, topics, waiting, job = await asyncio.gather(
        _cli(settings, "stats", FAIR, "--tenants", "--json"),
        _cli(settings, "stats", FAIR, "--tenants"),
        _cli(settings, "stats", FAIR, "--json"),
        _cli(settings, "topics", "list"),
        _cli(settings, "waiting", FAIR, "--json"),
        _cli(settings, "job", moved[0].job_id, "--json"))
    for done in (document, table, stats, topics, waiting, job):
        assert done.returncode == 0, done.stderr
    tenants = orjson.loads(document.stdout)
    assert [(t["tenant"], t["waiting"], t["overflow"]) for t in tenants["tenants"]] == [
        ("acme", 7, 2), ("globex", 3, 0), ("", 2, 0)]
    assert tenants["total"]["waiting"] == 12
    assert tenants["scan"] == {"records": 14, "max_records": 100_000, "complete": True}
    assert "acme" in table.stdout
    assert "(none)" in table.stdout
    assert max(len(line) for line in table.stdout.splitlines()) <= 80
    lanes = orjson.loads(stats.stdout)["types"][FAIR]["lanes"]
    assert {name: lane["lag"] for name, lane in lanes.items()} == {"default": 12, "overflow": 2}
    (row,) = [line for line in topics.stdout.splitlines() if overflow in line]
    assert row.replace(overflow, "").split("│")[2].strip() == "overflow"  # its role
    listed = orjson.loads(waiting.stdout)
    assert listed["total"] == 14
    assert {row["place"] for row in listed["rows"]} == {"default", "overflow"}
    found = orjson.loads(job.stdout)
    assert found["status"] == "pending"

    page = await waiting_page(settings, types[FAIR], "pending", size=50)
    assert [row.place for row in page.rows].count("overflow") == 2

    refused = await _cli(settings, "stats", "--tenants")
    assert refused.returncode == 1
    assert "--tenants shows one type" in refused.stderr


async def test_in_flight_and_dwell_come_from_the_workers_reports(
        app: App, settings: Settings) -> None:
    await _declare_fair(settings)
    types = load_job_types(settings.topics_dir)
    release = asyncio.Event()

    @app.job(FAIR, concurrency=2)
    async def handle(job: dict[str, object], ctx: JobContext) -> None:
        await release.wait()

    async with app.client() as client:
        await client.enqueue_many([Job(FAIR, {}, tenant=tenant)
                                   for tenant in ["acme"] * 5 + ["globex"] * 2])
    worker = app.worker(FAIR, report_interval_s=0.2)
    running = asyncio.create_task(worker.run())
    try:
        seen: list[TenantCensus] = []

        async def held() -> bool:
            if running.done():
                await running  # surfaces the worker's error
            seen.append(await collect_tenants(settings, types, FAIR))
            return _by_name(seen[-1]).get("acme", (0, 0, 0))[2] == 5

        await _until(held, "the report holds acme's 5 jobs in flight")
        assert _by_name(seen[-1])["globex"][2] == 2
        assert seen[-1].workers == 1
        release.set()

        async def dwelt() -> bool:
            if running.done():
                await running
            seen.append(await collect_tenants(settings, types, FAIR))
            figures = dict(seen[-1].top)
            return (seen[-1].total.in_flight == 0 and seen[-1].total.waiting == 0
                    and "acme" in figures and sum(figures["acme"].dwells) == 5)

        await _until(dwelt, "the reports' dwells count acme's 5 runs")
        finished = await _cli(settings, "stats", FAIR, "--tenants", "--json")
        assert finished.returncode == 0, finished.stderr
        rows = {t["tenant"]: t for t in orjson.loads(finished.stdout)["tenants"]}
        assert rows["acme"]["dwell_p95_s"] is not None
        assert (rows["acme"]["dwells"], rows["globex"]["dwells"]) == (5, 2)
    finally:
        release.set()
        worker.request_stop()
        await running


async def test_a_job_the_worker_moved_to_the_overflow_is_found_there(
        app: App, settings: Settings, declare: Declare) -> None:
    """The real forwarding: a flood's jobs moved to P.T.overflow by a worker whose
    handlers are held count as the flood's overflow, and `job` finds one pending there."""
    await declare(FAIR, partitions=1, fairness={"noisy_min_jobs": 5})
    types = load_job_types(settings.topics_dir)
    overflow = overflow_topic(settings.topic_prefix, FAIR)
    release = asyncio.Event()

    @app.job(FAIR, concurrency=2)
    async def handle(job: dict[str, object], ctx: JobContext) -> None:
        await release.wait()

    async with app.client() as client:
        await client.enqueue_many([Job(FAIR, {}, tenant="flood") for _ in range(200)])
    worker = app.worker(FAIR, relay=False, report_interval_s=0.2)
    running = asyncio.create_task(worker.run())
    try:
        seen: list[TenantCensus] = []

        async def moved() -> bool:
            if running.done():
                await running
            seen.append(await collect_tenants(settings, types, FAIR))
            return _by_name(seen[-1]).get("flood", (0, 0, 0))[1] > 0

        await _until(moved, "the flood's jobs count in the overflow lane")
        (record, *_) = await read_topic(settings, overflow)
        job_id = dict(record.headers)["sj-job-id"].decode()
        found = await locate_job(settings, types, job_id)
        assert found.status in ("pending", "running")
        assert found.last is not None
        assert found.last.role == "overflow"
        release.set()

        async def drained() -> bool:
            if running.done():
                await running
            seen.append(await collect_tenants(settings, types, FAIR))
            return seen[-1].total.jobs == 0

        await _until(drained, "every job of the flood finished", timeout_s=60)
    finally:
        release.set()
        worker.request_stop()
        await running
