"""Cancels when Postgres goes away: the watch's connection cut (a cancel it missed is found
when it reconnects), and a worker started while Postgres does not answer at all (it runs
its jobs anyway). Real services; the cut is a `pg_terminate_backend` of the watch's own
connection, nothing shared is stopped.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import asyncpg
import pytest

from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.context import JobContext
from tests.waiting import until

from .conftest import Declare


async def test_a_cancel_missed_while_the_watch_was_cut_off_is_found_when_it_reconnects(
        app: App, declare: Declare) -> None:
    await declare("cancel.cut", partitions=1, retry_tiers=["1s"])
    gate = asyncio.Event()
    started: list[str] = []

    @app.job("cancel.cut", concurrency=1, ordering="partition")
    async def work(job: dict[str, Any], ctx: JobContext) -> None:
        started.append(ctx.job_id)
        if job["first"]:
            await gate.wait()

    settings = app.settings
    async with app.client() as client:
        first = await client.enqueue("cancel.cut", {"first": True})
        missed = await client.enqueue("cancel.cut", {"first": False})
    worker = app.worker("cancel.cut")
    watch = worker.admission.watch
    assert watch is not None
    running = asyncio.create_task(worker.run(until_idle=True))
    try:
        await until(lambda: started == [first], "the first job to start")
        conn = await asyncpg.connect(settings.database_url,
                                     server_settings={"search_path": settings.database_schema})
        try:
            # A cancel the watch cannot hear: its row, written without a NOTIFY. Then the
            # watch's connection is cut; only the reload after reconnecting can find it.
            await conn.execute("INSERT INTO stream_jobs_done (job_id, job_type, attempt) "
                               "VALUES ($1, 'cancel.cut', 0)", missed)
            await conn.execute("INSERT INTO stream_jobs_cancels (job_id, job_type) "
                               "VALUES ($1, 'cancel.cut')", missed)
            loads = watch.loads
            pid = watch._conn.get_server_pid()
            assert await conn.fetchval("SELECT pg_terminate_backend($1)", pid)
        finally:
            await conn.close()
        await until(lambda: watch.loads > loads, "the watch to reconnect and reload", 15)
        assert missed in watch.ids
    finally:
        gate.set()
    await asyncio.wait_for(running, 60)
    assert started == [first]
    assert dict(worker.outcomes) == {"succeeded": 1, "cancelled": 1}


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens once it is closed


async def test_a_worker_runs_its_jobs_while_postgres_does_not_answer(
        app: App, declare: Declare, caplog: pytest.LogCaptureFixture) -> None:
    await declare("cancel.nopg", partitions=1, retry_tiers=["1s"])
    ran: list[int] = []

    @app.job("cancel.nopg")
    async def work(job: dict[str, int], ctx: JobContext) -> None:
        ran.append(job["n"])

    async with app.client() as client:
        await client.enqueue_many([Job("cancel.nopg", {"n": n})
                                   for n in range(5)])
    down = app.settings.model_copy(update={
        "database_url": f"postgresql://stream_jobs@127.0.0.1:{_closed_port()}/stream_jobs"})
    app.use_settings(down)
    worker = app.worker("cancel.nopg", relay=False)
    await asyncio.wait_for(worker.run(until_idle=True), 60)
    assert sorted(ran) == list(range(5))
    assert worker.admission.watch is not None
    assert worker.admission.watch.loads == 0
    assert "cancels not loaded yet" in caplog.text
