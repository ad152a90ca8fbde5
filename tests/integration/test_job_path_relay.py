"""The delay relay against the real stack: a tier partition whose head is not due is
paused (no busy polling), a delay longer than the largest tier hops through it, and
`run_at` and keys survive the trip.

Nothing waits by sleeping: every wait polls a condition against a deadline.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.kafka import TopicPartition
from stream_jobs.naming import tier_topic
from stream_jobs.settings import Settings
from tests.waiting import until

from .conftest import Declare
from .topic_reader import read_topic

# aiokafka's getmany long-polls this long when nothing is fetchable (Worker's poll_once).
RELAY_POLL_S = 0.2
# Scheduling slack a loaded 2-core machine may add to a release.
LATE_S = 1.5


def _ms() -> int:
    return int(time.time() * 1000)




async def test_a_delay_past_the_largest_tier_hops_and_the_relay_never_busy_polls(
        app: App, declare: Declare, settings: Settings) -> None:
    await declare("later.job", partitions=1, retry_tiers=["1s"], max_attempts=2)
    ran: dict[str, tuple[int, str | None, str]] = {}

    @app.job("later.job")
    async def later(job: dict[str, str], ctx: JobContext) -> None:
        ran[job["name"]] = (_ms(), ctx.key, ctx.job_id)

    worker = app.worker("later.job")
    relay = worker.relay
    assert relay is not None
    tier = TopicPartition(tier_topic(settings.topic_prefix, "later.job", "1s"), 0)
    fetches: list[tuple[float, int, bool]] = []  # (when, tier records returned, paused)
    getmany = relay.consumer.getmany

    async def counting(*partitions: Any, **options: Any) -> Any:
        batches = await getmany(*partitions, **options)
        fetches.append((time.monotonic(), sum(len(r) for r in batches.values()),
                        tier in relay.consumer.paused()))
        return batches

    relay.consumer.getmany = counting

    # The worker is in both groups before the jobs are enqueued, so the times below are
    # the relay's, not a cold start's.
    running = asyncio.create_task(worker.run())
    try:
        await until(lambda: bool(worker.partitions) and bool(relay.partitions),
                    "the worker and the relay to hold their partitions", 30)
        async with app.client() as client:
            run_at = datetime.now(UTC) + timedelta(seconds=1.5)
            at = await client.enqueue("later.job", {"name": "at"}, run_at=run_at)
            enqueued = _ms()
            far = await client.enqueue("later.job", {"name": "far"}, key="user-42", delay=3)
        began = time.monotonic()
        await until(lambda: len(ran) == 2, "both delayed jobs to run", 30)
        window = [f for f in fetches if f[0] >= began]
        elapsed_s = time.monotonic() - began
    finally:
        worker.request_stop()
        await asyncio.wait_for(running, 30)

    # Each ran once, no earlier than its time and not much later.
    assert set(ran) == {"far", "at"}
    far_ms, far_key, far_id = ran["far"]
    at_ms, at_key, at_id = ran["at"]
    assert enqueued + 3_000 <= far_ms < enqueued + 3_000 + LATE_S * 1000, far_ms - enqueued
    run_at_ms = int(run_at.timestamp() * 1000)
    assert run_at_ms <= at_ms < run_at_ms + LATE_S * 1000, at_ms - run_at_ms
    # The key went through the tier and its hops; a job without one is keyed by its ID.
    assert (far_id, far_key) == (far, "user-42")
    assert (at_id, at_key) == (at, at)

    # A tier's head is held at most one tier delay (plus jitter room) from when it was
    # written, then hops. Both went round the 1 s tier: `at` once, at about 1.1 s, then
    # was released at 1.5 s; `far` (3 s, longer than the largest tier) at about 1.1 s and
    # 2.2 s, then was released at 3 s.
    tier_records = await read_topic(settings, tier.topic)
    far_trips = [r for r in tier_records if dict(r.headers)["sj-job-id"] == far.encode()]
    assert len(far_trips) >= 3, "the 3 s delay hopped through the 1 s tier more than once"
    assert all(r.key == b"user-42" for r in far_trips)
    assert len(tier_records) == 2 + relay.hops
    assert relay.released == 2

    # No busy polling: every tier record was fetched once (nothing was read again to see
    # whether it was due), most polls while the jobs waited found the partition paused,
    # and the relay polled about once per long-poll period, not in a tight loop.
    assert sum(n for _, n, _ in fetches) == len(tier_records)
    paused_polls = sum(1 for _, _, paused in window if paused)
    assert paused_polls >= len(window) // 2, (paused_polls, len(window))
    assert len(window) <= elapsed_s / RELAY_POLL_S * 2 + 10, (len(window), elapsed_s)
    print(f"\n[relay] {len(window)} polls in {elapsed_s:.1f} s, {paused_polls} while paused,"
          f" {relay.hops} hops; far ran {far_ms - enqueued} ms after enqueue, "
          f"run_at job {at_ms - run_at_ms} ms after its time")


async def test_a_record_held_for_long_does_not_hold_up_a_due_one_behind_another_partition(
        app: App, declare: Declare) -> None:
    # Found by the in-memory JobTester: a relay whose runners were all holding records
    # started no runner for a record fetched later on another partition, so a 1 s delay
    # waited for a 20 s one to be released.
    await declare("held.job", partitions=1, retry_tiers=["1s", "20s"], max_attempts=2)
    ran: dict[str, int] = {}

    @app.job("held.job")
    async def held(job: dict[str, str], ctx: JobContext) -> None:
        ran[job["name"]] = _ms()

    worker = app.worker("held.job")
    relay = worker.relay
    assert relay is not None
    running = asyncio.create_task(worker.run())
    try:
        await until(lambda: bool(worker.partitions) and bool(relay.partitions),
                    "the worker and the relay to hold their partitions", 30)
        async with app.client() as client:
            await client.enqueue("held.job", {"name": "far"}, delay=20)
            await until(lambda: relay.in_flight() == 1, "the relay to hold the 20 s job", 30)
            enqueued = _ms()
            await client.enqueue("held.job", {"name": "soon"}, delay=1)
        await until(lambda: "soon" in ran, "the 1 s job to run while the 20 s one waits", 10)
    finally:
        worker.request_stop()
        await asyncio.wait_for(running, 30)
    assert "far" not in ran
    assert ran["soon"] - enqueued < (1 + RELAY_POLL_S + LATE_S) * 1000
