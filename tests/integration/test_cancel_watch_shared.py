"""One cancel watch per process: the workers of an app's types share one LISTEN
connection (`Storage.cancel_feed`), and each type still hears only its own cancels."""

from __future__ import annotations

import asyncio
from typing import Any

from stream_jobs.app import App
from stream_jobs.cancels.watch import TypeCancels
from stream_jobs.context import JobContext
from tests.waiting import until

from .conftest import Declare


async def test_the_workers_of_two_types_share_one_listen_connection_and_hear_their_own(
        app: App, declare: Declare) -> None:
    await declare("watch.one", partitions=1)
    await declare("watch.two", partitions=1)
    gate = asyncio.Event()
    started: dict[str, list[str]] = {"watch.one": [], "watch.two": []}

    def handler(job_type: str) -> Any:
        async def work(job: dict[str, Any], ctx: JobContext) -> None:
            started[job_type].append(ctx.job_id)
            await gate.wait()  # interrupted by its cancel, or let go at the end
        return work

    for job_type in started:
        app.job(job_type, concurrency=1)(handler(job_type))
    one, two = app.worker("watch.one"), app.worker("watch.two")
    feeds = [one.admission.watch, two.admission.watch]
    assert all(isinstance(feed, TypeCancels) for feed in feeds)
    first, second = (feed for feed in feeds if isinstance(feed, TypeCancels))
    assert first.watch is second.watch, "each type's worker made a watch of its own"
    runs = [asyncio.create_task(w.run(until_idle=True)) for w in (one, two)]
    try:
        async with app.client() as client:
            a = await client.enqueue("watch.one", {})
            b = await client.enqueue("watch.two", {})
            await until(lambda: started["watch.one"] == [a] and started["watch.two"] == [b],
                        "both jobs to start")
            connection = first.watch._conn
            assert connection is not None
            assert first.watch.loads == 1
            await client.cancel(a, job_type="watch.one")
            await until(lambda: one.outcomes["cancelled"] == 1, "watch.one's job interrupted")
            assert a in first.ids
            assert a not in second.ids
            assert two.outcomes["cancelled"] == 0, "a cancel of watch.one reached watch.two"
            await client.cancel(b, job_type="watch.two")
            await until(lambda: two.outcomes["cancelled"] == 1, "watch.two's job interrupted")
            assert first.watch._conn is connection, "the watch connected again"
    finally:
        gate.set()
        await asyncio.wait_for(asyncio.gather(*runs), 60)
    assert first.watch._conn is None, "the last worker to stop left the connection open"
