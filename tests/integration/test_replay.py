"""Replay and consumer-group offset resets against the real broker and database.

The handler writes its effect through `ctx.once()` and, inside the same block, counts the
run in a separate table through its own connection: a job acknowledged as a duplicate
never enters the block, so `runs` counts exactly the runs of handler bodies.
Nothing waits by sleeping: every wait polls a condition against a deadline.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from stream_jobs.app import App
from stream_jobs.client import Job
from stream_jobs.context import JobContext
from stream_jobs.errors import ConfigError, GroupInUse, UnknownJobType
from stream_jobs.failures import FailureInfo
from stream_jobs.job_ids import new_job_id
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.admin import admin_client
from stream_jobs.kafka.producer import JobProducer
from stream_jobs.naming import dlq_group, dlq_topic, lane_topic, worker_group
from stream_jobs.record import (
    HEADER_ATTEMPT,
    HEADER_ERROR,
    HEADER_JOB_ID,
    HEADER_NOT_BEFORE,
    HEADER_RERUN_OF,
    JobRecord,
)
from stream_jobs.runtime.worker import Worker
from stream_jobs.settings import Settings
from stream_jobs.tools.group_offsets import reset_offsets
from stream_jobs.tools.replay import replay
from tests.waiting import until

from .conftest import Declare
from .topic_reader import read_topic

TYPE = "replay.work"
JOBS = 30
STREAM_JOBS = Path(sys.executable).with_name("stream-jobs")


@dataclass
class Ran:
    """The first run of JOBS jobs: the original IDs and the lane's ends afterwards."""

    app: App
    db: Any
    ids: list[str]
    lane: str
    ends: dict[int, int]

    async def count(self, table: str) -> int:
        return int(await self.db.fetchval(f"SELECT count(*) FROM {table}"))

    async def effect_ids(self) -> set[str]:
        return {r["job_id"] for r in await self.db.fetch("SELECT job_id FROM effects")}

    def busiest(self) -> int:
        """The partition holding the most records (a range there has some length)."""
        return max(self.ends, key=lambda p: self.ends[p])


@pytest.fixture
async def db(settings: Settings, schema: str) -> AsyncIterator[Any]:
    conn = await asyncpg.connect(settings.database_url, server_settings={"search_path": schema})
    await conn.execute("CREATE TABLE effects (job_id text NOT NULL, n int NOT NULL)")
    await conn.execute("CREATE TABLE runs (job_id text NOT NULL)")
    yield conn
    await conn.close()


@pytest.fixture
async def ran(app: App, declare: Declare, settings: Settings, db: Any) -> AsyncIterator[Ran]:
    await declare(TYPE, partitions=2, priorities=["high", "default"])
    runs = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=4,
                                     server_settings={"search_path": settings.database_schema})

    @app.job(TYPE, concurrency=8)
    async def work(job: dict[str, int], ctx: JobContext) -> None:
        async with ctx.once() as tx:
            await tx.execute("INSERT INTO effects VALUES ($1, $2)", ctx.job_id, job["n"])
            await runs.execute("INSERT INTO runs VALUES ($1)", ctx.job_id)

    async with app.client() as client:
        ids = await client.enqueue_many(
            [Job(TYPE, {"n": i}, key=f"k{i}") for i in range(JOBS)])
    worker = app.worker(TYPE)
    await worker.run(until_idle=True)
    assert worker.outcomes["succeeded"] == JOBS
    lane = lane_topic(settings.topic_prefix, TYPE)
    try:
        yield Ran(app, db, ids, lane, await end_offsets(settings, lane))
    finally:
        await runs.close()


async def end_offsets(settings: Settings, topic: str) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap)
    await consumer.start()
    try:
        partitions = consumer.partitions_for_topic(topic)
        if partitions is None:
            await consumer._client.force_metadata_update()
            partitions = consumer.partitions_for_topic(topic) or set()
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in partitions])
        return {tp.partition: offset for tp, offset in ends.items()}
    finally:
        await consumer.stop()


def header(record: Any, name: str) -> bytes | None:
    found = [value for key, value in record.headers if key == name]
    return found[-1] if found else None


def text(record: Any, name: str) -> str | None:
    value = header(record, name)
    return None if value is None else value.decode()


async def test_replay_without_rerun_runs_nothing_again(ran: Ran, settings: Settings) -> None:
    partition = ran.busiest()
    last = min(ran.ends[partition] - 1, 5)
    size = last - 1 + 1  # offsets 1..last

    planned = await replay(settings, ran.lane, partition=partition, from_offset=1,
                           to_offset=last, dry_run=True)
    assert planned.planned == planned.read == planned.written == size
    assert planned.counts == {(partition, TYPE, ran.lane): size}
    assert await end_offsets(settings, ran.lane) == ran.ends  # the dry run wrote nothing

    result = await replay(settings, ran.lane, partition=partition, from_offset=1, to_offset=last)
    assert result.written == size
    assert result.skipped_total == 0
    assert result.resume_offsets() == {}
    after = await end_offsets(settings, ran.lane)
    assert sum(after.values()) == sum(ran.ends.values()) + size

    worker = ran.app.worker(TYPE)
    await worker.run(until_idle=True)
    assert worker.outcomes["duplicate"] == size
    assert worker.outcomes["succeeded"] == 0
    assert await ran.count("runs") == JOBS
    assert await ran.count("effects") == JOBS


async def test_rerun_runs_the_range_again_with_lineage(ran: Ran, settings: Settings) -> None:
    partition = ran.busiest()
    last = min(ran.ends[partition] - 1, 4)
    size = last + 1  # offsets 0..last
    source = [r for r in await read_topic(settings, ran.lane)
              if r.partition == partition and r.offset <= last]
    originals = {text(r, HEADER_JOB_ID) for r in source}
    assert len(originals) == size

    result = await replay(settings, ran.lane, partition=partition, from_offset=0,
                          to_offset=last, rerun=True)
    assert result.written == size

    worker = ran.app.worker(TYPE)
    await worker.run(until_idle=True)
    assert worker.outcomes["succeeded"] == size
    assert await ran.count("runs") == JOBS + size
    assert await ran.count("effects") == JOBS + size
    new_ids = await ran.effect_ids() - set(ran.ids)
    assert len(new_ids) == size

    written = [r for r in await read_topic(settings, ran.lane)
               if r.offset >= ran.ends[r.partition]]
    lineage = {text(r, HEADER_JOB_ID): text(r, HEADER_RERUN_OF) for r in written}
    assert set(lineage) == new_ids
    assert set(lineage.values()) == originals


async def test_replay_from_the_dlq_starts_jobs_afresh_and_skips_bad_records(
        app: App, declare: Declare, settings: Settings) -> None:
    await declare(TYPE, partitions=1, priorities=["high", "default"])
    prefix = settings.topic_prefix
    dead = JobRecord(job_id="dead-1", job_type=TYPE, payload=b'{"n": 1}', key=b"k",
                     attempt=4, not_before_ms=int(time.time() * 1000) + 60_000,
                     failure=FailureInfo("max-attempts", "ValueError", "boom", "", 1))
    async with JobProducer(settings) as producer:
        await producer.send(dlq_topic(prefix, TYPE), dead)
        await producer.send_raw(dlq_topic(prefix, TYPE), b"k", b"{not json",
                                [(HEADER_JOB_ID, b"bad-1"), ("sj-type", TYPE.encode())])

    result = await replay(settings, dlq_topic(prefix, TYPE), partition=0, from_offset=0,
                          to_lane=f"{TYPE}:high")
    assert result.written == 1
    assert [(s.partition, s.offset, s.reason) for s in result.skipped] == [(0, 1, "bad-json")]

    [record] = await read_topic(settings, lane_topic(prefix, TYPE, "high"))
    assert header(record, HEADER_JOB_ID) == b"dead-1"
    assert header(record, HEADER_ATTEMPT) == b"1"
    assert header(record, HEADER_ERROR) is None
    assert header(record, HEADER_NOT_BEFORE) is None
    assert record.value == b'{"n": 1}'

    with pytest.raises(ConfigError, match="has no 'low' lane"):
        await replay(settings, dlq_topic(prefix, TYPE), partition=0, from_offset=0,
                     to_lane=f"{TYPE}:low")
    with pytest.raises(UnknownJobType, match=r"Unknown job type 'other\.type'"):
        await replay(settings, dlq_topic(prefix, TYPE), partition=0, from_offset=0,
                     to_lane="other.type")


async def group_members(settings: Settings, group: str) -> int:
    async with admin_client(settings) as admin:
        described = (await admin.describe_consumer_groups([group]))[0].to_object()
    return len(described["groups"][0]["members"])


async def committed(settings: Settings, group: str) -> dict[TopicPartition, int]:
    async with admin_client(settings) as admin:
        offsets = await admin.list_consumer_group_offsets(group)
    return {tp: meta.offset for tp, meta in offsets.items()}




@asynccontextmanager
async def worker_in_group(ran: Ran, settings: Settings, group: str) -> AsyncIterator[Worker]:
    """A worker of the type running, and a member of `group`, for the block's duration."""
    worker = ran.app.worker(TYPE)
    running = asyncio.create_task(worker.run())
    try:
        async def joined() -> bool:
            return await group_members(settings, group) > 0
        await until(joined, "the worker joined its group")
        yield worker
    finally:
        worker.request_stop()
        await running


async def test_offsets_reset_refuses_a_running_group_and_works_once_stopped(
        ran: Ran, settings: Settings) -> None:
    group = worker_group(settings.topic_prefix, TYPE)
    lane_tps = {TopicPartition(ran.lane, p): end for p, end in ran.ends.items()}
    assert await committed(settings, group) == lane_tps

    async with worker_in_group(ran, settings, group):
        with pytest.raises(GroupInUse, match="stop its workers first"):
            await reset_offsets(settings, group, to_earliest=True)
        # --force skips our check; Kafka itself refuses offsets for a group with members.
        with pytest.raises(GroupInUse, match="has active members"):
            await reset_offsets(settings, group, to_earliest=True, force=True)

    async def left() -> bool:
        return await group_members(settings, group) == 0
    await until(left, "the worker left its group")
    assert await committed(settings, group) == lane_tps

    # The group reads both lanes; nothing was ever enqueued (so committed) on `high`.
    high = {TopicPartition(f"{ran.lane}.high", p): None for p in ran.ends}
    planned = await reset_offsets(settings, group, to_earliest=True, dry_run=True)
    assert {(c.tp, c.old, c.new) for c in planned} == {
        (tp, end, 0) for tp, end in {**lane_tps, **high}.items()}
    assert await committed(settings, group) == lane_tps  # the dry run committed nothing

    with pytest.raises(ConfigError, match="out of range"):
        await reset_offsets(settings, group, to_offset=10_000)

    changes = await reset_offsets(settings, group, to_earliest=True)
    assert len(changes) == len(lane_tps) + len(high)
    assert await committed(settings, group) == dict.fromkeys({**lane_tps, **high}, 0)

    # The rewound group delivers every job again; each is acknowledged as a duplicate.
    again = ran.app.worker(TYPE)
    await again.run(until_idle=True)
    assert again.outcomes["duplicate"] == JOBS
    assert await ran.count("runs") == JOBS

    await reset_offsets(settings, group, topic=ran.lane, to_offset=1)
    assert await committed(settings, group) == {**dict.fromkeys(lane_tps, 1),
                                                **dict.fromkeys(high, 0)}
    await reset_offsets(settings, group, to_latest=True)
    assert await committed(settings, group) == {**lane_tps, **dict.fromkeys(high, 0)}


async def run_cli(settings: Settings, *args: str) -> tuple[int, str, str]:
    env = {**os.environ,
           "STREAM_JOBS_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
           "STREAM_JOBS_DATABASE_URL": settings.database_url,
           "STREAM_JOBS_DATABASE_SCHEMA": settings.database_schema,
           "STREAM_JOBS_TOPIC_PREFIX": settings.topic_prefix,
           "STREAM_JOBS_TOPICS_DIR": str(settings.topics_dir),
           "COLUMNS": "200"}
    proc = await asyncio.create_subprocess_exec(
        str(STREAM_JOBS), *args, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_cli_answers_mistakes_with_one_sentence(ran: Ran, settings: Settings) -> None:
    prefix = settings.topic_prefix
    partition = ran.busiest()
    group = worker_group(prefix, TYPE)
    mistakes = {
        "does not exist": ["replay", f"{prefix}.nope", "--partition", "0", "--from-offset", "0"],
        "out of range": ["replay", ran.lane, "--partition", str(partition),
                         "--from-offset", "99999"],
        "is not a time": ["replay", ran.lane, "--from-time", "yesterday-ish"],
        "exactly one target": ["offsets", "reset", group],
    }
    answers = await asyncio.gather(*(run_cli(settings, *args) for args in mistakes.values()))
    for (expected, args), (code, _out, err) in zip(mistakes.items(), answers, strict=True):
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 1, (args, err)
        assert "Traceback" not in err, (args, err)
        assert len(lines) == 1, (args, err)
        assert lines[0].startswith("error:"), (args, err)
        assert expected in lines[0], (args, err)

    plan, reset = await asyncio.gather(
        run_cli(settings, "replay", ran.lane, "--partition", str(partition),
                "--from-offset", "0", "--dry-run"),
        run_cli(settings, "offsets", "reset", group, "--to-earliest", "--dry-run"))
    assert plan[0] == 0, plan
    assert "replay plan" in plan[1]
    assert "nothing will be written" in plan[1]
    assert f"would write {ran.ends[partition]:,} of {ran.ends[partition]:,}" in plan[1]
    assert reset[0] == 0, reset
    assert "nothing committed" in reset[1]
    assert await end_offsets(settings, ran.lane) == ran.ends
    lane_tps = {TopicPartition(ran.lane, p): end for p, end in ran.ends.items()}
    assert await committed(settings, group) == lane_tps


HOUR_MS = 3_600_000


async def _backdated_letters(settings: Settings, hours_ago: int, count: int,
                             first_n: int) -> None:
    """`count` dead letters stamped `hours_ago` hours back, over both DLQ partitions."""
    now = int(time.time() * 1000)
    failure = FailureInfo("max-attempts", "ValueError", "boom", "", now)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(count):
            job = JobRecord(job_id=new_job_id(), job_type=TYPE,
                            payload=orjson.dumps({"n": first_n + i}), key=b"k%d" % i,
                            attempt=4, failure=failure)
            await producer.send_and_wait(
                dlq_topic(settings.topic_prefix, TYPE), job.payload, key=job.key,
                headers=job.headers(), partition=i % 2,
                timestamp_ms=now - hours_ago * HOUR_MS + i)
    finally:
        await producer.stop()


def _one_error(answer: tuple[int, str, str], words: str) -> None:
    code, out, err = answer
    lines = err.strip().splitlines()
    assert code == 1, (out, err)
    assert "Traceback" not in err + out
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    assert words in lines[0], err


async def test_replay_and_offsets_reset_through_the_cli(ran: Ran, settings: Settings) -> None:
    """Ranges by offset (kept IDs, --rerun), by time, paced to another lane, and resets by
    time and of a running group, each through `stream-jobs` as an operator runs it."""
    prefix = settings.topic_prefix
    p = ran.busiest()
    q = next(part for part in ran.ends if part != p)
    assert ran.ends[q] > 0
    kept_last = min(ran.ends[p] - 1, 5)  # offsets 1..kept_last, job IDs kept
    rerun_last = min(ran.ends[q] - 1, 3)  # offsets 0..rerun_last, new IDs
    paced = min(ran.ends[p], 12)  # offsets 0..paced-1 again, to the high lane
    rate_per_s = 10.0
    source = await read_topic(settings, ran.lane)
    by_id = {text(r, HEADER_JOB_ID): orjson.loads(r.value)["n"] for r in source}
    rerun_originals = {text(r, HEADER_JOB_ID) for r in source
                       if r.partition == q and r.offset <= rerun_last}

    # Three eras of dead letters, an hour apart: the time range takes the middle one.
    for hours_ago, first_n in ((3, 100), (2, 200), (1, 300)):
        await _backdated_letters(settings, hours_ago, 4, first_n)
    now = int(time.time() * 1000)
    from_iso = datetime.fromtimestamp((now - 150 * 60_000) / 1000, UTC).isoformat()

    group = worker_group(prefix, TYPE)
    async with worker_in_group(ran, settings, group) as worker:
        kept, rerun, timed, to_high, dlq_reset, refused = await asyncio.gather(
            run_cli(settings, "replay", ran.lane, "--partition", str(p), "--from-offset", "1",
                    "--to-offset", str(kept_last)),
            run_cli(settings, "replay", ran.lane, "--partition", str(q), "--from-offset", "0",
                    "--to-offset", str(rerun_last), "--rerun"),
            run_cli(settings, "replay", dlq_topic(prefix, TYPE), "--from-time", from_iso,
                    "--to-time", "90m"),
            run_cli(settings, "replay", ran.lane, "--partition", str(p), "--from-offset", "0",
                    "--to-offset", str(paced - 1), "--to-lane", f"{TYPE}:high",
                    "--rate", f"{rate_per_s:g}/s"),
            run_cli(settings, "offsets", "reset", dlq_group(prefix, TYPE), "--to-time", "90m"),
            run_cli(settings, "offsets", "reset", group, "--to-earliest"))
    for answer in (kept, rerun, timed, to_high, dlq_reset):
        assert answer[0] == 0, answer
    assert f"wrote {kept_last:,} of {kept_last:,}" in kept[1]
    assert f"wrote {rerun_last + 1:,} of {rerun_last + 1:,}" in rerun[1]
    assert "wrote 4 of 4 records" in timed[1]
    assert f"wrote {paced:,} of {paced:,}" in to_high[1]
    _one_error(refused, "stop its workers first")

    # The DLQ drain group now starts at the first letter of the last hour, per partition.
    dlq_tps = [TopicPartition(dlq_topic(prefix, TYPE), part) for part in ran.ends]
    assert await committed(settings, dlq_group(prefix, TYPE)) == dict.fromkeys(dlq_tps, 4)
    assert "committed 2 offsets" in dlq_reset[1]

    rest = ran.app.worker(TYPE)
    await rest.run(until_idle=True)
    outcomes = {k: worker.outcomes[k] + rest.outcomes[k] for k in ("succeeded", "duplicate")}
    # Kept IDs run nothing again; --rerun and the never-run letters run exactly once each.
    assert outcomes == {"succeeded": rerun_last + 1 + 4, "duplicate": kept_last + paced}
    assert await ran.count("runs") == JOBS + rerun_last + 1 + 4
    rows = await ran.db.fetch("SELECT job_id, n FROM effects")
    new = sorted(r["n"] for r in rows if r["job_id"] not in by_id)
    assert new == sorted([by_id[job_id] for job_id in rerun_originals] + [200, 201, 202, 203])

    written = [r for r in await read_topic(settings, ran.lane)
               if r.offset >= ran.ends[r.partition]]
    lineage = [text(r, HEADER_RERUN_OF) for r in written if header(r, HEADER_RERUN_OF)]
    assert sorted(lineage) == sorted(rerun_originals)

    # --to-lane wrote the range to the high lane, and --rate spread it over time.
    high = await read_topic(settings, lane_topic(prefix, TYPE, "high"))
    assert len(high) == paced
    # From the second record on: the first one's stamp may wait on the lane's metadata.
    stamps = sorted(r.timestamp for r in high)[1:]
    expected_s = (len(stamps) - 1) / rate_per_s
    span_s = (stamps[-1] - stamps[0]) / 1000
    assert 0.9 * expected_s <= span_s <= expected_s + 15, span_s
