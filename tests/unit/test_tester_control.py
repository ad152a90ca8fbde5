"""JobTester covers cancels, unique jobs and debounce in memory (docs/control.md): the
real worker and relay, with the in-memory cancel feed, key store and client stores."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from stream_jobs import App, JobContext
from stream_jobs.cancels.rules import CancelAnswer
from stream_jobs.errors import ConfigError
from stream_jobs.testing import JobTester
from stream_jobs.testing.plugin import StartTester
from tests.waiting import until

TYPES: dict[str, Any] = {"mail.send": {"partitions": 2, "retry_tiers": ["5s", "1m"]}}


def mail_app(ran: list[Any]) -> App:
    app = App()

    @app.job("mail.send")
    async def send(mail: dict[str, Any], ctx: JobContext) -> None:
        async with ctx.once() as conn:
            await conn.execute("INSERT INTO sent VALUES ($1)", mail["n"])
        ran.append(mail["n"])

    return app


async def test_a_queued_or_delayed_job_that_is_cancelled_never_runs(
        job_tester: StartTester) -> None:
    ran: list[Any] = []
    t = job_tester(mail_app(ran), types=TYPES)
    queued = await t.enqueue("mail.send", {"n": 1})
    delayed = await t.enqueue("mail.send", {"n": 2}, delay=30)
    kept = await t.enqueue("mail.send", {"n": 3})
    answer = await t.cancel(queued, reason="changed my mind")
    assert answer.answer is CancelAnswer.CANCELLED
    await t.run_until_idle(jump=False)  # the delayed job is held in its tier now
    assert t.outcomes == {"succeeded": 1, "cancelled": 1}
    assert (await t.status(delayed)).status == "scheduled"  # its delay, not a failure
    assert (await t.cancel(delayed)).answer is CancelAnswer.CANCELLED
    await t.run_until_idle()
    assert ran == [3]
    assert t.outcomes == {"succeeded": 1, "cancelled": 2}
    assert t.effects_of(queued) == t.effects_of(delayed) == []
    assert [t.done[j].attempt for j in (queued, delayed, kept)] == [0, 0, 1]
    status = await t.status(queued)
    assert status.status == "cancelled"
    assert "changed my mind" in status.summary()


async def test_a_cancel_is_answered_as_on_postgres(job_tester: StartTester) -> None:
    ran: list[Any] = []
    app = mail_app(ran)
    t = job_tester(app, types=TYPES)
    done = await t.enqueue("mail.send", {"n": 1})
    await t.run_until_idle()
    async with app.client() as client:  # the app's own client reaches the tester too
        finished = await client.cancel(done)
        cancelled = await client.cancel("never-enqueued", reason="just in case")
        again = await client.cancel("never-enqueued")
    assert finished.answer is CancelAnswer.ALREADY_FINISHED
    assert "Attempt 1 committed its effects" in finished.summary()
    assert cancelled.answer is CancelAnswer.CANCELLED
    assert again.answer is CancelAnswer.ALREADY_CANCELLED
    assert "just in case" in again.summary()
    with pytest.raises(ConfigError, match="at most 500"):
        await t.cancel(done, reason="x" * 501)


async def test_a_running_async_handler_is_interrupted(job_tester: StartTester) -> None:
    app = App()
    started = asyncio.Event()
    stopped: list[str] = []

    @app.job("mail.send")
    async def send(mail: dict[str, Any], ctx: JobContext) -> None:
        try:
            async with ctx.once() as conn:
                await conn.execute("INSERT INTO sent VALUES ($1)", mail["n"])
                started.set()
                await asyncio.Event().wait()  # a call that never answers
        except asyncio.CancelledError:
            stopped.append(ctx.job_id)
            raise

    t = job_tester(app, types=TYPES)
    job_id = await t.enqueue("mail.send", {"n": 1})
    run = asyncio.create_task(t.run_until_idle())
    await asyncio.wait_for(started.wait(), 30)
    assert (await t.cancel(job_id)).answer is CancelAnswer.CANCELLED
    await asyncio.wait_for(run, 30)
    assert stopped == [job_id]
    assert t.outcomes == {"cancelled": 1}
    assert t.effects_of(job_id) == []  # its block never committed


async def test_a_sync_handler_sees_ctx_cancelled(job_tester: StartTester) -> None:
    app = App()
    steps: dict[str, int] = {}

    @app.job("mail.send", timeout=60)
    def send(mail: dict[str, Any], ctx: JobContext) -> None:
        step = threading.Event()
        while not ctx.cancelled:  # the handler's steps, each a few ms
            steps[ctx.job_id] = steps.get(ctx.job_id, 0) + 1
            step.wait(0.005)

    t = job_tester(app, types=TYPES)
    job_id = await t.enqueue("mail.send", {"n": 1})
    run = asyncio.create_task(t.run_until_idle())
    await until(lambda: job_id in steps, "the handler to be stepping")
    with app.sync_client() as client:  # from another thread, as a sync web view would
        assert client.cancel(job_id).answer is CancelAnswer.CANCELLED
    await asyncio.wait_for(run, 30)
    assert t.outcomes == {"cancelled": 1}


@pytest.mark.parametrize("obeys", [True, False])
async def test_a_cancel_waits_for_a_sync_handlers_once_sync_block(
        job_tester: StartTester, tmp_path: Path, obeys: bool) -> None:
    """As on Postgres: the cancel waits for the block's claim and asks the run to stop.
    A handler that raises when told rolls its block back, and the cancel wins; one that
    commits anyway finishes, and the cancel answers that it had."""
    engine = create_engine(f"sqlite:///{tmp_path / 'sent.db'}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE sent (job_id text PRIMARY KEY)"))
    app = App()
    inside = threading.Event()

    @app.job("mail.send", timeout=60)
    def send(mail: dict[str, Any], ctx: JobContext) -> None:
        step = threading.Event()
        with Session(engine) as session, ctx.once_sync(session):
            session.execute(text("INSERT INTO sent VALUES (:id)"), {"id": ctx.job_id})
            inside.set()
            while not ctx.cancelled:  # the handler's steps, each a few ms
                step.wait(0.005)
            if obeys:
                raise RuntimeError("stopped: cancelled")  # rolls the block back

    t = job_tester(app, types=TYPES)
    job_id = await t.enqueue("mail.send", {"n": 1})
    run = asyncio.create_task(t.run_until_idle())
    await until(inside.is_set, "the handler to be inside its block")
    answer = await t.cancel(job_id)
    await asyncio.wait_for(run, 30)
    with engine.connect() as conn:
        sent = conn.execute(text("SELECT job_id FROM sent")).scalars().all()
    if obeys:
        assert answer.answer is CancelAnswer.CANCELLED
        assert t.outcomes == {"cancelled": 1}
        assert sent == []
    else:
        assert answer.answer is CancelAnswer.ALREADY_FINISHED
        assert t.outcomes == {"succeeded": 1}
        assert sent == [job_id]


async def test_a_unique_job_holds_its_key_while_pending_and_within_its_window(
        job_tester: StartTester) -> None:
    ran: list[Any] = []
    t = job_tester(mail_app(ran), types=TYPES)
    first = await t.enqueue("mail.send", {"n": 1}, unique_key="welcome:7", unique_for="10m")
    pending = await t.enqueue("mail.send", {"n": 2}, unique_key="welcome:7", unique_for="10m")
    assert (pending, pending.sent, first.sent) == (first, False, True)
    await t.run_until_idle()
    within = await t.enqueue("mail.send", {"n": 3}, unique_key="welcome:7", unique_for="10m")
    assert (within, within.sent) == (first, False)
    t.move_clock(601)
    after = await t.enqueue("mail.send", {"n": 4}, unique_key="welcome:7", unique_for="10m")
    assert after.sent
    assert after != first
    # Without a window the key is free as soon as its job finished.
    await t.run_until_idle()
    bare = await t.enqueue("mail.send", {"n": 5}, unique_key="other")
    await t.run_until_idle()
    next_one = await t.enqueue("mail.send", {"n": 6}, unique_key="other")
    assert next_one.sent
    assert next_one != bare
    await t.run_until_idle()
    assert ran == [1, 4, 5, 6]


async def test_a_unique_enqueue_in_a_testers_transaction_takes_its_key_only_if_it_commits(
        job_tester: StartTester) -> None:
    ran: list[Any] = []
    app = mail_app(ran)
    t = job_tester(app, types=TYPES)

    async def rolled_back() -> None:
        async with t.transaction() as conn:
            await t.enqueue("mail.send", {"n": 1}, unique_key="k", conn=conn)
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError, match="rolled back"):
        await rolled_back()
    with t.transaction() as conn, app.sync_client() as client:  # a sync view's transaction
        first = client.enqueue("mail.send", {"n": 2}, unique_key="k", conn=conn)
        again = client.enqueue("mail.send", {"n": 3}, unique_key="k", conn=conn)
    assert first.sent
    assert (again, again.sent) == (first, False)
    await t.run_until_idle()
    assert ran == [2]


async def test_a_cancelled_unique_job_gives_its_key_back(job_tester: StartTester) -> None:
    t = job_tester(mail_app([]), types=TYPES)
    first = await t.enqueue("mail.send", {"n": 1}, unique_key="k")
    await t.cancel(first)
    second = await t.enqueue("mail.send", {"n": 2}, unique_key="k")
    assert second.sent
    assert second != first


async def test_a_debounced_burst_runs_only_its_last_job(job_tester: StartTester) -> None:
    ran: list[Any] = []
    t = job_tester(mail_app(ran), types=TYPES)
    burst = [await t.enqueue("mail.send", {"n": n}, key="user:9", debounce="30s")
             for n in range(4)]
    assert [b.superseded for b in burst] == [None, *burst[:3]]
    assert len({b.not_before_ms for b in burst}) == 1  # one window, opened by the first
    await t.advance(29)
    assert ran == []  # nothing runs before the window ends
    await t.run_until_idle()
    assert ran == [3]
    assert t.outcomes == {"succeeded": 1, "superseded": 3}
    assert (await t.status(burst[0])).status == "superseded"
    # A job after the window opens a new one.
    later = await t.enqueue("mail.send", {"n": 9}, key="user:9", debounce="30s")
    assert later.superseded is None
    await t.run_until_idle()
    assert ran == [3, 9]


async def test_the_tester_restores_the_apps_stores() -> None:
    app = mail_app([])
    before = app.storage
    async with JobTester(app, types=TYPES):
        assert app.storage is not before
    assert app.storage is before
