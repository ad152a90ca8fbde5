"""JobTester with `database_url=`: `ctx.once()` on the real dedup table, child jobs and
`enqueue(conn=...)` through the real outbox table and its real relay, into the in-memory
broker. Kafka is not used: only Postgres (this test's schema)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from stream_jobs import App, JobContext
from stream_jobs.errors import ConfigError
from stream_jobs.outbox.rows import child_job_id
from stream_jobs.settings import Settings
from stream_jobs.testing import JobTester

TYPES: dict[str, Any] = {"order.place": {"partitions": 2, "retry_tiers": ["1m"]},
                         "invoice.render": {"partitions": 2}}


@pytest.fixture
async def db(settings: Settings, schema: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(settings.database_url, server_settings={"search_path": schema})
    await conn.execute("CREATE TABLE orders (id int PRIMARY KEY, job_id text NOT NULL)")
    await conn.execute("CREATE TABLE invoices (order_id int PRIMARY KEY)")
    try:
        yield conn
    finally:
        await conn.close()


def shop(settings: Settings) -> App:
    app = App(settings)

    @app.job("order.place")
    async def place(order: dict[str, Any], ctx: JobContext) -> None:
        async with ctx.once() as conn:
            await conn.execute("INSERT INTO orders VALUES ($1, $2)", order["id"], ctx.job_id)
            await ctx.enqueue("invoice.render", {"order": order["id"]}, name="invoice")
            if order.get("fail") and ctx.attempt == 1:
                raise RuntimeError("rolled back with its child")

    @app.job("invoice.render")
    async def render(invoice: dict[str, Any], ctx: JobContext) -> None:
        async with ctx.once() as conn:
            await conn.execute("INSERT INTO invoices VALUES ($1)", invoice["order"])

    return app


async def test_once_and_child_jobs_go_through_the_real_tables(
        settings: Settings, db: asyncpg.Connection) -> None:
    async with JobTester(shop(settings), types=TYPES, database_url=settings.database_url,
                         database_schema=settings.database_schema) as t:
        first = await t.enqueue("order.place", {"id": 1})
        second = await t.enqueue("order.place", {"id": 2, "fail": True})
        await t.enqueue("order.place", {"id": 1}, job_id=first)  # a duplicate
        await t.run_until_idle()
        assert t.outcomes_of("order.place") == {"succeeded": 2, "retried": 1, "duplicate": 1}
        assert t.outcomes_of("invoice.render") == {"succeeded": 2}
        assert t.attempts_of(child_job_id(second, "invoice")) == 1
        with pytest.raises(ConfigError, match="query them"):
            t.effects_of(first)
    assert await db.fetch("SELECT id, job_id FROM orders ORDER BY id") == [(1, first), (2, second)]
    assert [r["order_id"] for r in await db.fetch("SELECT order_id FROM invoices")] == [1, 2]
    done = await db.fetch("SELECT job_id, attempt FROM stream_jobs_done WHERE job_type = $1 "
                          "ORDER BY job_id", "order.place")
    assert {(r["job_id"], r["attempt"]) for r in done} == {(first, 1), (second, 2)}
    assert await db.fetchval("SELECT count(*) FROM stream_jobs_outbox") == 0


async def test_enqueue_in_the_callers_transaction_through_the_real_outbox(
        settings: Settings, db: asyncpg.Connection) -> None:
    async with JobTester(shop(settings), types=TYPES, database_url=settings.database_url,
                         database_schema=settings.database_schema) as t:
        async with db.transaction():
            await t.enqueue("invoice.render", {"order": 10}, conn=db)

        async def rolled_back() -> None:
            async with db.transaction():
                await t.enqueue("invoice.render", {"order": 11}, conn=db)
                raise RuntimeError("rolled back")

        with pytest.raises(RuntimeError, match="rolled back"):
            await rolled_back()
        await t.run_until_idle()
        assert t.outcomes == {"succeeded": 1}
    assert [r["order_id"] for r in await db.fetch("SELECT order_id FROM invoices")] == [10]
