"""JobTester covers kept results, chains and batches in memory (docs/results.md,
docs/workflows.md): the worker's real finish transaction on the in-memory store."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stream_jobs import App, JobContext
from stream_jobs.client import Job
from stream_jobs.errors import (
    ConfigError,
    JobCancelled,
    JobExpired,
    JobFailed,
    ResultNotKept,
    ResultTimeout,
    UnknownWorkflow,
)
from stream_jobs.testing.plugin import StartTester
from stream_jobs.workflows.members import step_job_id

TYPES: dict[str, Any] = {
    "price.quote": {"partitions": 2, "retry_tiers": ["5s"], "max_attempts": 3},
    "price.log": {"partitions": 1, "retry_tiers": ["5s"]},
    "report.done": {"partitions": 1, "retry_tiers": ["5s"]},
    "price.fan": {"partitions": 1, "retry_tiers": ["5s"]},
}


def quote_app(ran: list[Any]) -> App:
    app = App()

    @app.job("price.quote", keep_result="1h")
    async def quote(item: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        ran.append(("quote", item.get("n"), ctx.parent_result))
        if item.get("fail_until", 0) >= ctx.attempt:
            raise RuntimeError(f"attempt {ctx.attempt} failed")
        async with ctx.once() as conn:
            await conn.execute("INSERT INTO quotes VALUES ($1)", item.get("n"))
        base = (ctx.parent_result or {}).get("total", 0)
        return {"total": base + item.get("n", 0)}

    @app.job("price.log")
    async def log(item: dict[str, Any], ctx: JobContext) -> None:
        async with ctx.once():  # its dedup row says it finished: no result, as it keeps none
            ran.append(("log", item.get("n"), None))

    @app.job("report.done")
    async def done(report: dict[str, Any], ctx: JobContext) -> None:
        ran.append(("report", report["name"], report["batch"]))

    return app


async def test_a_kept_result_is_read_and_each_ending_has_its_error(
        job_tester: StartTester) -> None:
    ran: list[Any] = []
    t = job_tester(quote_app(ran), types=TYPES)
    ok = await t.enqueue("price.quote", {"n": 5})
    dead = await t.enqueue("price.quote", {"n": 1, "fail_until": 9})
    late = await t.enqueue("price.quote", {"n": 2}, expires_in=1)
    gone = await t.enqueue("price.quote", {"n": 3})
    unkept = await t.enqueue("price.log", {"n": 4})
    with pytest.raises(ResultTimeout, match="has not finished yet"):
        await t.result(ok)  # nothing runs between calls: it answers at once
    await t.cancel(gone)
    t.move_clock(2)  # `late` expires before any worker meets it
    await t.run_until_idle()
    assert await t.result(ok) == {"total": 5}
    with pytest.raises(JobFailed, match="dead-lettered after attempt 3"):
        await t.result(dead)
    with pytest.raises(JobExpired, match="expired before it ran"):
        await t.result(late)
    with pytest.raises(JobCancelled, match="was cancelled"):
        await t.result(gone)
    with pytest.raises(ResultNotKept, match="keeps no results"):
        await t.result(unkept)
    status = await t.status(ok)
    assert status.status == "done"
    assert status.result is not None
    assert '{"total":5}' in status.summary()
    t.move_clock(3601)  # past keep_result: the row is as good as pruned
    with pytest.raises(ResultNotKept, match="was pruned"):
        await t.result(ok)


async def test_a_job_without_a_row_is_answered_from_where_it_is(
        job_tester: StartTester) -> None:
    """As the real client (tests/integration/test_results.py): a job of a type without
    keep_result that finished without ctx.once() has no row at all, and the lookup says
    it finished; one that waits will never have a result."""
    t = job_tester(quote_app([]), types=TYPES)
    finished = await t.enqueue("report.done", {"name": "x", "batch": None})
    await t.run_until_idle()
    waiting = await t.enqueue("report.done", {"name": "y", "batch": None})
    with pytest.raises(ResultNotKept, match="without a dedup row") as not_kept:
        await t.result(finished)
    assert "keeps no results" in str(not_kept.value)
    with pytest.raises(ResultNotKept, match="will be kept"):
        await t.result(waiting)


async def test_a_result_is_waited_for_while_the_tester_runs(job_tester: StartTester) -> None:
    app = quote_app([])
    t = job_tester(app, types=TYPES)
    job_id = await t.enqueue("price.quote", {"n": 7})
    async with app.client() as client:
        waiting = asyncio.create_task(client.result(job_id, timeout=30))
        await t.run_until_idle()
        assert await asyncio.wait_for(waiting, 30) == {"total": 7}


async def test_a_chain_runs_in_order_with_its_parents_result(job_tester: StartTester) -> None:
    ran: list[Any] = []
    t = job_tester(quote_app(ran), types=TYPES)
    chain = await t.chain(Job("price.quote", {"n": 1}), Job("price.quote", {"n": 10}),
                          Job("price.quote", {"n": 100}))
    await t.run_until_idle()
    assert ran == [("quote", 1, None), ("quote", 10, {"total": 1}),
                   ("quote", 100, {"total": 11})]
    assert await t.result(step_job_id(chain, 2)) == {"total": 111}
    async with t.app.client() as client:
        progress = await client.progress(chain)
    assert (progress.state, progress.succeeded, progress.total) == ("succeeded", 3, 3)


async def test_a_chain_stops_at_a_dead_letter(job_tester: StartTester) -> None:
    ran: list[Any] = []
    t = job_tester(quote_app(ran), types=TYPES)
    chain = await t.chain(Job("price.quote", {"n": 1}),
                          Job("price.quote", {"n": 2, "fail_until": 9}),
                          Job("price.quote", {"n": 3}))
    await t.run_until_idle()
    assert [n for _, n, _ in ran] == [1, 2, 2, 2]  # step 1's three attempts; no step 2
    assert t.outcomes_of("price.quote") == {"succeeded": 1, "retried": 2, "dead_lettered": 1}
    progress = await t.app.client().progress(chain)
    assert (progress.state, progress.failed_step) == ("failed", 1)
    assert progress.failure is not None
    assert "RuntimeError" in progress.failure


async def test_a_batchs_callbacks_run_once_with_the_counts_whatever_the_retries(
        job_tester: StartTester) -> None:
    ran: list[Any] = []
    t = job_tester(quote_app(ran), types=TYPES)
    members = [Job("price.quote", {"n": n, "fail_until": n % 3}) for n in range(5)]
    batch = await t.batch(members, on_success=Job("report.done", {"name": "success"}),
                          on_complete=Job("report.done", {"name": "complete"}))
    await t.run_until_idle()
    reports = [(name, summary) for kind, name, summary in ran if kind == "report"]
    summary = {"id": batch, "total": 5, "succeeded": 5, "failed": 0}
    assert sorted(reports) == [("complete", summary), ("success", summary)]
    assert t.outcomes_of("price.quote") == {"succeeded": 5, "retried": 0 + 1 + 2 + 0 + 1}

    failing = await t.batch([Job("price.quote", {"n": 1}),
                             Job("price.quote", {"n": 2, "fail_until": 9})],
                            on_success=Job("report.done", {"name": "success"}),
                            on_complete=Job("report.done", {"name": "complete"}))
    await t.run_until_idle()
    reports = [(name, summary) for kind, name, summary in ran if kind == "report"][2:]
    assert reports == [("complete", {"id": failing, "total": 2, "succeeded": 1, "failed": 1})]
    progress = await t.app.client().progress(failing)
    assert (progress.state, progress.pending) == ("completed", 0)


async def test_a_handler_starts_a_batch_with_its_own_commit(job_tester: StartTester) -> None:
    ran: list[Any] = []
    app = quote_app(ran)

    @app.job("price.fan")
    async def fan_out(item: dict[str, Any], ctx: JobContext) -> None:
        async with ctx.once():
            await ctx.batch([Job("price.quote", {"n": n}) for n in (1, 2)],
                            on_complete=Job("report.done", {"name": "fanned"}))
            if ctx.attempt == 1:
                raise RuntimeError("the block rolls back, batch and all")

    t = job_tester(app, types=TYPES)
    await t.enqueue("price.fan", {"n": 0})
    await t.run_until_idle()
    assert sorted(n for kind, n, _ in ran if kind == "quote") == [1, 2]
    assert [name for kind, name, _ in ran if kind == "report"] == ["fanned"]


async def test_a_batch_in_a_testers_transaction_exists_only_if_it_commits(
        job_tester: StartTester) -> None:
    ran: list[Any] = []
    t = job_tester(quote_app(ran), types=TYPES)
    async with t.transaction() as conn:
        batch = await t.batch([Job("price.quote", {"n": 1})], batch_id="b-1", conn=conn)

    async def rolled_back() -> None:
        async with t.transaction() as conn:
            await t.batch([Job("price.quote", {"n": 2})], batch_id="b-2", conn=conn)
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError, match="rolled back"):
        await rolled_back()
    with pytest.raises(ConfigError, match="exists already"):
        await t.batch([Job("price.quote", {"n": 3})], batch_id=batch)
    await t.run_until_idle()
    assert [n for _, n, _ in ran] == [1]
    with pytest.raises(UnknownWorkflow):
        await t.app.client().progress("b-2")
