"""Kept results on the real stack: `@app.job(..., keep_result=...)` commits what the
handler returns with its dedup row and effects, `client.result` waits for it (woken by
NOTIFY), and a job that ends without success says why instead of timing out; a job with
no row of results is looked up as `stream-jobs job` does, so one that finished without
`ctx.once()` (no dedup row) is answered at once too."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from pydantic import BaseModel

from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.context import JobContext
from stream_jobs.errors import (
    ConfigError,
    JobExpired,
    JobFailed,
    ResultNotKept,
    ResultTimeout,
    ResultTooLarge,
)
from stream_jobs.job_types import load_job_types
from stream_jobs.lookup import locate as lookup
from stream_jobs.settings import Settings
from tests.integration.conftest import Declare
from tests.integration.database import fetch_rows

REPORT = "report.build"


class Report(BaseModel):
    n: int


class ReportResult(BaseModel):
    n: int
    square: int


@pytest.fixture
async def reports(app: App, declare: Declare, settings: Settings) -> App:
    await declare(REPORT, partitions=3, retry_tiers=["1s"], max_attempts=2)
    await fetch_rows(settings, "CREATE TABLE effects (job_id text NOT NULL, n int NOT NULL)")
    return app


async def test_a_thousand_results_each_read_back(reports: App, settings: Settings) -> None:
    app = reports

    @app.job(REPORT, keep_result="1h", ordering="unordered")
    async def build(job: Report, ctx: JobContext) -> ReportResult:
        return ReportResult(n=job.n, square=job.n * job.n)

    async with app.client() as client:
        ids = await client.enqueue_many([Job(REPORT, Report(n=n)) for n in range(1000)])
        worker = app.worker(REPORT)
        await worker.run(until_idle=True)
        assert worker.outcomes == {"succeeded": 1000}
        results = await asyncio.gather(*(client.result(job_id, timeout=5, model=ReportResult)
                                         for job_id in ids))
    assert [r.square for r in results] == [n * n for n in range(1000)]
    rows = await fetch_rows(settings, "SELECT count(*) AS n, min(expires_at - finished_at) AS keep "
                               "FROM stream_jobs_results")
    assert rows[0]["n"] == 1000
    assert rows[0]["keep"].total_seconds() == pytest.approx(3600, 1)


async def test_a_waiting_caller_is_woken_by_the_commit(reports: App) -> None:
    app = reports

    @app.job(REPORT, keep_result="1h")
    async def build(job: Report, ctx: JobContext) -> dict[str, int]:
        return {"n": job.n}

    async with app.client() as client:
        job_id = await client.enqueue(REPORT, Report(n=7))
        waiting = asyncio.create_task(client.result(job_id, timeout=60))
        await asyncio.sleep(0)  # the wait is listening before the worker starts
        await app.worker(REPORT).run(until_idle=True)
        assert await asyncio.wait_for(waiting, 10) == {"n": 7}
        with pytest.raises(ResultTimeout, match="no record of it was found"):
            await client.result("no-such-job", timeout=0.2)


async def test_once_effects_commit_with_the_result_when_the_handler_returns(
        reports: App, settings: Settings) -> None:
    app = reports
    after_block: list[str] = []

    @app.job(REPORT, keep_result="1h", ordering="unordered")
    async def build(job: Report, ctx: JobContext) -> int:
        async with ctx.once() as conn:
            await conn.execute("INSERT INTO effects VALUES ($1, $2)", ctx.job_id, job.n)
        # The block has ended but nothing is committed yet: the result joins it.
        seen = await fetch_rows(settings, "SELECT 1 FROM effects WHERE job_id = $1", ctx.job_id)
        after_block.append("visible" if seen else "not yet")
        if job.n == 3 and ctx.attempt == 1:
            raise RuntimeError("failed after its block: its effect rolls back")
        return job.n * 10

    async with app.client() as client:
        ids = await client.enqueue_many([Job(REPORT, Report(n=n)) for n in range(6)])
        await client.enqueue(REPORT, Report(n=1), job_id=ids[1])  # a duplicate delivery
        worker = app.worker(REPORT)
        await worker.run(until_idle=True)
        assert worker.outcomes == {"succeeded": 6, "retried": 1, "duplicate": 1}
        assert [await client.result(i, timeout=5) for i in ids] == [n * 10 for n in range(6)]
    assert set(after_block) == {"not yet"}
    effects = await fetch_rows(settings, "SELECT job_id FROM effects ORDER BY n")
    assert [r["job_id"] for r in effects] == ids  # once each, the failed run's rolled back


async def test_deferred_writes_commit_with_the_result(reports: App, settings: Settings) -> None:
    app = reports

    @app.job(REPORT, keep_result="1h", ordering="unordered", concurrency=16)
    async def build(job: Report, ctx: JobContext) -> list[int]:
        async with ctx.once_deferred() as writes:
            await writes.execute("INSERT INTO effects VALUES ($1, $2)", ctx.job_id, job.n)
        return [job.n]

    async with app.client() as client:
        ids = await client.enqueue_many([Job(REPORT, Report(n=n)) for n in range(50)])
        await app.worker(REPORT).run(until_idle=True)
        assert [await client.result(i, timeout=5) for i in ids] == [[n] for n in range(50)]
    assert len(await fetch_rows(settings, "SELECT 1 FROM effects")) == 50


async def test_a_result_over_the_limit_fails_the_job_and_nothing_commits(
        reports: App, settings: Settings) -> None:
    app = App(settings.model_copy(update={"max_result_bytes": 1000}))

    @app.job(REPORT, keep_result="1h")
    async def build(job: Report, ctx: JobContext) -> str:
        async with ctx.once() as conn:
            await conn.execute("INSERT INTO effects VALUES ($1, $2)", ctx.job_id, job.n)
        return "x" * job.n

    async with app.client() as client:
        small = await client.enqueue(REPORT, Report(n=10))
        big = await client.enqueue(REPORT, Report(n=5000))
        worker = app.worker(REPORT)
        await worker.run(until_idle=True)
        assert worker.outcomes == {"succeeded": 1, "retried": 1, "dead_lettered": 1}
        assert await client.result(small, timeout=5) == "x" * 10
        with pytest.raises(JobFailed, match="ResultTooLarge") as failed:
            await client.result(big, timeout=5)
    assert failed.value.state == "failed"
    assert "5,002 bytes as JSON, over the limit of 1,000" in (failed.value.reason or "")
    assert ResultTooLarge.__name__ in (failed.value.reason or "")
    effects = await fetch_rows(settings, "SELECT job_id FROM effects")
    assert [r["job_id"] for r in effects] == [small]  # the big one's effect never committed


async def test_expired_and_not_kept(reports: App, declare: Declare) -> None:
    app = reports
    await declare("report.plain", partitions=1)

    @app.job(REPORT, keep_result="1h")
    async def build(job: Report, ctx: JobContext) -> int:
        return job.n

    @app.job("report.plain")
    async def plain(job: dict[str, int], ctx: JobContext) -> int:
        async with ctx.once():
            pass
        return 1

    async with app.client() as client:
        stale = await client.enqueue(REPORT, Report(n=1), expires_in=0.001)  # gone by start
        plain_id = await client.enqueue("report.plain", {})
        await app.worker(REPORT).run(until_idle=True)
        await app.worker("report.plain").run(until_idle=True)
        with pytest.raises(JobExpired, match="expired before it ran"):
            await client.result(stale, timeout=5)
        with pytest.raises(ResultNotKept, match="keeps no results"):
            await client.result(plain_id, timeout=0.5)


async def test_a_def_handler_keeps_its_result_and_once_sync_is_refused(
        reports: App, settings: Settings) -> None:
    app = reports
    refused: list[str] = []

    @app.job(REPORT, keep_result="1h")
    def build(job: Report, ctx: JobContext) -> dict[str, int]:
        if job.n == 2:
            try:
                with ctx.once_sync(object()):
                    pass
            except ConfigError as exc:  # its session cannot hold the result
                refused.append(str(exc))
        return {"n": job.n}

    async with app.client() as client:
        ids = await client.enqueue_many([Job(REPORT, Report(n=n)) for n in range(3)])
        await app.worker(REPORT).run(until_idle=True)
        assert [await client.result(i, timeout=5) for i in ids] == [{"n": n} for n in range(3)]
    assert len(refused) == 1
    assert "cannot join" in refused[0]


async def test_a_job_without_a_row_is_answered_from_where_it_is(
        reports: App, declare: Declare, settings: Settings) -> None:
    """Issue 22: a job of a type without keep_result that finished without ctx.once()
    has neither a result row nor a dedup row; `result` used to wait its whole timeout
    and then say it had not finished, while `stream-jobs job` said it had."""
    app = reports
    await declare("report.plain", partitions=2, retry_tiers=["1s"], max_attempts=1)

    @app.job(REPORT, keep_result="1h")
    async def build(job: Report, ctx: JobContext) -> int:
        return job.n

    @app.job("report.plain")
    async def plain(job: dict[str, int], ctx: JobContext) -> int:
        if job["n"] < 0:
            raise ValueError("no negative reports")
        return job["n"]  # no ctx.once(): nothing in Postgres says it ran

    async with app.client() as client:
        finished = await client.enqueue("report.plain", {"n": 1})
        failed = await client.enqueue("report.plain", {"n": -1})
        await app.worker("report.plain").run(until_idle=True)
        waiting_plain = await client.enqueue("report.plain", {"n": 2})  # no worker runs it
        waiting_kept = await client.enqueue(REPORT, Report(n=3))

        started = time.monotonic()
        with pytest.raises(ResultNotKept) as not_kept:
            await client.result(finished, timeout=30)
        assert time.monotonic() - started < 10  # the first look comes after a second
        assert "without a dedup row" in str(not_kept.value)
        assert "keeps no results" in str(not_kept.value)

        with pytest.raises(JobFailed, match="no negative reports") as dead:
            await client.result(failed, timeout=30)
        assert dead.value.state == "failed"
        assert (dead.value.reason or "").startswith("max-attempts: ValueError")

        # Not finished, but its type's handler here keeps no results: none will come.
        with pytest.raises(ResultNotKept, match="will be kept") as never:
            await client.result(waiting_plain, timeout=30)
        assert "waits in its default lane" in str(never.value)

        # A kept type's job that nothing runs: the wait ends at its timeout, saying where.
        with pytest.raises(ResultTimeout, match="has not finished yet") as late:
            await client.result(waiting_kept, timeout=1.5)
        assert "waits in its default lane" in str(late.value)
        assert time.monotonic() - started < 30

    # A client without the handlers (a web app that only enqueues) cannot know what the
    # type keeps, but the lookup still tells a finished job from a waiting one.
    async with App(settings).client() as bare:
        with pytest.raises(ResultNotKept, match="or its result was pruned"):
            await bare.result(finished, timeout=30)
        with pytest.raises(ResultTimeout, match="has not finished yet"):
            await bare.result(waiting_plain, timeout=1.5)


async def test_a_job_that_commits_while_the_lookup_scans_is_done(
        reports: App, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lookup reads the job's dedup and result rows, then scans the topics and their
    committed offsets (seconds with many types). A job whose worker commits in between
    was judged finished without a dedup row, and `result` raised ResultNotKept for a job
    that kept its result (docs/results.md met it every time). The reads before the scan
    are made here to answer as they did before the commit."""
    app = reports

    @app.job(REPORT, keep_result="1h")
    async def build(job: Report, ctx: JobContext) -> int:
        async with ctx.once():
            pass
        return job.n

    async with app.client() as client:
        job_id = await client.enqueue(REPORT, Report(n=7))
        await app.worker(REPORT).run(until_idle=True)
        types = load_job_types(settings.topics_dir)

        reads: list[str] = []
        dedup_row, result_row = lookup._dedup_row, lookup._result_row

        async def dedup_before_the_commit(*args: Any) -> Any:
            reads.append("dedup")
            return None if reads.count("dedup") == 1 else await dedup_row(*args)

        async def result_before_the_commit(*args: Any) -> Any:
            reads.append("result")
            return None if reads.count("result") == 1 else await result_row(*args)

        monkeypatch.setattr(lookup, "_dedup_row", dedup_before_the_commit)
        monkeypatch.setattr(lookup, "_result_row", result_before_the_commit)
        found = await lookup.locate_job(settings, types, job_id)
    assert found.status == "done", found.summary()
    assert found.result is not None
    assert found.result.value() == 7
