"""JobTester covers what the other features add to a job's life: child jobs exactly-once
with their parent, `enqueue(conn=...)` in a transaction, schedules on virtual time, sync
handlers, fencing tokens (awaited, and taken on a sync handler's thread)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from stream_jobs import App, JobContext
from stream_jobs.client import Job
from stream_jobs.errors import ConfigError
from stream_jobs.kafka.clients import AIOKAFKA
from stream_jobs.outbox.rows import child_job_id
from stream_jobs.schedules import firing_job_id
from stream_jobs.testing import JobTester
from stream_jobs.testing.plugin import StartTester

TYPES: dict[str, Any] = {"order.place": {"partitions": 2, "retry_tiers": ["5s"]},
                         "invoice.render": {"partitions": 2, "retry_tiers": ["5s"]}}


def order_app(seen: list[tuple[str, Any]], *, deferred: bool = False) -> App:
    app = App()

    @app.job("order.place")
    async def place(order: dict[str, Any], ctx: JobContext) -> None:
        block = ctx.once_deferred() if deferred else ctx.once()
        async with block as conn:
            await conn.execute("UPDATE orders SET placed = true WHERE id = $1", order["id"])
            await ctx.enqueue("invoice.render", {"order": order["id"]}, name="invoice")
            if order.get("fail") and ctx.attempt == 1:
                raise RuntimeError("the block rolls back, child and all")

    @app.job("invoice.render")
    async def render(invoice: dict[str, Any], ctx: JobContext) -> None:
        seen.append(("invoice", invoice["order"]))

    return app


@pytest.mark.parametrize("deferred", [False, True])
async def test_a_child_job_exists_once_and_only_with_its_parents_commit(
        job_tester: StartTester, deferred: bool) -> None:
    seen: list[tuple[str, Any]] = []
    t = job_tester(order_app(seen, deferred=deferred), types=TYPES)
    first = await t.enqueue("order.place", {"id": 1})
    second = await t.enqueue("order.place", {"id": 2, "fail": True})
    await t.run_until_idle()
    assert sorted(seen) == [("invoice", 1), ("invoice", 2)]
    assert t.outcomes_of("order.place") == {"succeeded": 2, "retried": 1}
    assert t.outcomes_of("invoice.render") == {"succeeded": 1 + 1}
    # The second parent's first attempt rolled back: its child was never written.
    assert t.attempts_of(child_job_id(second, "invoice")) == 1
    assert t.effects_of(first)[0].args == (1,)


async def test_enqueue_in_a_transaction_exists_only_if_it_commits(
        job_tester: StartTester) -> None:
    seen: list[tuple[str, Any]] = []
    app = order_app(seen)
    t = job_tester(app, types=TYPES)
    async with t.transaction() as conn:
        await t.enqueue("invoice.render", {"order": 10}, conn=conn)
        await conn.execute("INSERT INTO orders VALUES (10)")

    async def rolled_back() -> None:
        async with t.transaction() as conn:
            await t.enqueue("invoice.render", {"order": 11}, conn=conn)
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError, match="rolled back"):
        await rolled_back()
    with t.transaction() as sync_conn, app.sync_client() as sync_client:
        sync_client.enqueue("invoice.render", {"order": 12}, conn=sync_conn)
    await t.run_until_idle()
    assert sorted(seen) == [("invoice", 10), ("invoice", 12)]


async def test_the_apps_own_sync_client_enqueues_into_the_tester(
        job_tester: StartTester) -> None:
    seen: list[tuple[str, Any]] = []
    app = order_app(seen)
    t = job_tester(app, types=TYPES)
    with app.sync_client() as client:  # a Django view's client, on its own thread and loop
        client.enqueue("invoice.render", {"order": 3})
    await t.run_until_idle()
    assert seen == [("invoice", 3)]


def digest_app(fired: list[tuple[str, datetime]]) -> App:
    app = App()

    @app.job("digest.send")
    async def send(digest: dict[str, Any], ctx: JobContext) -> None:
        fired.append((digest["scope"], ctx.enqueued_at))

    @app.periodic("digest.send", name="hourly", every="1h")
    def hourly(fire_time: datetime) -> dict[str, str]:
        return {"scope": f"hourly {fire_time:%H:%M}"}

    return app


DIGEST: dict[str, Any] = {"digest.send": {"schedules": [
    {"name": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Berlin",
     "payload": {"scope": "all"}}]}}


async def test_schedules_fire_on_virtual_time(job_tester: StartTester) -> None:
    fired: list[tuple[str, datetime]] = []
    start = datetime(2026, 3, 2, 1, 30, tzinfo=UTC)  # 02:30 in Berlin
    t = job_tester(digest_app(fired), types=DIGEST, start=start)
    await t.advance(3600)
    # 02:00 UTC: the hour, and 03:00 in Berlin.
    assert sorted(scope for scope, _ in fired) == ["all", "hourly 02:00"]
    assert {f.schedule for f in t.fired} == {"hourly", "nightly"}
    nightly = next(f for f in t.fired if f.schedule == "nightly")
    assert nightly.fire_ms == int(datetime(2026, 3, 2, 2, 0, tzinfo=UTC).timestamp() * 1000)
    assert nightly.job_id == firing_job_id(t.settings.topic_prefix, "digest.send", "nightly",
                                           nightly.fire_ms)
    # Each ran at its fire time, not at the end of the advance.
    assert min(at for _, at in fired) < t.now
    await t.advance(22 * 3600)
    assert [f.schedule for f in t.fired].count("hourly") == 23
    assert [f.schedule for f in t.fired].count("nightly") == 1
    assert t.outcomes == {"succeeded": 24}


async def test_a_schedule_missed_through_an_outage_follows_its_missed_policy(
        job_tester: StartTester) -> None:
    fired: list[tuple[str, datetime]] = []
    t = job_tester(digest_app(fired), types={"digest.send": {}},
                   start=datetime(2026, 3, 2, 0, 0, tzinfo=UTC))
    t.move_clock(5 * 3600 + 60)  # no scheduler ran for five hours
    await t.run_until_idle()
    assert [scope for scope, _ in fired] == ["hourly 05:00"]  # missed = "latest": once


class Digest(BaseModel):
    scope: int


async def test_a_schedules_payload_that_does_not_fit_is_refused_at_once() -> None:
    app = App()

    @app.job("digest.send")
    async def send(digest: Digest, ctx: JobContext) -> None: ...

    tester = JobTester(app, types=DIGEST)
    with pytest.raises(ConfigError, match="does not fit Digest"):
        tester.open()
    assert app.kafka is AIOKAFKA
    with JobTester(app, types={"digest.send": {}}):  # the clock was not left taken
        pass


async def test_a_sync_handler_runs_on_its_thread_pool_with_once_sync(
        job_tester: StartTester, tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'rendered.db'}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE rendered (job_id text PRIMARY KEY)"))
    app = App()
    threads: set[str] = set()

    @app.job("pdf.render", concurrency=2)
    def render(job: dict[str, Any], ctx: JobContext) -> None:
        threads.add(threading.current_thread().name)
        if job["n"] == 0 and ctx.attempt == 1:
            raise RuntimeError("the first try fails")
        with Session(engine) as session, ctx.once_sync(session):
            session.execute(text("INSERT INTO rendered VALUES (:id)"), {"id": ctx.job_id})

    t = job_tester(app, types={"pdf.render": {"retry_tiers": ["1m"]}})
    ids = [await t.enqueue("pdf.render", {"n": n}) for n in range(3)]
    ids.append(await t.enqueue("pdf.render", {"n": 9}, job_id=ids[1]))  # a duplicate
    await t.run_until_idle()
    assert t.outcomes == {"succeeded": 3, "retried": 1, "duplicate": 1}
    assert threading.current_thread().name not in threads
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT job_id FROM rendered")).scalars().all()
    assert sorted(rows) == sorted(ids[:3])
    assert set(t.done) == set(ids[:3])


async def test_fencing_tokens_grow_with_every_delivery(job_tester: StartTester) -> None:
    app = App()
    tokens: list[tuple[int, int]] = []

    @app.job("index.put")
    async def put(doc: dict[str, Any], ctx: JobContext) -> None:
        tokens.append((ctx.attempt, await ctx.fencing_token))
        if ctx.attempt < 3:
            raise RuntimeError("the index refused")

    t = job_tester(app, types={"index.put": {"retry_tiers": ["5s", "1m"]}})
    await t.enqueue_many([Job("index.put", {"doc": 1})])
    await t.run_until_idle()
    assert [attempt for attempt, _ in tokens] == [1, 2, 3]
    assert [token for _, token in tokens] == sorted({token for _, token in tokens})


async def test_a_sync_handlers_fencing_tokens_grow_with_every_delivery(
        job_tester: StartTester) -> None:
    app = App()
    tokens: list[tuple[int, int]] = []

    @app.job("index.put")
    def put(doc: dict[str, Any], ctx: JobContext) -> None:
        token = ctx.fencing_token_sync()  # on the handler's thread
        assert ctx.fencing_token_sync() == token
        tokens.append((ctx.attempt, token))
        if ctx.attempt < 3:
            raise RuntimeError("the index refused")

    t = job_tester(app, types={"index.put": {"retry_tiers": ["5s", "1m"]}})
    await t.enqueue_many([Job("index.put", {"doc": 1})])
    await t.run_until_idle()
    assert t.outcomes == {"retried": 2, "succeeded": 1}
    assert [attempt for attempt, _ in tokens] == [1, 2, 3]
    assert [token for _, token in tokens] == sorted({token for _, token in tokens})
