"""Child jobs: `ctx.enqueue` inside `ctx.once()` / `ctx.once_deferred()` writes them in the
parent's exactly-once transaction, so parent effect and child jobs commit together, a
failed parent run leaves no child, and a parent's duplicate makes no second child."""

from __future__ import annotations

import pytest

from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.context import JobContext
from stream_jobs.errors import NotInTransaction
from stream_jobs.outbox.relay import OutboxRelay
from stream_jobs.outbox.rows import child_job_id
from stream_jobs.settings import Settings
from tests.integration.conftest import Declare
from tests.integration.database import connect


@pytest.fixture
async def tables(app: App, declare: Declare, settings: Settings) -> App:
    await declare("invoice.issue", partitions=2, retry_tiers=["1s"], max_attempts=3)
    await declare("invoice.render", partitions=2)
    conn = await connect(settings)
    # No unique constraints: a second effect of one job would show as a second row.
    await conn.execute("CREATE TABLE issued (job_id text NOT NULL, n int NOT NULL)")
    await conn.execute("CREATE TABLE rendered (job_id text NOT NULL, parent text NOT NULL)")
    await conn.close()

    @app.job("invoice.render", ordering="unordered")
    async def render(job: dict[str, str], ctx: JobContext) -> None:
        async with ctx.once() as conn:
            await conn.execute("INSERT INTO rendered VALUES ($1, $2)", ctx.job_id, job["parent"])

    return app


async def _run(app: App, settings: Settings) -> tuple[dict[str, int], dict[str, int]]:
    """Parents, then the relay, then the children; the workers' outcomes."""
    parents = app.worker("invoice.issue")
    await parents.run(until_idle=True)
    async with OutboxRelay(settings) as relay:
        await relay.drain()
    children = app.worker("invoice.render")
    await children.run(until_idle=True)
    return dict(parents.outcomes), dict(children.outcomes)


async def _rows(settings: Settings, sql: str) -> list[tuple[str, ...]]:
    conn = await connect(settings)
    try:
        return sorted(tuple(r) for r in await conn.fetch(sql))
    finally:
        await conn.close()


async def test_children_commit_with_the_parent_once_and_only_once(
        tables: App, settings: Settings) -> None:
    app = tables
    misuse: list[Exception] = []
    runs: list[tuple[str, int]] = []

    @app.job("invoice.issue", ordering="unordered")
    async def issue(job: dict[str, int], ctx: JobContext) -> None:
        runs.append((ctx.job_id, ctx.attempt))
        try:
            await ctx.enqueue("invoice.render", {"parent": ctx.job_id})
        except NotInTransaction as exc:  # outside once(): refused, nothing written
            misuse.append(exc)
        async with ctx.once() as conn:
            await conn.execute("INSERT INTO issued VALUES ($1, $2)", ctx.job_id, job["n"])
            await ctx.enqueue("invoice.render", {"parent": ctx.job_id})
            await ctx.enqueue("invoice.render", {"parent": ctx.job_id}, name="receipt")
            if job["n"] % 4 == 0 and ctx.attempt == 1:
                raise RuntimeError("failed after its effect and children: all rolled back")

    async with app.client() as client:
        ids = await client.enqueue_many([Job("invoice.issue", {"n": n}) for n in range(12)])
        await client.enqueue_many([Job("invoice.issue", {"n": 1}, job_id=ids[1])])  # again
    parents, children = await _run(app, settings)
    # Every run was refused: first runs, retries, the duplicate, and the runs again of
    # jobs whose ctx.once() was rolled back with a failing job's (same job and attempt).
    assert len(misuse) == len(runs) >= 12 + 3 + 1
    assert len(set(runs)) == 12 + 3
    assert parents == {"succeeded": 12, "retried": 3, "duplicate": 1}
    assert children == {"succeeded": 24}
    assert [r[0] for r in await _rows(settings, "SELECT job_id FROM issued")] == sorted(ids)
    # The position counts every enqueue call of the run, the refused one too.
    expected = sorted((child_job_id(p, name), p) for p in ids for name in ("1", "receipt"))
    assert await _rows(settings, "SELECT job_id, parent FROM rendered") == expected


async def test_children_of_deferred_writes_are_applied_with_the_batch(
        tables: App, settings: Settings) -> None:
    app = tables
    late: list[Exception] = []

    @app.job("invoice.issue", ordering="unordered", concurrency=32)
    async def issue(job: dict[str, int], ctx: JobContext) -> None:
        async with ctx.once_deferred() as writes:
            await writes.execute("INSERT INTO issued VALUES ($1, $2)", ctx.job_id, job["n"])
            await ctx.enqueue("invoice.render", {"parent": ctx.job_id})
        try:
            await ctx.enqueue("invoice.render", {"parent": ctx.job_id})
        except NotInTransaction as exc:  # the block has ended: it would never be written
            late.append(exc)

    async with app.client() as client:
        ids = await client.enqueue_many([Job("invoice.issue", {"n": n}) for n in range(40)])
        await client.enqueue_many([Job("invoice.issue", {"n": n}, job_id=ids[n])
                                   for n in range(0, 40, 5)])  # duplicates: no children
    parents, children = await _run(app, settings)
    assert parents == {"succeeded": 40, "duplicate": 8}
    assert len(late) == 40
    assert children == {"succeeded": 40}
    expected = sorted((child_job_id(p, "0"), p) for p in ids)
    assert await _rows(settings, "SELECT job_id, parent FROM rendered") == expected
