"""`stats` and `job` against the real stack: lag, oldest age, tier and DLQ depths, rates
from worker reports, the JSON document scripts read, and where a job is.

Nothing waits by sleeping: every wait polls a condition against a deadline.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer

from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.context import JobContext
from stream_jobs.errors import PermanentError
from stream_jobs.failures import FailureInfo
from stream_jobs.job_ids import new_job_id
from stream_jobs.job_types import JobTypePolicy, load_job_types
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.producer import JobProducer
from stream_jobs.lookup import locate_job
from stream_jobs.naming import dlq_topic, relay_group, tier_topic, worker_group
from stream_jobs.record import JobRecord
from stream_jobs.settings import Settings
from stream_jobs.tools import stats as stats_module
from stream_jobs.tools.stats import collect
from stream_jobs.tools.type_stats import StatsReading, StatsSnapshot, TypeStats
from tests.integration.cli_env import settings_env

from .conftest import Declare

STREAM_JOBS = Path(sys.executable).with_name("stream-jobs")
POLL_S = 0.05


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _until(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(POLL_S)


async def _slow_reading(monkeypatch: pytest.MonkeyPatch, settings: Settings,
                        types: Mapping[str, JobTypePolicy], *, since_ms: int) -> TypeStats:
    """`collect` whose Kafka reading ends 60 s later than it really does."""
    real = stats_module.read

    async def late(*args: Any, **kwargs: Any) -> StatsReading:
        reading = await real(*args, **kwargs)
        return replace(reading, at_ms=reading.at_ms + 60_000)

    with monkeypatch.context() as patch:
        patch.setattr(stats_module, "read", late)
        return _one(await collect(settings, types, job_type="stat.rate", since_ms=since_ms))


async def _commit(settings: Settings, group: str, offsets: dict[TopicPartition, int]) -> None:
    """Commit offsets for `group` as its members would (no member needs to be running)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, group_id=group,
                                enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign(list(offsets))
        await consumer.commit(offsets)
    finally:
        await consumer.stop()


def _env(settings: Settings) -> dict[str, str]:
    return settings_env(settings)


async def _cli(settings: Settings, *commands: list[str]) -> list[subprocess.CompletedProcess[str]]:
    """Run `stream-jobs` once per command, concurrently (each start imports the package)."""

    async def run(args: list[str]) -> subprocess.CompletedProcess[str]:
        proc = await asyncio.create_subprocess_exec(
            str(STREAM_JOBS), *args, env=_env(settings), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        return subprocess.CompletedProcess(args, proc.returncode or 0, out.decode(),
                                           err.decode())

    return list(await asyncio.gather(*(run(c) for c in commands)))


def _default_sigint() -> None:
    # A test run started in the background of a shell ignores SIGINT, and a child inherits
    # that; the watched command must meet Ctrl-C as it does in a terminal.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def _watch(settings: Settings, *args: str, refreshes: int) -> tuple[list[Any], int, str]:
    """`stream-jobs stats ARGS --json --watch`: the first `refreshes` documents, then Ctrl-C;
    returns the documents, the exit code and stderr."""
    proc = await asyncio.create_subprocess_exec(
        str(STREAM_JOBS), "stats", *args, "--json", "--watch", "--interval", "0.2",
        env=_env(settings), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=_default_sigint)
    assert proc.stdout is not None
    assert proc.stderr is not None
    try:
        documents = [orjson.loads(await asyncio.wait_for(proc.stdout.readline(), 60))
                     for _ in range(refreshes)]
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return documents, proc.returncode, err.decode()


def _one(shot: StatsSnapshot) -> TypeStats:
    assert len(shot.types) == 1
    return shot.types[0]


async def test_a_backlog_shows_as_lag_and_the_age_of_its_oldest_job(
        app: App, declare: Declare, settings: Settings) -> None:
    await declare("stat.lag", partitions=3)
    types = load_job_types(settings.topics_dir)
    before_ms = _now_ms()
    async with app.client() as client:
        await client.enqueue_many([Job("stat.lag", {"n": i}) for i in range(30)])
    after_ms = _now_ms()

    shots: list[StatsSnapshot] = []

    async def aged() -> bool:
        shots.append(await collect(settings, types, job_type="stat.lag", per_partition=True))
        age = _one(shots[-1]).oldest_age_s
        return age is not None and age >= 1.5

    await _until(aged, "the oldest job is 1.5 s old")
    shot = shots[-1]
    stats = _one(shot)
    assert stats.lag == 30
    (lane,) = stats.lanes
    assert sum(p.lag for p in lane.partitions) == 30
    assert all(p.committed is None for p in lane.partitions)  # no worker ever ran
    true_oldest_s = ((shot.at_ms - after_ms) / 1000, (shot.at_ms - before_ms) / 1000)
    assert stats.oldest_age_s is not None
    assert true_oldest_s[0] - 1 <= stats.oldest_age_s <= true_oldest_s[1] + 1

    # The worker group finishes all of partition 0 and one job of the busiest other one.
    parts = {p.partition: p for p in lane.partitions}
    other = max((p for p in lane.partitions if p.partition != 0), key=lambda p: p.end)
    await _commit(settings, worker_group(settings.topic_prefix, "stat.lag"), {
        TopicPartition(lane.topic, 0): parts[0].end,
        TopicPartition(lane.topic, other.partition): 1})
    drained = _one(await collect(settings, types, job_type="stat.lag", per_partition=True))
    assert drained.lag == 30 - parts[0].end - 1
    after = {p.partition: p for p in drained.lanes[0].partitions}
    assert (after[0].lag, after[0].oldest_age_s) == (0, None)
    assert after[other.partition].committed == 1
    assert after[other.partition].lag == other.end - 1

    # The JSON document a script reads says the same; an unknown type is one sentence.
    cli_started_ms = _now_ms()
    result, unknown = await _cli(settings, ["stats", "stat.lag", "--json", "--partitions"],
                                 ["stats", "no.such"])
    cli_ended_ms = _now_ms()
    assert result.returncode == 0, result.stderr
    document = orjson.loads(result.stdout)
    typed = document["types"]["stat.lag"]
    assert typed["lag"] == drained.lag
    assert typed["lanes"]["default"]["lag"] == drained.lag
    # Every job left was written between before_ms and after_ms: the oldest one's age at
    # the document's time lies between those two ages, within a second.
    at_ms = document["at_ms"]
    assert cli_started_ms <= at_ms <= cli_ended_ms
    assert (at_ms - after_ms) / 1000 - 1 <= typed["oldest_age_s"] <= (at_ms - before_ms) / 1000 + 1
    assert sum(p["lag"] for p in typed["lanes"]["default"]["partitions"]) == drained.lag
    assert typed["dlq"]["depth"] == 0
    assert typed["missing_topics"] == []

    assert unknown.returncode == 1
    assert unknown.stdout == ""
    lines = unknown.stderr.strip().splitlines()
    assert len(lines) == 1, unknown.stderr
    assert "Unknown job type 'no.such'" in lines[0]


async def test_tier_and_dlq_depths_count_what_waits_there(
        app: App, declare: Declare, settings: Settings) -> None:
    await declare("stat.depth", partitions=2, retry_tiers=["1s", "1h"])
    types = load_job_types(settings.topics_dir)
    prefix = settings.topic_prefix
    now = _now_ms()
    far = now + 3_600_000

    def job(attempt: int, **extra: Any) -> JobRecord:
        return JobRecord(job_id=new_job_id(), job_type="stat.depth", payload=b"{}", key=None,
                         attempt=attempt, enqueued_at_ms=now, **extra)

    failure = FailureInfo("max-attempts", "ValueError", "boom", "", now)
    async with JobProducer(settings) as producer:
        tier_1h = [await producer.send(tier_topic(prefix, "stat.depth", "1h"),
                                       job(3, not_before_ms=far), partition=i % 2)
                   for i in range(5)]
        for _ in range(2):
            await producer.send(tier_topic(prefix, "stat.depth", "1s"), job(2, not_before_ms=far))
        dead = [job(4, failure=failure) for _ in range(4)]
        for record in dead:
            await producer.send(dlq_topic(prefix, "stat.depth"), record)

    stats = _one(await collect(settings, types, job_type="stat.depth"))
    assert {t.name: t.lag for t in stats.tiers} == {"1s": 2, "1h": 5}
    assert stats.dlq_depth == 4
    assert stats.lag == 0
    assert stats.oldest_age_s is None

    # The relay moved on past two of the 1h records of partition 0: three are left.
    await _commit(settings, relay_group(prefix, "stat.depth"),
                  {TopicPartition(tier_1h[0].topic, 0): 2})
    stats = _one(await collect(settings, types, job_type="stat.depth"))
    assert {t.name: t.lag for t in stats.tiers} == {"1s": 2, "1h": 3}

    # A script reads the same depths from `--json`; `--watch` refreshes until Ctrl-C.
    (once,), (watched, code, err) = await asyncio.gather(
        _cli(settings, ["stats", "stat.depth", "--json"]),
        _watch(settings, "stat.depth", refreshes=2))
    assert once.returncode == 0, once.stderr
    for document in (orjson.loads(once.stdout), *watched):
        typed = document["types"]["stat.depth"]
        assert {name: tier["depth"] for name, tier in typed["tiers"].items()} == {"1s": 2, "1h": 3}
        assert typed["dlq"]["depth"] == 4
        assert (typed["lag"], typed["oldest_age_s"]) == (0, None)
    assert watched[0]["at_ms"] < watched[1]["at_ms"]
    assert (code, err) == (0, "")  # Ctrl-C ends the watch cleanly, without a traceback

    # Where are the jobs? The dead letter says why; the waiting one says when.
    found = await locate_job(settings, types, dead[0].job_id, job_type="stat.depth")
    assert found.status == "dead_lettered"
    assert found.last is not None
    assert found.last.failure == failure
    assert found.job_type == "stat.depth"


async def test_rates_and_workers_come_from_the_reports_and_job_finds_each_job(
        app: App, declare: Declare, settings: Settings,
        monkeypatch: pytest.MonkeyPatch) -> None:
    await declare("stat.rate", partitions=3, retry_tiers=["1s"], max_attempts=2)
    types = load_job_types(settings.topics_dir)

    @app.job("stat.rate", concurrency=32)
    async def handle(job: dict[str, str], ctx: JobContext) -> None:
        if job["kind"] == "bad":
            raise PermanentError("this payment can never go through")
        if job["kind"] == "flaky" and ctx.attempt == 1:
            raise RuntimeError("first attempt fails")
        async with ctx.once():
            pass

    jobs = ([Job("stat.rate", {"kind": "ok"}) for _ in range(280)]
            + [Job("stat.rate", {"kind": "flaky"}) for _ in range(10)]
            + [Job("stat.rate", {"kind": "bad"}) for _ in range(10)]
            + [Job("stat.rate", {"kind": "ok"}, expires_in=0) for _ in range(10)])
    async with app.client() as client:
        ids = await client.enqueue_many(jobs)

    since_ms = _now_ms()
    worker = app.worker("stat.rate", report_interval_s=0.2)
    running = asyncio.create_task(worker.run())
    try:
        latest: list[TypeStats] = []

        async def all_reported() -> bool:
            if running.done():
                await running  # surfaces the worker's error
            latest.append(_one(await collect(settings, types, job_type="stat.rate")))
            return latest[-1].rates.counts.total == 320

        await _until(all_reported, "the reports count all 320 outcomes")
        live = latest[-1]
        counts = live.rates.counts
        assert (counts.done, counts.retried, counts.dead_lettered, counts.expired) == (
            290, 10, 10, 10)
        per_s = live.rates.per_s()
        assert per_s["done"] > 0
        assert per_s["done"] == counts.done / live.rates.window_s
        assert [w.worker_id for w in live.workers] == [worker.worker_id]
    finally:
        worker.request_stop()
        await running

    assert worker.outcomes == {"succeeded": 290, "retried": 10, "dead_lettered": 10,
                               "expired": 10}
    stopped = _one(await collect(settings, types, job_type="stat.rate"))
    assert stopped.workers == ()  # its last report was its final one
    assert stopped.rates.counts.total == 320
    assert stopped.lag == 0
    assert stopped.dlq_depth == 10
    assert {t.name: t.lag for t in stopped.tiers} == {"1s": 0}

    # A reading that ends a minute after it began (a loaded machine) still counts all
    # that happened since `since_ms`: the window reaches back from where the reading ends.
    slow = await _slow_reading(monkeypatch, settings, types, since_ms=since_ms)
    assert slow.rates.counts.total == 320
    assert slow.rates.window_s >= 60

    async with app.client() as client:
        waiting = await client.enqueue("stat.rate", {"kind": "ok"})
    ok_id, bad_id, flaky_id = ids[0], ids[290], ids[280]

    done_json, told, unknown, bad_type = await _cli(
        settings, ["job", ok_id, "--json"], ["job", bad_id, "--type", "stat.rate"],
        ["job", new_job_id(), "--json"], ["job", ok_id, "--type", "no.such"])
    done = orjson.loads(done_json.stdout)
    assert (done["status"], done["job_type"], done["attempt"]) == ("done", "stat.rate", 1)
    assert done["finished_at"] is not None

    assert told.returncode == 0, told.stderr
    assert "dead-lettered after attempt 1" in told.stdout
    assert "can never go through" in told.stdout

    assert unknown.returncode == 0, unknown.stderr
    nothing = orjson.loads(unknown.stdout)
    assert (nothing["status"], nothing["sightings"]) == ("not_seen", [])

    assert bad_type.returncode == 1
    assert len(bad_type.stderr.strip().splitlines()) == 1

    letter = await locate_job(settings, types, bad_id, job_type="stat.rate")
    assert letter.status == "dead_lettered"
    assert letter.last is not None
    assert letter.last.failure is not None
    assert letter.last.failure.reason == "permanent"
    assert letter.complete
    retried = await locate_job(settings, types, flaky_id)
    assert (retried.status, retried.attempt) == ("done", 2)
    pending = await locate_job(settings, types, waiting)
    assert pending.status == "pending"
    assert pending.last is not None
    assert pending.last.topic == f"{settings.topic_prefix}.stat.rate"


class _Recorder:
    """A consumer that notes the name of each call it passes on (a `Consumer`)."""

    def __init__(self, consumer: Any, calls: list[str]) -> None:
        self._consumer = consumer
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._consumer, name)
        if callable(found):
            self._calls.append(name)
        return found


# What costs a metadata round once a group-less reader has assigned other topics.
_OFFSET_QUESTIONS = {"beginning_offsets", "end_offsets", "offsets_for_times",
                     "cluster_partitions", "refresh_metadata"}


async def test_every_offset_question_comes_before_the_first_read(
        settings: Settings, declare: Declare, app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked after a read, each one waited for a metadata round (half a second to a second:
    most of what `stats` took). Counted here, not timed."""
    from stream_jobs.runtime.reports import WorkerReport, ensure_stats_topic, publish
    from stream_jobs.runtime.throttle import publish_rate

    await declare("stat.ask", partitions=2)
    async with app.client() as client:
        await client.enqueue("stat.ask", {"n": 1})  # a lagging lane: its oldest is read
    await publish_rate(settings, "stat.ask", 5.0, at_ms=_now_ms())  # makes P._control
    await ensure_stats_topic(settings)
    async with JobProducer(settings) as producer:
        await publish(settings, producer, "w-1", WorkerReport(
            "stat.ask", "w-1", _now_ms(), _now_ms() - 1_000, outcomes={"succeeded": 3}))

    calls: list[str] = []
    real = stats_module._peeker

    def recording(on: Settings) -> Any:
        @asynccontextmanager
        async def opened() -> AsyncIterator[Any]:
            async with real(on) as consumer:
                yield _Recorder(consumer, calls)

        return opened()

    monkeypatch.setattr(stats_module, "_peeker", recording)
    types = load_job_types(settings.topics_dir)
    shot = _one(await collect(settings, types, job_type="stat.ask"))

    first_read = calls.index("assign")
    late = [c for c in calls[first_read:] if c in _OFFSET_QUESTIONS]
    assert not late, f"offset questions after the first read: {calls}"
    # And the reading is whole: the oldest job's age, the report, the throttle.
    assert [lane.oldest_age_s is not None for lane in shot.lanes] == [True]
    assert len(shot.workers) == 1
    assert (shot.rate.per_s, shot.rate.source) == (5.0, "throttle")
