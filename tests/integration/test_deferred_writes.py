"""`ctx.once_deferred()` on the real broker and Postgres: many jobs' dedup rows and
effects in one transaction, with the guarantee of `ctx.once()`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.context import JobContext
from stream_jobs.naming import dlq_topic
from stream_jobs.record import decode_record
from stream_jobs.settings import Settings
from tests.integration.conftest import Declare
from tests.integration.database import connect
from tests.integration.topic_reader import read_topic
from tests.waiting import until


@asynccontextmanager
async def table_locked(settings: Settings, table: str) -> AsyncIterator[None]:
    """`table` held in EXCLUSIVE mode by another connection until the block ends: every
    claim or write on it waits meanwhile."""
    locker = await connect(settings)
    try:
        async with locker.transaction():
            await locker.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")
            yield
    finally:
        await locker.close()


async def test_deferred_effects_happen_once_in_each_jobs_own_order(
        app: App, declare: Declare, settings: Settings) -> None:
    await declare("ledger.post", partitions=4)
    conn = await connect(settings)
    # The child row references the parent: applied out of the job's order, it would fail.
    await conn.execute("CREATE TABLE entries (job_id text PRIMARY KEY, amount int)")
    await conn.execute("CREATE TABLE lines (job_id text REFERENCES entries, n int)")
    await conn.execute("CREATE TABLE totals (name text PRIMARY KEY, sum int)")
    await conn.execute("INSERT INTO totals VALUES ('all', 0)")

    @app.job("ledger.post", ordering="unordered", concurrency=64)
    async def post(job: dict[str, int], ctx: JobContext) -> None:
        async with ctx.once_deferred() as writes:
            await writes.execute("INSERT INTO entries VALUES ($1, $2)", ctx.job_id, job["n"])
            await writes.executemany("INSERT INTO lines VALUES ($1, $2)",
                                     [(ctx.job_id, i) for i in range(job["n"] % 3)])
            await writes.execute("UPDATE totals SET sum = sum + $1 WHERE name = 'all'",
                                 job["n"])

    n = 600
    async with app.client() as client:
        ids = await client.enqueue_many(
            [Job("ledger.post", {"n": i}, job_id=f"post-{i}") for i in range(n)])
        # A producer retrying some of its enqueues.
        await client.enqueue_many(
            [Job("ledger.post", {"n": i}, job_id=f"post-{i}") for i in range(0, n, 3)])

    worker = app.worker("ledger.post")
    await worker.run(until_idle=True)
    try:
        assert set(await conn.fetchval("SELECT array_agg(job_id) FROM entries")) == set(ids)
        assert await conn.fetchval("SELECT count(*) FROM lines") == sum(i % 3 for i in range(n))
        assert await conn.fetchval("SELECT sum FROM totals") == sum(range(n))
        done = await conn.fetchval(
            "SELECT count(*) FROM stream_jobs_done WHERE job_type = 'ledger.post'")
    finally:
        await conn.close()
    assert done == n
    assert worker.outcomes["succeeded"] == n
    assert worker.outcomes["duplicate"] == n // 3


async def test_a_failing_statement_fails_its_job_alone_and_writes_nothing_of_it(
        app: App, declare: Declare, settings: Settings) -> None:
    await declare("ledger.check", partitions=1, retry_tiers=["1s"], max_attempts=2)
    conn = await connect(settings)
    await conn.execute("CREATE TABLE amounts (job_id text, amount int CHECK (amount >= 0))")
    runs: dict[str, int] = {}
    recorded: set[str] = set()

    @app.job("ledger.check", ordering="unordered", concurrency=64)
    async def check(job: dict[str, int], ctx: JobContext) -> None:
        runs[ctx.job_id] = runs.get(ctx.job_id, 0) + 1
        async with ctx.once_deferred() as writes:
            await writes.execute("INSERT INTO amounts VALUES ($1, $2)", ctx.job_id, job["a"])
            if job["a"] == 7 and runs[ctx.job_id] == 1:
                raise RuntimeError("the body fails before its block ends, once")
            recorded.add(ctx.job_id)

    async with app.client() as client:
        good = await client.enqueue_many([Job("ledger.check", {"a": a}) for a in range(40)])
        bad = await client.enqueue("ledger.check", {"a": -1})
    # Hold the table locked until every first run has recorded: the first batch waits on
    # the lock, so all the others (the bad statement among them) form the next batch.
    worker = app.worker("ledger.check")
    async with table_locked(settings, "amounts"):
        running = asyncio.create_task(worker.run(until_idle=True))
        await until(lambda: len(recorded) == 40, "every first run recorded its statement")
    await running
    try:
        rows = await conn.fetch("SELECT job_id, count(*) AS n FROM amounts GROUP BY job_id")
        claimed = {r["job_id"] for r in await conn.fetch("SELECT job_id FROM stream_jobs_done")}
    finally:
        await conn.close()
    assert {r["job_id"]: r["n"] for r in rows} == {job_id: 1 for job_id in good}
    assert claimed == set(good)  # the bad job's dedup row rolled back with its statement
    assert runs[bad] == 2  # retried; nothing of either run kept
    assert runs[good[7]] == 2  # retried; nothing of the first run kept
    # The jobs that shared the bad statement's transaction committed without a retry.
    assert [job_id for job_id in good if runs[job_id] != 1] == [good[7]]
    letters = await read_topic(settings, dlq_topic(settings.topic_prefix, "ledger.check"))
    assert len(letters) == 1
    letter = decode_record(key=letters[0].key, value=letters[0].value,
                           headers=letters[0].headers, expected_type="ledger.check",
                           max_payload_bytes=10**6)
    assert letter.job_id == bad
    assert letter.failure is not None
    assert letter.failure.error_class.endswith("CheckViolationError")
    assert worker.outcomes["succeeded"] == 40
    assert worker.outcomes["dead_lettered"] == 1


async def test_jobs_waiting_for_their_commit_lend_their_slots(
        app: App, declare: Declare, settings: Settings) -> None:
    """While a batch cannot commit, a type of concurrency 2 keeps starting jobs (their
    bodies record and wait), yet never runs more than 2 bodies at once; all commit once."""
    await declare("ledger.lend", partitions=2)
    conn = await connect(settings)
    await conn.execute("CREATE TABLE lent (job_id text PRIMARY KEY)")
    recording = 0
    most_recording = 0
    recorded: set[str] = set()

    @app.job("ledger.lend", ordering="unordered", concurrency=2)
    async def lend(job: dict[str, int], ctx: JobContext) -> None:
        nonlocal recording, most_recording
        recording += 1
        most_recording = max(most_recording, recording)
        await asyncio.sleep(0)  # a body that awaits, so overlapping bodies would show
        async with ctx.once_deferred() as writes:
            await writes.execute("INSERT INTO lent VALUES ($1)", ctx.job_id)
            recorded.add(ctx.job_id)
            recording -= 1

    n = 40
    async with app.client() as client:
        ids = await client.enqueue_many([Job("ledger.lend", {"n": i}) for i in range(n)])
    worker = app.worker("ledger.lend")
    async with table_locked(settings, "stream_jobs_done"):  # no batch can commit
        running = asyncio.create_task(worker.run(until_idle=True))
        await until(lambda: len(recorded) == n, "every job recorded while none can commit")
        assert await conn.fetchval("SELECT count(*) FROM lent") == 0
        assert worker.outcomes["succeeded"] == 0
    await asyncio.wait_for(running, 60)
    try:
        assert set(await conn.fetchval("SELECT array_agg(job_id) FROM lent")) == set(ids)
    finally:
        await conn.close()
    assert worker.outcomes["succeeded"] == n
    assert most_recording <= 2
