"""Flow control against the real stack: lanes by weight, a rate limit shared by two
workers and changed at run time, a paced drain that drops expired jobs, heartbeats that
tell a stopped partition from an idle one, and one slow type not slowing another.

Budget: these tests together stay well under 90 s on a 2-core machine, so windows are
short (the rate is held for 8 s, not 20) and bounds generous. Nothing waits by sleeping:
waits poll a condition against a deadline; the few fixed spans are measurement windows.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.context import JobContext
from stream_jobs.control import RateInForce, publish_rate
from stream_jobs.settings import Settings
from stream_jobs.stats import TypeStats, collect
from stream_jobs.topics import load_job_types
from stream_jobs.worker import Worker

from .conftest import Declare

REPO = Path(__file__).resolve().parents[2]
STREAM_JOBS = Path(sys.executable).with_name("stream-jobs")
POLL_S = 0.02


async def until(check: Callable[[], bool | Awaitable[bool]], what: str,
                timeout_s: float = 30) -> float:
    """Poll `check` until it holds; the seconds it took. Fails the test at the deadline."""
    start = time.monotonic()
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            pytest.fail(f"not within {timeout_s:g} s: {what}")
        await asyncio.sleep(POLL_S)


@pytest.fixture
async def running() -> AsyncIterator[Callable[[Worker], asyncio.Task[None]]]:
    """Start workers as tasks; every one still running is stopped (and awaited) at the end."""
    started: list[tuple[Worker, asyncio.Task[None]]] = []

    def start(worker: Worker) -> asyncio.Task[None]:
        task = asyncio.create_task(worker.run())
        started.append((worker, task))
        return task

    yield start
    for worker, _ in started:
        worker.request_stop()
    results = await asyncio.gather(*(task for _, task in started), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


def env_of(settings: Settings) -> dict[str, str]:
    return {**os.environ,
            "STREAM_JOBS_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "STREAM_JOBS_DATABASE_URL": settings.database_url,
            "STREAM_JOBS_DATABASE_SCHEMA": settings.database_schema,
            "STREAM_JOBS_TOPIC_PREFIX": settings.topic_prefix,
            "STREAM_JOBS_TOPICS_DIR": str(settings.topics_dir)}


async def type_stats(settings: Settings, job_type: str, **options: Any) -> TypeStats:
    shot = await collect(settings, load_job_types(settings.topics_dir), job_type=job_type,
                         **options)
    return shot.types[0]


# -- 1. lanes ----------------------------------------------------------------------------


async def test_high_finishes_first_and_low_keeps_its_share_meanwhile(
        app: App, declare: Declare) -> None:
    await declare("lanes.mix", partitions=2, retry_tiers=["1s"],
                  priorities=["high", "default", "low"])
    started: list[str] = []
    retried: list[tuple[int, str]] = []  # (attempt, topic) of the jobs that fail once

    @app.job("lanes.mix", concurrency=4, ordering="unordered")
    async def run(job: dict[str, Any], ctx: JobContext) -> None:
        if job.get("fail_once"):
            retried.append((ctx.attempt, ctx.topic))
            if ctx.attempt == 1:
                raise RuntimeError("fails once")
            return
        started.append(ctx.lane)
        await asyncio.sleep(0.002)  # the handler, not the fetch, is the bottleneck

    per_lane = 600
    async with app.client() as client:
        for lane in ("low", "default", "high"):  # high written last: no head start
            await client.enqueue_many([Job("lanes.mix", {"i": i}, priority=lane)
                                       for i in range(per_lane)])
        await client.enqueue_many([Job("lanes.mix", {"fail_once": True}, priority="high")
                                   for _ in range(3)])
    await app.worker("lanes.mix").run(until_idle=True)

    # A retry comes back through the delay tier to its own lane.
    high_topic = f"{app.settings.topic_prefix}.lanes.mix.high"
    assert sorted(retried) == [(1, high_topic)] * 3 + [(2, high_topic)] * 3

    assert len(started) == 3 * per_lane
    last = {lane: len(started) - 1 - started[::-1].index(lane)
            for lane in ("high", "default", "low")}
    assert last["high"] < last["default"] < last["low"]
    before_high_empty = started[:last["high"] + 1]
    high = before_high_empty.count("high")
    default = before_high_empty.count("default")
    low = before_high_empty.count("low")
    # Weights 6:3:1: while high drains, default gets ~1/2 and low ~1/6 of high's starts.
    assert 0.3 <= default / high <= 0.75, (high, default, low)
    assert 0.08 <= low / high <= 0.3, (high, default, low)


# -- 2. rate limit across workers, changed at run time --------------------------------------


async def test_a_rate_limit_holds_across_two_workers_and_a_throttle_applies_within_2_s(
        app: App, declare: Declare, settings: Settings,
        running: Callable[[Worker], asyncio.Task[None]]) -> None:
    # 8 s keeps the suite inside CI's budget; STREAM_JOBS_TEST_RATE_WINDOW_S=20 runs the
    # issue's 20 s window by hand.
    window_s = float(os.environ.get("STREAM_JOBS_TEST_RATE_WINDOW_S", "8"))
    rate, new_rate = 50.0, 20.0
    await declare("rate.capped", partitions=4, retry_tiers=["1s"], rate_limit="50/s")
    starts: list[float] = []

    @app.job("rate.capped", concurrency=8, ordering="unordered")
    async def run(job: dict[str, Any], ctx: JobContext) -> None:
        starts.append(time.monotonic())

    async with app.client() as client:
        await client.enqueue_many([Job("rate.capped", {"i": i}) for i in range(1200)])
    workers = [app.worker("rate.capped", relay=False, report_interval_s=0.5)
               for _ in range(2)]
    for worker in workers:
        running(worker)
    # Both members hold partitions and have taken their half of the rate.
    await until(lambda: all(w.rate_share_per_s == pytest.approx(rate / 2) for w in workers),
                "both workers share the rate", timeout_s=30)
    # Past the start-up (connections, first fetches): the window measures the steady state.
    warm = len(starts) + 25
    await until(lambda: len(starts) >= warm, "jobs start at the shared rate")

    t0 = time.monotonic()
    await until(lambda: time.monotonic() >= t0 + window_s, "the measurement window")
    in_window = sum(1 for s in starts if t0 <= s < t0 + window_s)
    assert abs(in_window - rate * window_s) <= 0.1 * rate * window_s, in_window

    t1 = time.monotonic()
    await publish_rate(settings, "rate.capped", new_rate, at_ms=int(time.time() * 1000))
    await until(lambda: all(w.rate == RateInForce(new_rate, "throttle") for w in workers),
                "both workers apply the throttle", timeout_s=2.0)
    took = time.monotonic() - t1  # from the moment `throttle` started writing
    assert took <= 2.0
    t2 = t1 + 2.0
    await until(lambda: time.monotonic() >= t2 + 3.0, "the second window")
    after = sum(1 for s in starts if t2 <= s < t2 + 3.0)
    assert abs(after - new_rate * 3.0) <= 0.25 * new_rate * 3.0, after

    async def limit_shown() -> bool:
        shown = (await type_stats(settings, "rate.capped", window_s=5)).to_dict(
            per_partition=False)["rate_limit"]
        return shown == {"per_s": new_rate, "source": "throttle", "workers_applying": 2,
                         "share_per_s": new_rate}

    await until(limit_shown, "stats show the limit in force", timeout_s=10)


# -- 3. a paced drain drops what expired --------------------------------------------------


async def test_a_drain_paces_the_backlog_and_expired_jobs_are_counted_not_run(
        app: App, declare: Declare, settings: Settings,
        running: Callable[[Worker], asyncio.Task[None]]) -> None:
    await declare("drain.backlog", partitions=2, retry_tiers=["1s"])
    ran: dict[str, float] = {}

    @app.job("drain.backlog", concurrency=16, ordering="unordered")
    async def run(job: dict[str, Any], ctx: JobContext) -> None:
        ran[ctx.job_id] = time.monotonic()

    async with app.client() as client:
        stale = await client.enqueue_many([Job("drain.backlog", {"i": i}, expires_in=0)
                                           for i in range(300)])
        fresh = await client.enqueue_many([Job("drain.backlog", {"i": i})
                                           for i in range(100)])
    drain = await asyncio.create_subprocess_exec(
        str(STREAM_JOBS), "drain", "drain.backlog", "--rate", "100/s", "--interval", "0.3",
        "--timeout", "60", cwd=REPO, env=env_of(settings), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        # The worker starts once the pace is set, as after a recovery's `drain --rate`.
        await until(lambda: _rate_of(settings, "drain.backlog", RateInForce(100, "drain")),
                    "drain sets the rate", timeout_s=90)
        worker = app.worker("drain.backlog", relay=False, report_interval_s=0.5)
        running(worker)
        out, err = await asyncio.wait_for(drain.communicate(), 60)
    finally:
        if drain.returncode is None:
            drain.kill()
            await drain.wait()
    assert drain.returncode == 0, out.decode() + err.decode()
    assert "drained" in out.decode()

    assert set(ran) == set(fresh)
    assert not set(ran) & set(stale)
    assert worker.outcomes["expired"] == 300
    spread = max(ran.values()) - min(ran.values())
    assert spread >= 0.7  # 100 jobs at 100/s: about a second, not all at once

    async def expired_counted() -> bool:
        stats = await type_stats(settings, "drain.backlog")
        return stats.rates.counts.expired == 300 and stats.rates.counts.done == 100

    await until(expired_counted, "stats count the expired jobs", timeout_s=10)


async def _rate_of(settings: Settings, job_type: str, expected: RateInForce) -> bool:
    return (await type_stats(settings, job_type)).rate == expected


# -- 4. heartbeats ---------------------------------------------------------------------------


@pytest.fixture
def worker_processes(settings: Settings, tmp_path: Path
                     ) -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str) -> subprocess.Popen[bytes]:
        with (tmp_path / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(
                [str(STREAM_JOBS), "worker", "tests.apps.beats:app", "--type", "beat.check"],
                cwd=REPO, env=env_of(settings), stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()  # SIGKILL ends a stopped process too
        proc.wait(timeout=10)


async def test_a_stopped_workers_partition_is_stuck_within_two_intervals_an_idle_one_is_not(
        declare: Declare, settings: Settings,
        worker_processes: Callable[[str], subprocess.Popen[bytes]]) -> None:
    interval_s = 0.5
    await declare("beat.check", partitions=2, retry_tiers=["1s"], heartbeat_interval="500ms")
    stopping, staying = worker_processes("stopping"), worker_processes("staying")
    types = load_job_types(settings.topics_dir)
    owner: dict[int, int] = {}  # partition -> pid of the worker holding it

    async def snapshot() -> tuple[int, TypeStats, dict[int, str]]:
        shot = await collect(settings, types, job_type="beat.check", window_s=5)
        stats = shot.types[0]
        assert stats.heartbeats is not None
        return shot.at_ms, stats, {b.partition: b.state for b in stats.heartbeats.partitions}

    async def both_idle_one_partition_each() -> bool:
        _, stats, states = await snapshot()
        owner.clear()
        for report in stats.workers:
            for _, partition, _ in report.heartbeats:
                owner[partition] = int(report.worker_id.split("-")[-2])
        return (len(stats.workers) == 2 and sorted(owner) == [0, 1]
                and set(owner.values()) == {stopping.pid, staying.pid}
                and set(states.values()) == {"idle"})

    await until(both_idle_one_partition_each,
                "two workers, one partition each, heartbeats on time", timeout_s=45)
    (theirs,) = [p for p, pid in owner.items() if pid == stopping.pid]
    (mine,) = [p for p, pid in owner.items() if pid == staying.pid]

    stopping.send_signal(signal.SIGSTOP)
    stopped_ms = int(time.time() * 1000)
    on_time_at: list[int] = []  # ms after the stop of each snapshot not (yet) saying stuck

    async def flagged() -> bool:
        at_ms, stats, states = await snapshot()
        assert states[mine] in ("idle", "busy"), states  # the live worker's stays on time
        if states[theirs] != "stuck":
            on_time_at.append(at_ms - stopped_ms)
            return False
        document = stats.to_dict(per_partition=False)["heartbeats"]
        assert [(s["partition"], s["state"]) for s in document["stuck"]] == [(theirs, "stuck")]
        return True

    await until(flagged, "the stopped worker's partition is reported stuck", timeout_s=10)
    # Its newest heartbeat was written before the stop, so every snapshot taken more than
    # 2 intervals after the stop must say stuck (100 ms: the signal's own delivery). How
    # soon the test sees it also depends on how long one `stats` call takes here.
    assert all(after_ms <= 2 * interval_s * 1000 + 100 for after_ms in on_time_at), on_time_at
    stopping.kill()


# -- 5. isolation ----------------------------------------------------------------------------


async def test_a_slow_type_leaves_the_other_types_throughput_and_latency_alone(
        app: App, declare: Declare, running: Callable[[Worker], asyncio.Task[None]]) -> None:
    """Both workers share one process and one event loop, a harder case than two
    processes on one machine: the slow type holds 64 jobs of 1 s each throughout."""
    await declare("iso.fast", partitions=2, retry_tiers=["1s"])
    await declare("iso.slow", partitions=2, retry_tiers=["1s"])
    latencies: list[tuple[float, float]] = []  # (when it started, seconds since enqueue)
    slow_running = 0

    @app.job("iso.fast", concurrency=16, ordering="unordered")
    async def fast(job: dict[str, Any], ctx: JobContext) -> None:
        now = datetime.now(UTC)
        latencies.append((time.monotonic(), (now - ctx.enqueued_at).total_seconds()))

    @app.job("iso.slow", concurrency=64, ordering="unordered")
    async def slow(job: dict[str, Any], ctx: JobContext) -> None:
        nonlocal slow_running
        slow_running += 1
        try:
            await asyncio.sleep(1.0)  # a degraded dependency
        finally:
            slow_running -= 1

    async def steady(client: Any, per_s: int, seconds: float) -> tuple[float, float]:
        """Enqueue at `per_s` for `seconds`: (jobs/s done, p95 seconds from enqueue to start)."""
        begin = time.monotonic()
        sent = len(latencies)
        batches = int(seconds * 10)
        for n in range(batches):
            await client.enqueue_many([Job("iso.fast", {"n": n}) for _ in range(per_s // 10)])
            next_at = begin + (n + 1) / 10
            await until(lambda at=next_at: time.monotonic() >= at, "the next batch's time")
        await until(lambda: len(latencies) >= sent + batches * (per_s // 10),
                    "the fast jobs ran", timeout_s=20)
        phase = [lat for _, lat in latencies[sent:]]
        return len(phase) / (time.monotonic() - begin), statistics.quantiles(phase, n=20)[-1]

    async def backlog(client: Any, jobs: int) -> float:
        """Enqueue a backlog at once: jobs/s from the enqueue to the last start."""
        sent = len(latencies)
        begin = time.monotonic()
        await client.enqueue_many([Job("iso.fast", {"n": n}) for n in range(jobs)])
        await until(lambda: len(latencies) >= sent + jobs, "the backlog ran", timeout_s=30)
        return jobs / (latencies[-1][0] - begin)

    async with app.client() as client:
        await client.enqueue_many([Job("iso.slow", {"i": i}) for i in range(400)])
        running(app.worker("iso.fast", relay=False))
        await client.enqueue("iso.fast", {"n": -1})
        await until(lambda: len(latencies) == 1, "the fast worker runs")
        await steady(client, 100, 1.0)  # warm-up: connections, first fetches

        alone = (*await steady(client, 100, 2.0), await backlog(client, 3000))
        running(app.worker("iso.slow", relay=False))
        await until(lambda: slow_running == 64, "the slow type fills its concurrency")
        await steady(client, 100, 1.0)  # the same warm-up: the slow worker just started
        beside = (*await steady(client, 100, 2.0), await backlog(client, 3000))
        assert slow_running == 64  # still saturated: the comparison was under load

    (rate_alone, p95_alone, most_alone), (rate_beside, p95_beside, most_beside) = alone, beside
    assert rate_beside >= 0.9 * rate_alone, (alone, beside)  # keeps up with what is offered
    assert p95_beside <= max(3 * p95_alone, p95_alone + 0.25), (alone, beside)
    # A backlog drains about as fast (bound loose: other work on this 2-core box moves it).
    assert most_beside >= 0.25 * most_alone, (alone, beside)
