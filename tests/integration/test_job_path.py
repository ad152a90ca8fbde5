"""The job path against the real broker and database: enqueue, run, retry, dead-letter."""

from __future__ import annotations

import asyncpg
import pytest
from pydantic import BaseModel

from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.context import JobContext
from stream_jobs.errors import PayloadError, UnknownJobType
from stream_jobs.settings import Settings

from .conftest import Declare


class Greeting(BaseModel):
    name: str
    n: int


async def test_enqueued_jobs_run_once_each(app: App, declare: Declare) -> None:
    await declare("greet.send", partitions=3, retry_tiers=["1s"], max_attempts=2)
    ran: list[tuple[str, int]] = []

    @app.job("greet.send", concurrency=8)
    async def greet(job: Greeting, ctx: JobContext) -> None:
        ran.append((job.name, ctx.attempt))

    async with app.client() as client:
        ids = await client.enqueue_many(
            [Job("greet.send", Greeting(name=f"u{i}", n=i)) for i in range(50)])
        one = await client.enqueue("greet.send", {"name": "solo", "n": -1}, key="k1")
    assert len(set(ids)) == 50
    assert one not in ids

    worker = app.worker("greet.send")
    await worker.run(until_idle=True)
    assert sorted(name for name, _ in ran) == sorted([f"u{i}" for i in range(50)] + ["solo"])
    assert {attempt for _, attempt in ran} == {1}
    assert worker.outcomes["succeeded"] == 51


async def test_once_writes_effects_exactly_once(app: App, declare: Declare,
                                                settings: Settings) -> None:
    await declare("ledger.add", partitions=2)
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    await conn.execute("CREATE TABLE effects (job_id text, amount int)")

    @app.job("ledger.add")
    async def add(job: dict[str, int], ctx: JobContext) -> None:
        async with ctx.once() as tx:
            await tx.execute("INSERT INTO effects VALUES ($1, $2)", ctx.job_id, job["amount"])

    async with app.client() as client:
        ids = [await client.enqueue("ledger.add", {"amount": i}, job_id=f"fixed-{i}")
               for i in range(20)]
        # The same job IDs again: a producer retrying its enqueue.
        for i in range(20):
            await client.enqueue("ledger.add", {"amount": i}, job_id=f"fixed-{i}")

    worker = app.worker("ledger.add")
    await worker.run(until_idle=True)
    rows = await conn.fetch("SELECT job_id, count(*) AS n FROM effects GROUP BY job_id")
    await conn.close()
    assert {r["job_id"] for r in rows} == set(ids)
    assert all(r["n"] == 1 for r in rows)
    assert worker.outcomes["succeeded"] == 20
    assert worker.outcomes["duplicate"] == 20


async def test_bad_enqueues_are_refused_before_sending(app: App, declare: Declare) -> None:
    await declare("greet.send", partitions=1, max_payload_bytes=1000)

    @app.job("greet.send")
    async def greet(job: Greeting, ctx: JobContext) -> None:
        raise AssertionError("never runs")

    async with app.client() as client:
        with pytest.raises(UnknownJobType, match=r"topics/nope\.toml"):
            await client.enqueue("nope", {})
        with pytest.raises(PayloadError, match="over the limit"):
            await client.enqueue("greet.send", {"name": "x" * 2000, "n": 1})
        with pytest.raises(PayloadError, match="does not fit Greeting"):
            await client.enqueue("greet.send", {"name": "x"})


async def test_sync_client_enqueues_from_plain_threads(app: App, declare: Declare) -> None:
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    await declare("greet.send", partitions=2)
    ran: list[str] = []

    @app.job("greet.send")
    async def greet(job: Greeting, ctx: JobContext) -> None:
        ran.append(job.name)

    def from_a_view() -> list[str]:
        with app.sync_client() as client, ThreadPoolExecutor(4) as pool:
            return list(pool.map(
                lambda i: client.enqueue("greet.send", {"name": f"t{i}", "n": i}), range(20)))

    ids = await asyncio.to_thread(from_a_view)
    assert len(set(ids)) == 20
    await app.worker("greet.send").run(until_idle=True)
    assert sorted(ran) == sorted(f"t{i}" for i in range(20))
