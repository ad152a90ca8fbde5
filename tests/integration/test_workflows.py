"""Chains and batches on the real stack: each next step and each callback is written in
the transaction that commits the step or member before it, so it runs once, after it,
however often members are retried or delivered again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest
from pydantic import BaseModel

from stream_jobs.app import App
from stream_jobs.client import Job, JobClient
from stream_jobs.context import JobContext
from stream_jobs.errors import ConfigError, JobCancelled, PermanentError, UnknownWorkflow
from stream_jobs.outbox.relay import OutboxRelay
from stream_jobs.runtime.worker import Worker
from stream_jobs.settings import Settings
from stream_jobs.workflows import BatchSummary, step_job_id
from stream_jobs.workflows.members import callback_job_id
from tests.integration.conftest import Declare
from tests.integration.database import fetch_rows
from tests.waiting import until

STEP, MEMBER, DONE = "flow.step", "flow.member", "flow.done"


@pytest.fixture
async def flows(app: App, declare: Declare, settings: Settings) -> App:
    for job_type in (STEP, MEMBER, DONE):
        await declare(job_type, partitions=3, retry_tiers=["1s"], max_attempts=3)
    # No unique constraints: a callback or step that ran twice would show twice.
    await fetch_rows(settings, "CREATE TABLE ran (job_id text NOT NULL, kind text NOT NULL, "
                        "payload jsonb, at timestamptz NOT NULL DEFAULT clock_timestamp())")
    return app


@contextlib.asynccontextmanager
async def running(app: App, settings: Settings, *types: str) -> AsyncIterator[list[Worker]]:
    """Workers for `types` and an outbox relay, as `stream-jobs worker` runs them."""
    workers = [app.worker(t) for t in types]
    stop = asyncio.Event()
    relay = OutboxRelay(settings)
    tasks = [asyncio.create_task(w.run()) for w in workers]
    tasks.append(asyncio.create_task(relay.run(stop)))
    try:
        yield workers
    finally:
        stop.set()
        for worker in workers:
            worker.request_stop()
        await asyncio.gather(*tasks)


async def ran(settings: Settings, kind: str) -> list[asyncpg.Record]:
    return await fetch_rows(settings, "SELECT job_id, payload, at FROM ran WHERE kind = $1 "
                               "ORDER BY at", kind)


def finished(client: JobClient, workflow_id: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return (await client.progress(workflow_id)).pending == 0
    return check


class Step(BaseModel):
    add: int


async def test_a_chain_runs_its_steps_in_turn_with_the_parents_result(
        flows: App, settings: Settings) -> None:
    app = flows
    parents: list[Any] = []

    @app.job(STEP, ordering="unordered")
    async def step(job: Step, ctx: JobContext) -> int:
        parents.append(ctx.parent_result)
        async with ctx.once() as conn:
            await conn.execute("INSERT INTO ran (job_id, kind) VALUES ($1, 'step')", ctx.job_id)
        if job.add == 20 and ctx.attempt == 1:
            raise RuntimeError("a retried step: the chain waits for it")
        return (ctx.parent_result or 0) + job.add

    async with app.client() as client, running(app, settings, STEP):
        chain_id = await client.chain(Job(STEP, {"add": 1}), Job(STEP, {"add": 20}),
                                      Job(STEP, {"add": 300}))
        await until(finished(client, chain_id), "the chain to finish", 60)
        progress = await client.progress(chain_id)
        last = await client.result(step_job_id(chain_id, 2), timeout=5)
    assert progress.state == "succeeded"
    assert progress.succeeded == 3
    assert parents == [None, 1, 1, 21]  # step 1 ran twice (a retry), with the same parent
    assert last == 321
    steps = [r["job_id"] for r in await ran(settings, "step")]
    assert steps == [step_job_id(chain_id, i) for i in range(3)]  # in turn, each once


async def test_a_dead_lettered_step_stops_the_chain_and_says_where(
        flows: App, settings: Settings) -> None:
    app = flows

    @app.job(STEP)
    async def step(job: Step, ctx: JobContext) -> int:
        if job.add == 2:
            raise PermanentError("no such account")
        async with ctx.once() as conn:
            await conn.execute("INSERT INTO ran (job_id, kind) VALUES ($1, 'step')", ctx.job_id)
        return job.add

    async with app.client() as client, running(app, settings, STEP):
        chain_id = await client.chain(*(Job(STEP, {"add": n}) for n in (1, 2, 3)))
        await until(finished(client, chain_id), "the chain to stop", 60)
        progress = await client.progress(chain_id)
    assert progress.state == "failed"
    assert progress.failed_step == 1
    assert "PermanentError: no such account" in (progress.failure or "")
    assert f"stopped at step 1 of 3 ({step_job_id(chain_id, 1)})" in progress.summary()
    assert [r["job_id"] for r in await ran(settings, "step")] == [step_job_id(chain_id, 0)]


class Done(BaseModel):
    album: str
    batch: BatchSummary | None = None


async def test_callbacks_run_once_after_every_member_with_the_counts(
        flows: App, settings: Settings) -> None:
    app = flows
    attempts: dict[int, int] = {}

    @app.job(MEMBER, ordering="unordered", concurrency=32)
    async def member(job: dict[str, int], ctx: JobContext) -> None:
        attempts[job["n"]] = ctx.attempt
        if job["n"] % 10 == 0 and ctx.attempt == 1:
            raise RuntimeError("fails once, then succeeds")
        if job["n"] in (7, 77):
            raise PermanentError("broken image")
        async with ctx.once_deferred() as writes:
            await writes.execute("INSERT INTO ran (job_id, kind) VALUES ($1, 'member')",
                                 ctx.job_id)

    @app.job(DONE, ordering="unordered")
    async def done(job: Done, ctx: JobContext) -> None:
        async with ctx.once() as conn:
            await conn.execute("INSERT INTO ran (job_id, kind, payload) VALUES ($1, $2, $3)",
                               ctx.job_id, job.album, job.model_dump_json())

    async with app.client() as client, running(app, settings, MEMBER, DONE) as workers:
        members = [Job(MEMBER, {"n": n}) for n in range(100)]
        batch_id = await client.batch(members, on_success=Job(DONE, Done(album="success")),
                                      on_complete=Job(DONE, Done(album="complete")))
        progress = await client.progress(batch_id)
        ids = [callback_job_id(batch_id, slot) for slot in ("on_success", "on_complete")]
        await until(finished(client, batch_id), "every member to finish", 90)
        # Members delivered again (a duplicate enqueue of finished IDs) move nothing.
        member_ids = [r["job_id"] for r in await ran(settings, "member")]
        await client.enqueue_many([Job(MEMBER, {"n": 1}, job_id=i) for i in member_ids[:20]])
        await until(lambda: workers[0].outcomes["duplicate"] >= 20, "the duplicates", 60)
        await until(lambda: workers[1].outcomes["succeeded"] >= 1, "the callback", 60)
        final = await client.progress(batch_id)
    assert progress.total == 100
    assert progress.pending == 100
    assert (final.succeeded, final.failed, final.state) == (98, 2, "completed")
    callbacks = await fetch_rows(settings, "SELECT job_id, kind, payload FROM ran "
                                    "WHERE kind IN ('success', 'complete')")
    assert [(r["job_id"], r["kind"]) for r in callbacks] == [(ids[1], "complete")]
    summary = Done.model_validate_json(callbacks[0]["payload"]).batch
    assert summary == BatchSummary(id=batch_id, total=100, succeeded=98, failed=2)
    last_member = max(r["at"] for r in await ran(settings, "member"))
    assert (await ran(settings, "complete"))[0]["at"] > last_member
    assert workers[1].outcomes == {"succeeded": 1}  # on_success was never written


async def test_an_all_succeeded_batch_fires_both_and_a_callback_may_start_a_batch(
        flows: App, settings: Settings) -> None:
    app = flows

    @app.job(MEMBER, ordering="unordered")
    async def member(job: dict[str, int], ctx: JobContext) -> None:
        async with ctx.once() as conn:
            await conn.execute("INSERT INTO ran (job_id, kind) VALUES ($1, 'member')", ctx.job_id)

    @app.job(DONE, ordering="unordered")
    async def done(job: Done, ctx: JobContext) -> None:
        async with ctx.once() as conn:
            await conn.execute("INSERT INTO ran (job_id, kind, payload) VALUES ($1, $2, $3)",
                               ctx.job_id, job.album, job.model_dump_json())
            if job.album == "outer":  # a callback starting a batch of its own
                await ctx.batch([Job(MEMBER, {"n": n}) for n in range(5)],
                                on_complete=Job(DONE, Done(album="inner")))

    async with app.client() as client, running(app, settings, MEMBER, DONE) as workers:
        empty = await client.batch([], on_success=Job(DONE, Done(album="empty")))
        outer = await client.batch([Job(MEMBER, {"n": n}) for n in range(10)],
                                   on_success=Job(DONE, Done(album="outer")),
                                   on_complete=Job(DONE, Done(album="outer-complete")))
        await until(lambda: workers[1].outcomes["succeeded"] >= 4, "four callbacks", 90)
    rows = {r["kind"]: r for r in await fetch_rows(settings, "SELECT kind, payload FROM ran "
                                                      "WHERE kind <> 'member'")}
    assert sorted(rows) == ["empty", "inner", "outer", "outer-complete"]
    counts = {kind: Done.model_validate_json(r["payload"]).batch for kind, r in rows.items()}
    assert counts["empty"] == BatchSummary(id=empty, total=0, succeeded=0, failed=0)
    assert counts["outer"] == BatchSummary(id=outer, total=10, succeeded=10, failed=0)
    inner = counts["inner"]
    assert inner is not None
    assert (inner.total, inner.succeeded) == (5, 5)
    assert len(await ran(settings, "member")) == 15
    assert (await flows.client().progress(inner.id)).parent_job_id == callback_job_id(
        outer, "on_success")


async def test_a_batch_in_the_callers_transaction_exists_only_if_it_commits(
        flows: App, settings: Settings) -> None:
    app = flows
    conn = await asyncpg.connect(settings.database_url)
    client = app.client()  # not entered: the batch goes through the caller's transaction
    made: list[str] = []

    async def rolled_back_work() -> None:
        async with conn.transaction():
            made.append(await client.batch([Job(MEMBER, {"n": 1})], conn=conn))
            raise RuntimeError("the caller's work failed")

    try:
        with pytest.raises(RuntimeError):
            await rolled_back_work()
        rolled_back = made[0]
        async with conn.transaction():
            kept = await client.batch([Job(MEMBER, {"n": 1})], conn=conn)
    finally:
        await conn.close()
    with pytest.raises(UnknownWorkflow, match="No batch or chain has the ID"):
        await client.progress(rolled_back)
    assert (await client.progress(kept)).pending == 1
    with pytest.raises(ConfigError, match="exists already"):
        await client.batch([Job(MEMBER, {"n": 2})], batch_id=kept)
    with pytest.raises(ConfigError, match="where the batch's summary goes"):
        await client.batch([Job(MEMBER, {"n": 2})],
                           on_success=Job(DONE, {"album": "x", "batch": {"id": "mine"}}))
    with pytest.raises(ConfigError, match="no delay or run_at"):
        await client.chain(Job(STEP, {"add": 1}), Job(STEP, {"add": 2}, delay=5))


async def test_a_cancelled_member_counts_as_finished_and_its_result_says_cancelled(
        flows: App, settings: Settings) -> None:
    app = flows

    @app.job(MEMBER, ordering="unordered", keep_result="1h")
    async def member(job: dict[str, int], ctx: JobContext) -> int:
        return job["n"]

    @app.job(DONE, ordering="unordered")
    async def done(job: Done, ctx: JobContext) -> None:
        async with ctx.once() as conn:
            await conn.execute("INSERT INTO ran (job_id, kind, payload) VALUES ($1, $2, $3)",
                               ctx.job_id, job.album, job.model_dump_json())

    async with app.client() as client:
        ids = [f"member-{n}-{settings.topic_prefix}" for n in range(3)]
        batch_id = await client.batch([Job(MEMBER, {"n": n}, job_id=i)
                                       for n, i in enumerate(ids)],
                                      on_success=Job(DONE, Done(album="success")),
                                      on_complete=Job(DONE, Done(album="complete")))
        await client.cancel(ids[1], reason="the album was deleted")
        with pytest.raises(JobCancelled, match="the album was deleted"):
            await client.result(ids[1], timeout=5)  # at once, from the cancel
        async with running(app, settings, MEMBER, DONE) as workers:
            await until(lambda: workers[1].outcomes["succeeded"] >= 1, "the callback", 60)
        assert workers[0].outcomes == {"succeeded": 2, "cancelled": 1}
        with pytest.raises(JobCancelled, match="cancelled: the album was deleted"):
            await client.result(ids[1], timeout=5)
        assert await client.result(ids[2], timeout=5) == 2
        final = await client.progress(batch_id)
    assert (final.succeeded, final.failed, final.state) == (2, 1, "completed")
    rows = await fetch_rows(settings, "SELECT kind, payload FROM ran")
    assert [r["kind"] for r in rows] == ["complete"]
    assert Done.model_validate_json(rows[0]["payload"]).batch == BatchSummary(
        id=batch_id, total=3, succeeded=2, failed=1)
