"""Cancel on the real stack: a job queued behind a backlog, a delayed job, a job waiting in
a delay tier, a running job (interrupted within a second, its ctx.once() rolled back),
and the answers for a job cancelled twice or already finished.

Nothing waits by sleeping: every wait polls a condition against a deadline, or drains
the worker with `run(until_idle=True)`.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

import asyncpg
import psycopg
import pytest

from stream_jobs.app import App
from stream_jobs.cancels.rules import CancelAnswer
from stream_jobs.client import Job
from stream_jobs.context import JobContext
from stream_jobs.errors import JobNotFound
from stream_jobs.lookup import locate_job
from stream_jobs.tools.cancel import cancel_job
from tests.integration.database import fetch_value
from tests.waiting import until

from .conftest import Declare

EFFECTS = "CREATE TABLE IF NOT EXISTS effects (job_id text PRIMARY KEY)"


async def test_a_cancelled_job_never_starts_whether_cancelled_before_or_while_the_worker_runs(
        app: App, declare: Declare) -> None:
    await declare("cancel.backlog", partitions=1, retry_tiers=["1s"])
    gate = asyncio.Event()
    started: list[int] = []

    @app.job("cancel.backlog", concurrency=1, ordering="partition")
    async def work(job: dict[str, int], ctx: JobContext) -> None:
        started.append(job["i"])  # before once(): a start the cancel check missed shows here
        if job["i"] == 0:
            await gate.wait()
        async with ctx.once():
            pass

    async with app.client() as client:
        ids = await client.enqueue_many(Job("cancel.backlog", {"i": i}) for i in range(40))
        # Before the worker starts: found in the table when the worker loads it.
        early = await client.cancel(ids[30], job_type="cancel.backlog", reason="early")
        worker = app.worker("cancel.backlog")
        running = asyncio.create_task(worker.run(until_idle=True))
        try:
            await until(lambda: started == [0], "the first job to start (and hold the rest)")
            assert ids[30] in worker.admission.cancelled
            # While it runs, behind the backlog: reaches the worker by its notice.
            late = await client.cancel(ids[20], job_type="cancel.backlog")
            await until(lambda: ids[20] in worker.admission.cancelled, "the cancel's notice")
        finally:
            gate.set()
        await asyncio.wait_for(running, 60)
        again = await client.cancel(ids[20])
        finished = await client.cancel(ids[5])
    assert early.answer is late.answer is CancelAnswer.CANCELLED
    assert again.answer is CancelAnswer.ALREADY_CANCELLED
    assert finished.answer is CancelAnswer.ALREADY_FINISHED, finished
    assert sorted(started) == [i for i in range(40) if i not in (20, 30)]
    assert dict(worker.outcomes) == {"succeeded": 38, "cancelled": 2}
    found = await locate_job(app.settings, app.job_types(), ids[30])
    assert found.status == "cancelled"
    assert "early" in found.summary()


async def test_a_job_delayed_an_hour_is_finished_as_soon_as_it_is_cancelled(
        app: App, declare: Declare) -> None:
    await declare("cancel.delayed", partitions=1, retry_tiers=["2s", "1h"])
    started: list[str] = []

    @app.job("cancel.delayed")
    async def work(job: dict[str, Any], ctx: JobContext) -> None:
        started.append(ctx.job_id)

    async with app.client() as client:
        job_id = await client.enqueue("cancel.delayed", {}, delay=3600)
        worker = app.worker("cancel.delayed")
        assert worker.relay is not None
        relay = worker.relay
        running = asyncio.create_task(worker.run(until_idle=True))
        await until(lambda: job_id in relay.held_jobs.values(), "the relay to hold the job")
        asked = time.monotonic()
        answer = await client.cancel(job_id, job_type="cancel.delayed")
        await asyncio.wait_for(running, 30)
    took_s = time.monotonic() - asked
    assert answer.answer is CancelAnswer.CANCELLED
    assert started == []
    assert dict(worker.outcomes) == {"cancelled": 1}
    assert took_s < 5, f"the held job took {took_s:.1f} s to be finished"


async def test_a_job_waiting_in_a_delay_tier_is_cancelled_there(app: App,
                                                                 declare: Declare) -> None:
    await declare("cancel.tier", partitions=1, retry_tiers=["1h"], max_attempts=3)
    attempts: list[int] = []

    @app.job("cancel.tier")
    async def work(job: dict[str, Any], ctx: JobContext) -> None:
        attempts.append(ctx.attempt)
        raise RuntimeError("fails the first time, and would retry in an hour")

    async with app.client() as client:
        job_id = await client.enqueue("cancel.tier", {})
        worker = app.worker("cancel.tier")
        assert worker.relay is not None
        relay = worker.relay
        running = asyncio.create_task(worker.run(until_idle=True))
        await until(lambda: job_id in relay.held_jobs.values(), "the retry to wait in tier 1h")
        answer = await client.cancel(job_id, job_type="cancel.tier")
        await asyncio.wait_for(running, 30)
    assert answer.answer is CancelAnswer.CANCELLED
    assert attempts == [1]
    assert dict(worker.outcomes) == {"retried": 1, "cancelled": 1}


async def test_a_running_job_is_interrupted_within_a_second_and_its_once_rolls_back(
        app: App, declare: Declare) -> None:
    """Two runs: one waiting inside ctx.once() (its open claim makes the cancel ask for an
    interrupt first), one waiting outside it (the committed cancel's notice stops it)."""
    await declare("cancel.running", partitions=2, retry_tiers=["1s"])
    await fetch_value(app.settings, EFFECTS)
    inside: dict[str, asyncio.Event] = {}
    seen: dict[str, bool] = {}

    @app.job("cancel.running", timeout=120)
    async def work(job: dict[str, Any], ctx: JobContext) -> None:
        forever = asyncio.Event()
        try:
            if job["in_once"]:
                async with ctx.once() as conn:
                    await conn.execute("INSERT INTO effects VALUES ($1)", ctx.job_id)
                    inside[ctx.job_id] = forever
                    await forever.wait()
            else:
                inside[ctx.job_id] = forever
                await forever.wait()
        except asyncio.CancelledError:
            seen[ctx.job_id] = ctx.cancelled
            raise

    async with app.client() as client:
        in_once = await client.enqueue("cancel.running", {"in_once": True})
        outside = await client.enqueue("cancel.running", {"in_once": False})
        worker = app.worker("cancel.running")
        running = asyncio.create_task(worker.run(until_idle=True))
        await until(lambda: len(inside) == 2, "both jobs to be running")
        took: dict[str, float] = {}
        for job_id in (in_once, outside):
            asked = time.monotonic()
            answer = await client.cancel(job_id, job_type="cancel.running")
            assert answer.answer is CancelAnswer.CANCELLED
            await until(lambda job_id=job_id: job_id in seen, "the CancelledError", 5)
            took[job_id] = time.monotonic() - asked
        await asyncio.wait_for(running, 30)
    print(f"\n[cancel] interrupted in {took[in_once]:.3f} s (inside once), "
          f"{took[outside]:.3f} s (outside)")
    assert seen == {in_once: True, outside: True}
    assert max(took.values()) < 1.0, took
    assert dict(worker.outcomes) == {"cancelled": 2}
    assert await fetch_value(app.settings, "SELECT count(*) FROM effects") == 0  # rolled back


async def test_a_cancel_of_an_unknown_or_finished_job_changes_nothing(
        app: App, declare: Declare) -> None:
    """The client trusts its caller with the ID; the operator's cancel (CLI, gateway)
    looks the job up, so it also knows a job that finished without ctx.once()."""
    await declare("cancel.done", partitions=1, retry_tiers=["1s"])

    @app.job("cancel.done")
    async def work(job: dict[str, Any], ctx: JobContext) -> None:
        if job["once"]:
            async with ctx.once():
                pass

    async with app.client() as client:
        with_once = await client.enqueue("cancel.done", {"once": True})
        without = await client.enqueue("cancel.done", {"once": False})
        await asyncio.wait_for(app.worker("cancel.done").run(until_idle=True), 60)
        answer = await client.cancel(with_once)
    assert answer.answer is CancelAnswer.ALREADY_FINISHED
    assert "Attempt 1 committed its effects" in answer.summary()
    types = app.job_types()
    looked = await cancel_job(app.settings, types, without, job_type="cancel.done")
    assert looked.answer is CancelAnswer.ALREADY_FINISHED, looked
    assert "without ctx.once()" in looked.summary()
    with pytest.raises(JobNotFound, match="No job 01a2-nope was found"):
        await cancel_job(app.settings, types, "01a2-nope", job_type="cancel.done")
    assert await fetch_value(app.settings, "SELECT count(*) FROM stream_jobs_cancels") == 0


async def test_cancels_racing_a_thousand_runs_leave_each_job_done_or_cancelled(
        app: App, declare: Declare) -> None:
    """1,000 jobs whose effects go through ctx.once(), half of them doing some work inside
    the block, and a cancel for every one sent while they run: each job is exactly one of
    done (its effect row, and its cancel said "already finished") or cancelled (no row,
    and its cancel said "cancelled"), and the worker counted the same."""
    n = 1_000
    await declare("cancel.race", partitions=4, retry_tiers=["1s"])
    await fetch_value(app.settings, EFFECTS)
    started = asyncio.Event()

    @app.job("cancel.race", concurrency=64, timeout=60)
    async def work(job: dict[str, int], ctx: JobContext) -> None:
        started.set()
        async with ctx.once() as conn:
            await conn.execute("INSERT INTO effects VALUES ($1)", ctx.job_id)
            if job["i"] % 2:
                await asyncio.sleep(0.002)  # work inside the block: some cancels meet it here

    async with app.client() as client:
        ids: list[str] = []
        for start in range(0, n, 500):
            ids += await client.enqueue_many(Job("cancel.race", {"i": i})
                                             for i in range(start, start + 500))
        worker = app.worker("cancel.race")
        running = asyncio.create_task(worker.run(until_idle=True))
        await asyncio.wait_for(started.wait(), 60)
        order = list(ids)
        random.Random(7).shuffle(order)
        answers: dict[str, CancelAnswer] = {}

        async def canceller(share: list[str]) -> None:
            for job_id in share:
                answers[job_id] = (await client.cancel(job_id, job_type="cancel.race")).answer

        await asyncio.gather(*(canceller(order[k::4]) for k in range(4)))
        await asyncio.wait_for(running, 120)
    conn = await asyncpg.connect(app.settings.database_url,
                                 server_settings={"search_path": app.settings.database_schema})
    try:
        effects = {r["job_id"] for r in await conn.fetch("SELECT job_id FROM effects")}
        cancels = {r["job_id"] for r in await conn.fetch("SELECT job_id FROM stream_jobs_cancels")}
    finally:
        await conn.close()
    cancelled = {j for j, a in answers.items() if a is CancelAnswer.CANCELLED}
    finished = {j for j, a in answers.items() if a is CancelAnswer.ALREADY_FINISHED}
    print(f"\n[cancel race] {len(cancelled)} cancelled ({worker.admission.interrupted} of them "
          f"while running), {len(finished)} finished first; worker: {dict(worker.outcomes)}")
    assert len(answers) == n
    assert cancelled | finished == set(ids)
    assert effects == finished  # every finished job's effect once, no cancelled job's
    assert cancels == cancelled
    assert cancelled, "no cancel came before its job finished: they did not race"
    assert finished, "no job finished before its cancel: they did not race"
    assert dict(worker.outcomes) == {"succeeded": len(finished), "cancelled": len(cancelled)}


async def test_a_sync_handler_sees_ctx_cancelled_and_its_once_sync_rolls_back(
        app: App, declare: Declare) -> None:
    """A thread cannot be interrupted: a `def` handler looks at ctx.cancelled between steps.
    One inside ctx.once_sync() raises there (its transaction rolls back, so the cancel that
    waited for its claim wins); one outside returns."""
    await declare("cancel.sync", partitions=2, retry_tiers=["1s"])
    settings = app.settings
    await fetch_value(settings, EFFECTS)
    steps: dict[str, int] = {}

    @app.job("cancel.sync", timeout=120, concurrency=2)
    def work(job: dict[str, Any], ctx: JobContext) -> None:
        step = threading.Event()
        if job["in_once"]:
            with psycopg.connect(settings.database_url) as conn, ctx.once_sync(conn):
                conn.execute(f'INSERT INTO "{settings.database_schema}".effects VALUES (%s)',
                             (ctx.job_id,))
                while not ctx.cancelled:  # the handler's steps, each a few ms
                    steps[ctx.job_id] = steps.get(ctx.job_id, 0) + 1
                    step.wait(0.005)
                raise RuntimeError("stopped: cancelled")  # rolls the block back
        while not ctx.cancelled:
            steps[ctx.job_id] = steps.get(ctx.job_id, 0) + 1
            step.wait(0.005)

    async with app.client() as client:
        in_once = await client.enqueue("cancel.sync", {"in_once": True})
        outside = await client.enqueue("cancel.sync", {"in_once": False})
        worker = app.worker("cancel.sync")
        running = asyncio.create_task(worker.run(until_idle=True))
        await until(lambda: len(steps) == 2, "both handlers to be stepping")
        answers = [await client.cancel(job_id, job_type="cancel.sync")
                   for job_id in (in_once, outside)]
        await asyncio.wait_for(running, 30)
    assert [a.answer for a in answers] == [CancelAnswer.CANCELLED] * 2
    assert dict(worker.outcomes) == {"cancelled": 2}
    assert await fetch_value(settings, "SELECT count(*) FROM effects") == 0
