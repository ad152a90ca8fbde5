"""Flow control against the real stack: lanes by weight, a rate limit shared by two
workers and changed at run time, a paced drain that drops expired jobs, heartbeats that
tell a stopped partition from an idle one, and one slow type not slowing another.

The rate limit is measured as the issue states it: 20 s, two `stream-jobs worker`
processes, counted from rows their handler writes to Postgres; `throttle` and `stats` run
as the operator runs them, as commands. Budget: about two minutes together on a 2-core
machine, so bounds are generous where the load of the box moves them. Nothing waits by
sleeping: waits poll a condition against a deadline; the few fixed spans are measurement
windows.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest

from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.context import JobContext
from stream_jobs.job_types import load_job_types
from stream_jobs.kafka import TopicPartition
from stream_jobs.naming import control_topic, stats_topic
from stream_jobs.runtime.flow_control import RATE_BUFFER_MIN, RATE_BUFFER_S
from stream_jobs.runtime.heartbeats import is_heartbeat
from stream_jobs.runtime.host import WorkerHost, process_services
from stream_jobs.runtime.reports import WorkerReport
from stream_jobs.runtime.throttle import RateInForce, RateOverride, publish_rate
from stream_jobs.runtime.worker import Worker
from stream_jobs.settings import Settings
from stream_jobs.tools.stats import collect
from stream_jobs.tools.type_stats import TypeStats
from tests.integration.cli_env import settings_env
from tests.integration.test_worker_host import free_port
from tests.waiting import until

from .conftest import Declare
from .topic_reader import read_topic

REPO = Path(__file__).resolve().parents[2]
STREAM_JOBS = Path(sys.executable).with_name("stream-jobs")




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
    return settings_env(settings)


async def type_stats(settings: Settings, job_type: str, **options: Any) -> TypeStats:
    shot = await collect(settings, load_job_types(settings.topics_dir), job_type=job_type,
                         **options)
    return shot.types[0]


async def command(settings: Settings, *args: str, timeout_s: float = 60) -> tuple[float, str]:
    """Run `stream-jobs ARGS` as the operator would: (wall-clock second it was started,
    its stdout). Fails the test unless it exits 0."""
    started = time.time()
    proc = await asyncio.create_subprocess_exec(
        str(STREAM_JOBS), *args, cwd=REPO, env=env_of(settings),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, (args, out.decode(), err.decode())
    return started, out.decode()


@pytest.fixture
def worker_processes(settings: Settings, tmp_path: Path
                     ) -> Iterator[Callable[[str, str], subprocess.Popen[bytes]]]:
    """Start `stream-jobs worker APP --type TYPE` processes; all are killed at the end."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(app_spec: str, job_type: str) -> subprocess.Popen[bytes]:
        with (tmp_path / f"worker-{len(procs)}.log").open("wb") as log:
            proc = subprocess.Popen(
                [str(STREAM_JOBS), "worker", app_spec, "--type", job_type],
                cwd=REPO, env=env_of(settings), stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()  # SIGKILL ends a stopped process too
        proc.wait(timeout=10)


def pid_of(report: WorkerReport) -> int:
    return int(report.worker_id.split("-")[-2])  # host-PID-random


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


# -- 2. rate limit across worker processes, changed at run time --------------------------


@pytest.fixture
async def starts_table(settings: Settings, schema: str) -> AsyncIterator[Any]:
    """A connection to this test's schema, which holds the `starts` table that
    tests/apps/paced.py writes a row to per job started."""
    conn = await asyncpg.connect(settings.database_url, server_settings={"search_path": schema})
    try:
        await conn.execute("CREATE TABLE starts (job_id text, pid int, part int, "
                           "at double precision)")
        yield conn
    finally:
        await conn.close()


async def worker_reports(settings: Settings) -> list[WorkerReport]:
    """Every report the workers published to `P._stats`, oldest first."""
    records = await read_topic(settings, stats_topic(settings.topic_prefix))
    reports = (WorkerReport.from_json(record.value) for record in records)
    return sorted((r for r in reports if r is not None), key=lambda r: r.at_ms)


async def applied_at(settings: Settings, pids: set[int], applies: Callable[[WorkerReport], bool],
                     what: str, *, since_ms: int = 0, timeout_s: float = 15) -> float:
    """The wall-clock second by which every process in `pids` reported what `applies`
    checks: over the processes, the latest of each one's first such report after
    `since_ms`. Workers with heartbeats on report 4 times an interval, so with a 1 s
    interval this is at most a quarter second after the fact."""
    first: dict[int, int] = {}

    async def all_reported() -> bool:
        first.clear()
        for report in await worker_reports(settings):
            pid = pid_of(report)
            if (pid in pids and pid not in first and report.at_ms >= since_ms
                    and applies(report)):
                first[pid] = report.at_ms
        return set(first) == pids

    await until(all_reported, what, within_s=timeout_s)
    return max(first.values()) / 1000


async def starts_in(db: Any, since: float, before: float) -> list[Any]:
    return list(await db.fetch("SELECT pid, part FROM starts WHERE at >= $1 AND at < $2",
                               since, before))


async def recorded_past(db: Any, pids: set[int], at: float) -> None:
    """Wait until every process has a start after `at` in the table: its starts up to
    `at` are then there too (a handler's insert takes milliseconds, not half a second)."""
    async def both() -> bool:
        rows = await db.fetch("SELECT DISTINCT pid FROM starts WHERE at >= $1", at)
        return {r["pid"] for r in rows} >= pids

    await until(both, f"starts after {at:.1f} recorded by both processes", within_s=15)


async def last_control_record(settings: Settings) -> Any:
    return (await read_topic(settings, control_topic(settings.topic_prefix)))[-1]


def said(out: str) -> str:
    return " ".join(out.split())  # rich wraps lines at 80 columns in a pipe


async def test_a_rate_limit_holds_across_two_worker_processes_and_throttle_changes_it(
        app: App, declare: Declare, settings: Settings, starts_table: Any,
        worker_processes: Callable[[str, str], subprocess.Popen[bytes]]) -> None:
    window_s = float(os.environ.get("STREAM_JOBS_TEST_RATE_WINDOW_S", "20"))
    rate, new_rate = 50.0, 20.0
    db = starts_table
    # Heartbeats on make each worker report 4 times a second, so P._stats tells within a
    # quarter second when a process applied a new rate. They take no token: the rows
    # counted below are jobs only.
    await declare("rate.capped", partitions=4, retry_tiers=["1s"], rate_limit="50/s",
                  heartbeat_interval="1s")
    # The processes start (seconds, on a loaded box) while the backlog is written. It is
    # more than the limited phases take even when each command takes seconds to start.
    pids = {worker_processes("tests.apps.paced:app", "rate.capped").pid for _ in range(2)}
    backlog = 3200
    async with app.client() as client:
        await client.enqueue_many([Job("rate.capped", {"i": i}) for i in range(backlog)])

    # The window opens once the group has settled: both processes report half the rate,
    # 2 of the 4 partitions each (a process that gained or lost partitions reports another
    # share). Start-up, the first joins and their rebalances stay out of the count, and
    # the extra second covers the first fetch of a partition taken over last.
    settled = await applied_at(
        settings, pids, lambda r: r.rate_share_per_s == rate / 2 and r.rate_source == "toml",
        "both worker processes take half the rate", timeout_s=60)

    # The operator's view four seconds on: `stats --json` shows the limit, both workers
    # applying it with shares that add up to it, and jobs done at about that rate. The
    # command runs before the window opens: its start-up takes a core for seconds.
    await until(lambda: time.time() >= settled + 4, "four seconds at the shared rate")
    _, out = await command(settings, "stats", "rate.capped", "--json", "--window", "4")
    shown = orjson.loads(out)["types"]["rate.capped"]
    assert shown["rate_limit"] == {"per_s": rate, "source": "toml", "workers_applying": 2,
                                   "share_per_s": rate}, shown
    assert shown["workers"]["alive"] == 2, shown["workers"]
    assert abs(shown["rates"]["per_s"]["done"] - rate) <= 0.25 * rate, shown["rates"]

    t0 = time.time() + 1.0
    t_end = t0 + window_s
    await until(lambda: time.time() >= t_end, "the measurement window", within_s=window_s + 5)
    await recorded_past(db, pids, t_end + 0.5)
    rows = await starts_in(db, t0, t_end)
    per_process = {pid: sum(1 for r in rows if r["pid"] == pid) for pid in pids}
    # The limit is a ceiling: the group starts at most 10% over it. It falls short only
    # when a loaded box stalls a worker for longer than its bucket saves (a quarter
    # second of its share); CI measured 897 of 1,000 once. Half the shares would be 500.
    assert 0.85 * rate * window_s <= len(rows) <= 1.1 * rate * window_s, (len(rows),
                                                                          per_process)
    # Each process spent about its half, and every partition still had jobs waiting at
    # the end: the limit set the pace, not the backlog.
    assert all(0.4 * len(rows) <= n <= 0.6 * len(rows) for n in per_process.values()), \
        per_process
    tail = await starts_in(db, t_end - 5, t_end)
    assert {r["part"] for r in tail} == {0, 1, 2, 3}

    # `throttle TYPE 20/s` as the operator types it. The command stamps its override with
    # the moment it began, after the interpreter and `stream_jobs.cli`'s imports (1.5 s on
    # a quiet 2-core box, up to 10 s measured at a load of 13); from then every worker
    # applies it within 2 s.
    launched, out = await command(settings, "throttle", "rate.capped", f"{new_rate:g}/s")
    assert f"50/s (toml) -> {new_rate:g}/s (throttle)" in said(out), out
    override = RateOverride.from_json((await last_control_record(settings)).value)
    assert override is not None
    assert (override.rate_limit_per_s, override.by) == (new_rate, "throttle")
    began = override.at_ms / 1000
    assert launched <= began
    applied = await applied_at(
        settings, pids, lambda r: (r.rate_limit_per_s, r.rate_source) == (new_rate, "throttle"),
        "both processes apply the throttle", since_ms=override.at_ms)
    assert applied - began <= 2.0, {"start-up": began - launched, "applied": applied - began}
    await recorded_past(db, pids, applied + 2.5)
    after = await starts_in(db, applied, applied + 2.0)
    assert abs(len(after) - new_rate * 2.0) <= 0.25 * new_rate * 2.0, len(after)
    limit = (await type_stats(settings, "rate.capped", window_s=5)).to_dict(
        per_partition=False)["rate_limit"]
    assert limit == {"per_s": new_rate, "source": "throttle", "workers_applying": 2,
                     "share_per_s": new_rate}, limit

    # `--reset` writes a tombstone: the workers go back to the TOML's rate.
    _, out = await command(settings, "throttle", "rate.capped", "--reset")
    assert f"{new_rate:g}/s (throttle) -> 50/s (toml)" in said(out), out
    tombstone = await last_control_record(settings)
    assert tombstone.value is None
    applied = await applied_at(
        settings, pids, lambda r: (r.rate_limit_per_s, r.rate_source) == (rate, "toml"),
        "both processes go back to the TOML's rate", since_ms=tombstone.timestamp)
    assert applied - tombstone.timestamp / 1000 <= 2.0

    # No limit at all (what `throttle TYPE none` writes; its spelling is a unit test, and
    # one more command start would cost this test seconds): the rest runs as fast as the
    # handlers go.
    lifted_ms = int(time.time() * 1000)
    await publish_rate(settings, "rate.capped", None, at_ms=lifted_ms)
    applied = await applied_at(
        settings, pids, lambda r: (r.rate_limit_per_s, r.rate_source) == (None, "throttle"),
        "both processes lift the limit", since_ms=lifted_ms)
    assert applied - lifted_ms / 1000 <= 2.0

    async def all_started() -> bool:
        return bool(await db.fetchval("SELECT count(DISTINCT job_id) = $1 FROM starts",
                                      backlog))

    await until(all_started, "the rest of the backlog ran", within_s=30)
    left, last = await db.fetchrow("SELECT count(*), max(at) FROM starts WHERE at >= $1",
                                   applied)
    assert left >= 200, left  # enough to measure a pace by
    assert left / (last - applied) >= 2 * rate, (left, last - applied)


async def test_under_a_low_rate_a_backlog_stays_in_kafka_and_its_partitions_pause(
        app: App, declare: Declare, running: Callable[[Worker], asyncio.Task[None]]) -> None:
    rate = 10.0
    await declare("rate.held", partitions=2, retry_tiers=["1s"], rate_limit="10/s")
    started: list[float] = []

    @app.job("rate.held", concurrency=8, ordering="unordered")
    async def run(job: dict[str, Any], ctx: JobContext) -> None:
        started.append(time.monotonic())

    async with app.client() as client:
        await client.enqueue_many([Job("rate.held", {"i": i}) for i in range(3000)])
    worker = app.worker("rate.held", relay=False)
    running(worker)
    await until(lambda: len(started) >= 3, "jobs start")

    # The bound the worker computes from its share: RATE_BUFFER_S seconds of it per
    # partition (at least RATE_BUFFER_MIN). A partition is paused by the fetch that takes
    # it to the bound, so it holds less than the bound plus one fetch.
    assert worker.rate_share_per_s == rate
    assert worker.max_buffered == max(RATE_BUFFER_MIN, math.ceil(rate * RATE_BUFFER_S / 2))
    bound = worker.max_buffered + worker.fetch_records
    tps = sorted(worker.partitions)
    assert len(tps) == 2
    held = dict.fromkeys(tps, 0)  # the most records a partition held (fetched, unfinished)
    paused = dict.fromkeys(tps, 0)  # samples in which it was paused
    samples = 0
    ahead = 0  # the most records fetched but not started, over both partitions
    span_end = time.monotonic() + 2.5

    async def sample() -> bool:
        nonlocal samples, ahead
        samples += 1
        paused_now = worker.consumer.paused()
        for tp in tps:
            work = worker.partitions[tp]
            held[tp] = max(held[tp], work.buffered)
            paused[tp] += work.paused and tp in paused_now
        fetched = sum([await worker.consumer.position(tp) for tp in tps])  # from offset 0
        ahead = max(ahead, fetched - len(started))
        return time.monotonic() >= span_end

    await until(sample, "the sampling span")
    assert all(n < bound for n in held.values()), (held, bound)
    assert ahead < 2 * bound, (ahead, bound)  # of 3,000 waiting: the rest stays in Kafka
    # Fetching is paused most of the time, not just once: at 5 jobs/s per partition a
    # refill lasts seconds and a fetch takes milliseconds.
    assert all(n >= 0.5 * samples for n in paused.values()), (paused, samples)


# -- 3. a paced drain drops what expired --------------------------------------------------


async def test_a_drain_paces_the_backlog_and_expired_jobs_are_counted_not_run(
        app: App, declare: Declare, settings: Settings,
        running: Callable[[Worker], asyncio.Task[None]]) -> None:
    # The TOML gives every job of the type an expiry; a job's own `expires_in` overrides it.
    await declare("drain.backlog", partitions=2, retry_tiers=["1s"], expires_in="1s")
    ran: dict[str, float] = {}

    @app.job("drain.backlog", concurrency=16, ordering="unordered")
    async def run(job: dict[str, Any], ctx: JobContext) -> None:
        ran[ctx.job_id] = time.monotonic()

    async with app.client() as client:
        stale = await client.enqueue_many([Job("drain.backlog", {"i": i}, expires_in=0)
                                           for i in range(300)])
        aged = await client.enqueue_many([Job("drain.backlog", {"i": i})  # the TOML's 1 s
                                          for i in range(200)])
        aged_by = time.time() + 1.0
        fresh = await client.enqueue_many([Job("drain.backlog", {"i": i}, expires_in=3600)
                                           for i in range(100)])
    drain = await asyncio.create_subprocess_exec(
        str(STREAM_JOBS), "drain", "drain.backlog", "--rate", "100/s", "--interval", "0.3",
        "--timeout", "60", cwd=REPO, env=env_of(settings), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        # The worker starts once the pace is set, as after a recovery's `drain --rate`.
        await until(lambda: _rate_of(settings, "drain.backlog", RateInForce(100, "drain")),
                    "drain sets the rate", within_s=90)
        # By then the TOML's expiry has passed for the `aged` jobs (the command takes longer
        # to start than that); waited for all the same, not assumed.
        await until(lambda: time.time() >= aged_by, "the TOML's expiry passes")
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
    assert not set(ran) & (set(stale) | set(aged))
    assert worker.outcomes["expired"] == 500
    spread = max(ran.values()) - min(ran.values())
    assert spread >= 0.7  # 100 jobs at 100/s: about a second, not all at once

    async def expired_counted() -> bool:
        stats = await type_stats(settings, "drain.backlog")
        return stats.rates.counts.expired == 500 and stats.rates.counts.done == 100

    await until(expired_counted, "stats count the expired jobs", within_s=10)


async def _rate_of(settings: Settings, job_type: str, expected: RateInForce) -> bool:
    return (await type_stats(settings, job_type)).rate == expected


# -- 4. heartbeats ---------------------------------------------------------------------------


async def test_a_stopped_workers_partition_is_stuck_within_two_intervals_an_idle_one_is_not(
        declare: Declare, settings: Settings,
        worker_processes: Callable[[str, str], subprocess.Popen[bytes]]) -> None:
    interval_s = 0.5
    await declare("beat.check", partitions=2, retry_tiers=["1s"], heartbeat_interval="500ms")
    stopping, staying = (worker_processes("tests.apps.beats:app", "beat.check")
                         for _ in range(2))
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
                owner[partition] = pid_of(report)
        return (len(stats.workers) == 2 and sorted(owner) == [0, 1]
                and set(owner.values()) == {stopping.pid, staying.pid}
                and set(states.values()) == {"idle"})

    await until(both_idle_one_partition_each,
                "two workers, one partition each, heartbeats on time", within_s=45)
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

    await until(flagged, "the stopped worker's partition is reported stuck", within_s=10)
    # Its newest heartbeat was written before the stop, so every snapshot taken more than
    # 2 intervals after the stop must say stuck (100 ms: the signal's own delivery). How
    # soon the test sees it also depends on how long one `stats` call takes here.
    assert all(after_ms <= 2 * interval_s * 1000 + 100 for after_ms in on_time_at), on_time_at
    stopping.kill()


async def test_heartbeats_pass_through_every_partition_of_every_lane(
        app: App, declare: Declare, settings: Settings,
        running: Callable[[Worker], asyncio.Task[None]]) -> None:
    interval_ms = 500
    policy = await declare("beat.lanes", partitions=2, retry_tiers=["1s"],
                           priorities=["high", "default", "low"], heartbeat_interval="500ms")

    @app.job("beat.lanes")
    async def run(job: dict[str, Any], ctx: JobContext) -> None:
        pytest.fail("no job was enqueued: only heartbeats pass through the lanes")

    lanes = list(policy.lane_topics(settings.topic_prefix).values())
    every = {TopicPartition(topic, p) for topic in lanes for p in (0, 1)}
    assert len(every) == 6
    begun_ms = int(time.time() * 1000)
    worker = app.worker("beat.lanes", relay=False)
    running(worker)
    await until(lambda: set(worker.heartbeats) == every,
                "the worker processed a heartbeat in every lane partition")
    assert min(worker.heartbeats.values()) >= begun_ms
    first = dict(worker.heartbeats)
    await until(lambda: all(worker.heartbeats[tp] >= first[tp] + interval_ms * 0.8
                            for tp in every), "and the next round an interval later",
                within_s=10)

    # In Kafka: every partition of every lane holds this worker's heartbeats, nothing else.
    for topic in lanes:
        records = await read_topic(settings, topic)
        assert all(is_heartbeat(r.key, r.headers) for r in records), topic
        senders = {(r.partition, orjson.loads(r.value)["heartbeat"]) for r in records}
        assert senders == {(0, worker.worker_id), (1, worker.worker_id)}, (topic, senders)

    # And `stats` sees all six on time: idle, none stuck, none unknown.
    async def all_idle() -> bool:
        beats = (await type_stats(settings, "beat.lanes", window_s=5)).heartbeats
        assert beats is not None
        return {(b.topic, b.partition): b.state for b in beats.partitions} == {
            (tp.topic, tp.partition): "idle" for tp in every}

    await until(all_idle, "stats show every lane partition idle", within_s=10)


# -- 5. isolation ----------------------------------------------------------------------------


@pytest.mark.parametrize("together", ["two-workers", "one-host"])
async def test_a_slow_type_leaves_the_other_types_throughput_and_latency_alone(
        app: App, declare: Declare, running: Callable[[Worker], asyncio.Task[None]],
        settings: Settings, together: str) -> None:
    """Both types share one process and one event loop, a harder case than two
    processes on one machine: the slow type holds 64 jobs of 1 s each throughout.
    `two-workers` starts the slow type's worker beside the running fast one;
    `one-host` runs both in one `WorkerHost`, as `stream-jobs worker APP` does (with its
    metrics service), after measuring the fast type alone in a host of its own."""
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
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))  # pacing the offer
        await until(lambda: len(latencies) >= sent + batches * (per_s // 10),
                    "the fast jobs ran", within_s=20)
        phase = [lat for _, lat in latencies[sent:]]
        return len(phase) / (time.monotonic() - begin), statistics.quantiles(phase, n=20)[-1]

    async def backlog(client: Any, jobs: int) -> float:
        """Enqueue a backlog at once: jobs/s from the enqueue to the last start."""
        sent = len(latencies)
        begin = time.monotonic()
        await client.enqueue_many([Job("iso.fast", {"n": n}) for n in range(jobs)])
        await until(lambda: len(latencies) >= sent + jobs, "the backlog ran", within_s=30)
        return jobs / (latencies[-1][0] - begin)

    hosts: list[tuple[WorkerHost, asyncio.Task[None]]] = []

    def host_of(*job_types: str) -> None:
        workers = [app.worker(t, relay=False) for t in job_types]
        host = WorkerHost(workers, services=process_services(
            settings.model_copy(update={"metrics_port": free_port()}), workers))
        hosts.append((host, asyncio.create_task(host.run())))

    async def stop_hosts() -> None:
        while hosts:
            host, task = hosts.pop()
            host.request_stop()
            await task

    try:
        async with app.client() as client:
            await client.enqueue_many([Job("iso.slow", {"i": i}) for i in range(400)])
            if together == "one-host":
                host_of("iso.fast")
            else:
                running(app.worker("iso.fast", relay=False))
            await client.enqueue("iso.fast", {"n": -1})
            await until(lambda: len(latencies) == 1, "the fast worker runs")
            await steady(client, 100, 1.0)  # warm-up: connections, first fetches

            alone = (*await steady(client, 100, 2.0), await backlog(client, 3000))
            if together == "one-host":
                await stop_hosts()
                host_of("iso.fast", "iso.slow")
            else:
                running(app.worker("iso.slow", relay=False))
            await until(lambda: slow_running == 64, "the slow type fills its concurrency")
            await steady(client, 100, 1.0)  # the same warm-up: the slow worker just started
            beside = (*await steady(client, 100, 2.0), await backlog(client, 3000))
            assert slow_running == 64  # still saturated: the comparison was under load
    finally:
        await stop_hosts()

    (rate_alone, p95_alone, most_alone), (rate_beside, p95_beside, most_beside) = alone, beside
    assert rate_beside >= 0.9 * rate_alone, (alone, beside)  # keeps up with what is offered
    assert p95_beside <= max(3 * p95_alone, p95_alone + 0.25), (alone, beside)
    # A backlog drains about as fast (bound loose: other work on this 2-core box moves it).
    assert most_beside >= 0.25 * most_alone, (alone, beside)
