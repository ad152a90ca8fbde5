"""Retry now on the real stack: a job waiting an hour in a delay tier for its retry, and a
job enqueued with an hour's delay, each run within seconds of `retry_now` and exactly
once (the relay finishes the original record without releasing it); the refusals; and
the race the worker-side check is for: the relay releasing the original just before the
notice (its check turned off here), where the worker skips it, and without that check
too the attempt runs twice.

The relay's clock is driven (`delay_relay.now_ms` moved on, `relay.recheck()`) instead of
waiting for a tier's delay; every other wait polls a condition to a deadline.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from stream_jobs.app import App
from stream_jobs.clock import now_ms
from stream_jobs.context import JobContext
from stream_jobs.errors import JobNotFound, NotInDelayTier
from stream_jobs.lookup import locate_job
from stream_jobs.runtime import delay_relay
from stream_jobs.runtime import worker as worker_module
from stream_jobs.runtime.delay_relay import Relay
from stream_jobs.tools.retry_now import retry_now
from tests.waiting import until

from .conftest import Declare

HOUR_MS = 3_600_000


async def _failing_once(app: App, declare: Declare, job_type: str) -> list[int]:
    await declare(job_type, partitions=1, retry_tiers=["1h"], max_attempts=3)
    attempts: list[int] = []

    @app.job(job_type)
    async def work(job: dict[str, Any], ctx: JobContext) -> None:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            raise RuntimeError("fails once, and would retry in an hour")

    return attempts


async def test_a_retry_waiting_an_hour_runs_now_and_once(app: App, declare: Declare) -> None:
    attempts = await _failing_once(app, declare, "now.retry")
    async with app.client() as client:
        job_id = await client.enqueue("now.retry", {})
    worker = app.worker("now.retry")
    relay = worker.relay
    assert relay is not None
    running = asyncio.create_task(worker.run(until_idle=True))
    await until(lambda: job_id in relay.held_jobs.values(), "the retry to wait in tier 1h")
    before = await locate_job(app.settings, app.job_types(), job_id, job_type="now.retry")
    assert before.status == "retrying"

    asked = time.monotonic()
    done = await retry_now(app.settings, app.job_types(), job_id, job_type="now.retry")
    await until(lambda: attempts == [1, 2], "attempt 2 to run after retry-now")
    took_s = time.monotonic() - asked
    # The notice wakes the relay, which finishes the held original: the worker is idle.
    await asyncio.wait_for(running, 60)

    assert done.attempt == 2
    assert done.tier == "1h"
    assert "runs now" in done.summary()
    assert took_s < 10, f"retry-now took {took_s:.1f} s to run the job"
    assert attempts == [1, 2]  # the handler ran exactly twice: the failure and the retry
    assert relay.released_early == 1
    assert relay.released == 0
    assert dict(worker.outcomes) == {"retried": 1, "succeeded": 1}
    with pytest.raises(NotInDelayTier, match=r"is (finished|done|pending).*not waiting in a "
                                             "delay tier"):
        await retry_now(app.settings, app.job_types(), job_id, job_type="now.retry")


async def test_a_job_enqueued_an_hour_ahead_runs_now_once(app: App, declare: Declare) -> None:
    await declare("now.delayed", partitions=1, retry_tiers=["2s", "1h"])
    runs: list[int] = []

    @app.job("now.delayed")
    async def work(job: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.attempt)

    async with app.client() as client:
        job_id = await client.enqueue("now.delayed", {"n": 1}, delay=3600)
    worker = app.worker("now.delayed")
    relay = worker.relay
    assert relay is not None
    running = asyncio.create_task(worker.run(until_idle=True))
    await until(lambda: job_id in relay.held_jobs.values(), "the relay to hold the job")
    found = await locate_job(app.settings, app.job_types(), job_id)
    assert found.status == "scheduled"
    done = await retry_now(app.settings, app.job_types(), job_id)
    await asyncio.wait_for(running, 60)
    assert done.attempt == 1
    assert runs == [1]
    assert relay.released_early == 1
    assert dict(worker.outcomes) == {"succeeded": 1}


async def test_unknown_and_waiting_jobs_are_refused(app: App, declare: Declare) -> None:
    await declare("now.refused", partitions=1, retry_tiers=["1h"])
    async with app.client() as client:
        job_id = await client.enqueue("now.refused", {})
    with pytest.raises(NotInDelayTier, match=r"is pending \(or running\), not waiting in a "
                                             "delay tier"):
        await retry_now(app.settings, app.job_types(), job_id, job_type="now.refused")
    with pytest.raises(JobNotFound, match="No job nope was found"):
        await retry_now(app.settings, app.job_types(), "nope", job_type="now.refused")


async def _race(app: App, declare: Declare, job_type: str, monkeypatch: pytest.MonkeyPatch,
                *, worker_check: bool) -> tuple[list[int], dict[str, int]]:
    """Retry-now, then the relay releasing the original as if it had done so just before
    the notice: its own check is turned off and its clock moved past the due time."""
    attempts = await _failing_once(app, declare, job_type)
    monkeypatch.setattr(Relay, "_passed_early", lambda self, job: False)
    if not worker_check:
        monkeypatch.setattr(worker_module, "released_original", lambda headers, keys: False)
    async with app.client() as client:
        job_id = await client.enqueue(job_type, {})
    worker = app.worker(job_type)
    relay = worker.relay
    assert relay is not None
    running = asyncio.create_task(worker.run())
    try:
        await until(lambda: job_id in relay.held_jobs.values(), "the retry to wait in tier 1h")
        await retry_now(app.settings, app.job_types(), job_id, job_type=job_type)
        await until(lambda: attempts == [1, 2], "the copy to run")
        await until(lambda: bool(worker.admission.released), "the notice to reach the worker")
        monkeypatch.setattr(delay_relay, "now_ms", lambda: now_ms() + 2 * HOUR_MS)
        relay.recheck()
        await until(lambda: relay.released == 1, "the relay to release the original")
        expected = "duplicate" if worker_check else "succeeded"
        wanted = 1 if worker_check else 2
        await until(lambda: worker.outcomes[expected] == wanted,
                    "the worker to take the original in")
    finally:
        worker.request_stop()
        await asyncio.wait_for(running, 60)
    return attempts, dict(worker.outcomes)


async def test_the_worker_skips_an_original_the_relay_released_before_the_notice(
        app: App, declare: Declare, monkeypatch: pytest.MonkeyPatch) -> None:
    attempts, outcomes = await _race(app, declare, "now.race", monkeypatch, worker_check=True)
    assert attempts == [1, 2]
    assert outcomes == {"retried": 1, "succeeded": 1, "duplicate": 1}


async def test_without_the_worker_check_the_attempt_runs_twice(
        app: App, declare: Declare, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault the check is for, shown: the original released before the notice runs."""
    attempts, outcomes = await _race(app, declare, "now.twice", monkeypatch, worker_check=False)
    assert attempts == [1, 2, 2]
    assert outcomes == {"retried": 1, "succeeded": 2}
