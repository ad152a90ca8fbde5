"""Sync handlers against the real stack: a plain `def` runs on the worker's thread pool
with the async outcome paths (success, expiry, retry, dead letter, timeout), keeps key
order, holds its slot and key while a thread outlives its timeout, and writes effects
once per job ID through `ctx.once_sync()` on a SQLAlchemy Session or a psycopg
connection. Also the warning for an `async def` that blocks the loop.

Nothing waits by sleeping: every wait polls a condition against a deadline. The
handlers' own sleeps are the work being measured, on their threads.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from prometheus_client import generate_latest
from pydantic import BaseModel
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

from stream_jobs.app import App
from stream_jobs.client import Job, JobClient
from stream_jobs.context import JobContext
from stream_jobs.errors import PermanentError
from stream_jobs.logs import fields
from stream_jobs.naming import dlq_topic
from stream_jobs.record import decode_record
from stream_jobs.runtime.host import WorkerHost
from stream_jobs.runtime.metrics import worker_registry
from stream_jobs.settings import Settings
from tests.waiting import until

from .conftest import Declare
from .topic_reader import read_topic


class Render(BaseModel):
    page: int
    kind: str = "ok"


@pytest.fixture
def engine(settings: Settings, schema: str) -> Iterator[Engine]:
    """A SQLAlchemy engine on the test's database (psycopg, the sync driver), with an
    effects table in the test's schema."""
    url = settings.database_url.replace("postgresql://", "postgresql+psycopg://", 1)
    made = create_engine(url, pool_size=8)
    with made.begin() as conn:
        conn.execute(text(f'CREATE TABLE "{schema}".effects (job_id text, page int)'))
    yield made
    made.dispose()


def effect_counts(engine: Engine, schema: str) -> Counter[str]:
    with engine.connect() as conn:
        rows = conn.execute(text(f'SELECT job_id FROM "{schema}".effects')).all()
    return Counter(row.job_id for row in rows)


async def test_a_def_handler_runs_on_the_pool_with_its_model(app: App, declare: Declare) -> None:
    await declare("sync.render", partitions=3)
    lock = threading.Lock()
    running = 0
    most = 0
    ran: list[tuple[int, str]] = []

    @app.job("sync.render", concurrency=4, ordering="unordered")
    def render(job: Render, ctx: JobContext) -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.02)  # blocking work: this is what the thread is for
        with lock:
            running -= 1
            ran.append((job.page, threading.current_thread().name))

    async with app.client() as client:
        await client.enqueue_many([Job("sync.render", Render(page=i)) for i in range(40)])
        await client.enqueue("sync.render", {"page": -1}, expires_in=0.001)
    worker = app.worker("sync.render")
    await worker.run(until_idle=True)

    assert sorted(page for page, _ in ran) == list(range(40))
    assert {name.rpartition("-")[0] for _, name in ran} == {"sj-sync.render"}
    assert 1 < most <= 4, most
    assert worker.outcomes["succeeded"] == 40
    assert worker.outcomes["expired"] == 1
    assert worker.threads is not None
    assert worker.threads.busy == 0


async def test_a_def_handler_retries_and_dead_letters_as_an_async_one_does(
        app: App, declare: Declare, settings: Settings) -> None:
    await declare("sync.flaky", partitions=1, retry_tiers=["1s"], max_attempts=2)
    attempts: Counter[str] = Counter()

    @app.job("sync.flaky", ordering="partition")
    def flaky(job: Render, ctx: JobContext) -> None:
        attempts[job.kind] += 1
        if job.kind == "once" and ctx.attempt == 1:
            raise RuntimeError("printer jammed")
        if job.kind == "always":
            raise ValueError("no such page")
        if job.kind == "permanent":
            raise PermanentError("this page can never print")

    async with app.client() as client:
        ids = {kind: await client.enqueue("sync.flaky", Render(page=1, kind=kind))
               for kind in ("once", "always", "permanent", "ok")}
    # A payload the model refuses, from a client that does not know the model (as a
    # foreign producer would send it): dead-lettered without a run.
    async with JobClient(app.settings, app.job_types()) as bare:
        ids["invalid"] = await bare.enqueue("sync.flaky", {"page": "not a number"})
    worker = app.worker("sync.flaky")
    await worker.run(until_idle=True)

    assert attempts == {"once": 2, "always": 2, "permanent": 1, "ok": 1}
    assert worker.outcomes["succeeded"] == 2
    assert worker.outcomes["retried"] == 2
    assert worker.outcomes["dead_lettered"] == 3
    letters = {}
    for letter in await read_topic(settings, dlq_topic(settings.topic_prefix, "sync.flaky")):
        job = decode_record(key=letter.key, value=letter.value, headers=letter.headers,
                            expected_type="sync.flaky", max_payload_bytes=10**6)
        assert job.failure is not None
        letters[job.job_id] = job.failure
    assert set(letters) == {ids["always"], ids["permanent"], ids["invalid"]}
    assert letters[ids["always"]].reason == "max-attempts"
    assert letters[ids["always"]].error_class.endswith("ValueError")
    assert "flaky" in letters[ids["always"]].traceback  # the def's own frame
    assert letters[ids["permanent"]].reason == "permanent"
    assert letters[ids["invalid"]].reason == "invalid-payload"


def _metric(text_: str, name: str) -> float:
    [line] = [line for line in text_.splitlines() if line.startswith(name + "{")]
    return float(line.rsplit(" ", 1)[1])


async def test_a_thread_past_its_timeout_is_retried_and_keeps_its_slot_and_key(
        app: App, declare: Declare) -> None:
    await declare("sync.stuck", partitions=1, retry_tiers=["1s"], max_attempts=2)
    gate = threading.Event()
    started: list[tuple[str, int]] = []

    @app.job("sync.stuck", timeout=0.3, concurrency=2, ordering="key")
    def stuck(job: dict[str, str], ctx: JobContext) -> None:
        started.append((job["name"], ctx.attempt))
        if job["name"] == "a1" and ctx.attempt == 1:
            gate.wait(60)  # a call that ignores its timeout (a hung socket, say)

    async with app.client() as client:
        for name, key in (("a1", "a"), ("a2", "a"), ("b1", "b"), ("c1", "c")):
            await client.enqueue("sync.stuck", {"name": name}, key=key)
    worker = app.worker("sync.stuck")
    registry = worker_registry(worker)
    running = asyncio.create_task(worker.run(until_idle=True))
    try:
        assert worker.threads is not None
        threads = worker.threads
        await until(lambda: worker.outcomes["retried"] == 1 and
                    worker.outcomes["succeeded"] == 2, "a1 times out; b1 and c1 succeed")
        assert {("b1", 1), ("c1", 1)} <= set(started)
        # a1 has failed and left for its tier, but its thread runs on: it keeps one of the
        # two slots (b1 and c1 ran one after the other in the other), and a1's key: a2
        # has not started, and does not while the thread runs.
        assert ("a2", 1) not in started
        assert (threads.busy, threads.overdue, worker.dispatcher.held) == (1, 1, 1)
        scraped = generate_latest(registry).decode()
        assert _metric(scraped, "stream_jobs_worker_overdue_threads") == 1
        assert _metric(scraped, "stream_jobs_overdue_threads_total") == 1
        assert not running.done()  # not idle while a handler thread runs
    finally:
        gate.set()
        await asyncio.wait_for(running, 60)  # on a failure too: no worker outlives the test
    assert started.index(("a2", 1)) > started.index(("c1", 1))
    assert ("a1", 2) in started
    assert worker.outcomes["succeeded"] == 4  # a1 (attempt 2), a2, b1, c1
    assert (threads.busy, threads.overdue, worker.dispatcher.held) == (0, 0, 0)


async def test_a_def_handler_keeps_key_order_and_never_overlaps_a_key(
        app: App, declare: Declare) -> None:
    await declare("sync.ordered", partitions=2)
    lock = threading.Lock()
    seen: dict[str, list[int]] = {}
    busy_keys: set[str] = set()
    overlaps: list[str] = []

    @app.job("sync.ordered", concurrency=8, ordering="key")
    def apply(job: dict[str, Any], ctx: JobContext) -> None:
        key = job["key"]
        with lock:
            if key in busy_keys:
                overlaps.append(key)
            busy_keys.add(key)
        time.sleep(0.002 * (job["n"] % 3))
        with lock:
            busy_keys.discard(key)
            seen.setdefault(key, []).append(job["n"])

    keys = [f"doc-{k}" for k in range(6)]
    async with app.client() as client:
        await client.enqueue_many([Job("sync.ordered", {"key": key, "n": n}, key=key)
                                   for n in range(25) for key in keys])
    worker = app.worker("sync.ordered")
    await worker.run(until_idle=True)

    assert overlaps == []
    assert seen == {key: list(range(25)) for key in keys}
    assert worker.outcomes["succeeded"] == 150


async def test_once_sync_with_a_session_writes_each_jobs_effect_once(
        app: App, declare: Declare, engine: Engine, schema: str) -> None:
    await declare("sync.ledger", partitions=2, retry_tiers=["1s"], max_attempts=3)
    failed_after_writing: list[str] = []

    @app.job("sync.ledger", concurrency=4)
    def post(job: Render, ctx: JobContext) -> None:
        with Session(engine) as session, ctx.once_sync(session):
            session.execute(text(f'INSERT INTO "{schema}".effects VALUES (:id, :page)'),
                            {"id": ctx.job_id, "page": job.page})
            if job.kind == "fails-once" and ctx.attempt == 1:
                failed_after_writing.append(ctx.job_id)
                raise RuntimeError("after the write: rolled back with the dedup row")

    async with app.client() as client:
        ids = [await client.enqueue("sync.ledger", Render(page=i, kind="fails-once" if i == 3
                                                          else "ok"), job_id=f"led-{i}")
               for i in range(12)]
        # The same job IDs again, as a producer retrying its enqueue would send them.
        for i in range(12):
            await client.enqueue("sync.ledger", Render(page=i), job_id=f"led-{i}")
    worker = app.worker("sync.ledger")
    await worker.run(until_idle=True)

    assert failed_after_writing == ["led-3"]
    assert effect_counts(engine, schema) == Counter({job_id: 1 for job_id in ids})
    assert worker.outcomes["succeeded"] == 12
    assert worker.outcomes["duplicate"] == 12
    assert worker.outcomes["retried"] == 1
    with engine.connect() as conn:
        done = conn.execute(text(f'SELECT count(*) FROM "{schema}".stream_jobs_done')).scalar()
    assert done == 12


async def test_once_sync_with_a_psycopg_connection(
        app: App, declare: Declare, settings: Settings, engine: Engine, schema: str) -> None:
    await declare("sync.dbapi", partitions=1)

    @app.job("sync.dbapi", concurrency=2)
    def post(job: Render, ctx: JobContext) -> None:
        with psycopg.connect(settings.database_url) as conn, ctx.once_sync(conn):
            conn.execute(f'INSERT INTO "{schema}".effects VALUES (%s, %s)',
                         (ctx.job_id, job.page))

    async with app.client() as client:
        for _ in range(2):  # each job twice: the second run is a duplicate
            for i in range(5):
                await client.enqueue("sync.dbapi", Render(page=i), job_id=f"db-{i}")
    worker = app.worker("sync.dbapi")
    await worker.run(until_idle=True)

    assert effect_counts(engine, schema) == Counter({f"db-{i}": 1 for i in range(5)})
    assert worker.outcomes["succeeded"] == 5
    assert worker.outcomes["duplicate"] == 5


async def test_an_async_handler_blocking_the_loop_is_logged_with_its_job(
        app: App, declare: Declare, caplog: pytest.LogCaptureFixture) -> None:
    await declare("sync.blocker", partitions=1)

    @app.job("sync.blocker")
    async def blocker(job: dict[str, bool], ctx: JobContext) -> None:
        if job["block"]:
            time.sleep(1.6)  # noqa: ASYNC251 (the mistake the warning is for)

    async with app.client() as client:
        await client.enqueue("sync.blocker", {"block": False})
        blocking = await client.enqueue("sync.blocker", {"block": True})
    with caplog.at_level(logging.WARNING, logger="stream_jobs.worker"):
        worker = app.worker("sync.blocker")
        await worker.run(until_idle=True)
    lines = [r for r in caplog.records if "blocked the event loop" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    found = fields(lines[0])
    assert found["job_id"] == blocking
    assert found["job_type"] == "sync.blocker"
    assert found["attempt"] == 1
    assert 1.0 < found["blocked_s"] < 1.6
    assert worker.loop_watch.stalls == 1
    assert worker.outcomes["succeeded"] == 2


async def test_a_blocked_loop_of_four_types_is_blamed_on_the_one_job_that_blocked_it(
        app: App, declare: Declare, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 22: with a watch per type, one 1.5 s `time.sleep` in a process running four
    types was also reported by the innocent types' watches, with their names. One loop,
    one watch: one warning, naming the job."""
    innocent = ["stall.mail", "stall.image", "stall.report"]
    for job_type in ["stall.blocker", *innocent]:
        await declare(job_type, partitions=1)

    @app.job("stall.blocker")
    async def blocker(job: dict[str, bool], ctx: JobContext) -> None:
        if job["block"]:
            time.sleep(1.5)  # noqa: ASYNC251 (the mistake the warning is for)

    for job_type in innocent:
        @app.job(job_type)
        async def behaves(job: dict[str, int], ctx: JobContext) -> None:
            await asyncio.sleep(0)

    async with app.client() as client:
        for job_type in innocent:
            await client.enqueue_many([Job(job_type, {"n": n}) for n in range(20)])
        await client.enqueue("stall.blocker", {"block": False})
        blocking = await client.enqueue("stall.blocker", {"block": True})
    workers = [app.worker(t) for t in ["stall.blocker", *innocent]]
    host = WorkerHost(workers)  # every type runs (and watches) until the stall is over
    with caplog.at_level(logging.INFO, logger="stream_jobs.worker"):
        running = asyncio.create_task(host.run())
        try:
            def over() -> bool:
                if running.done():
                    running.result()  # surfaces the host's error
                ran = [sum(w.outcomes.values()) for w in workers] == [2, 20, 20, 20]
                return ran and any("ran again" in r.getMessage() for r in caplog.records)

            await until(over, "every job ran and the loop ran again after the stall")
        finally:
            host.request_stop()
            await running

    about_the_loop = [r for r in caplog.records if "event loop" in r.getMessage()]
    warnings = [r for r in about_the_loop if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in about_the_loop]
    found = fields(warnings[0])
    assert (found["job_id"], found["job_type"]) == (blocking, "stall.blocker")
    assert 1.0 < found["blocked_s"] < 1.5
    assert f"job {blocking} (stall.blocker) has blocked the event loop" in \
        warnings[0].getMessage()
    # Its end is one INFO line, about the same job; no line names an innocent type.
    assert [r.levelno for r in about_the_loop] == [logging.WARNING, logging.INFO]
    for record in about_the_loop:
        assert not any(t in record.getMessage() for t in innocent), record.getMessage()
    assert [w.loop_watch.stalls for w in workers] == [1, 0, 0, 0]
