"""`stream-jobs enqueue` as an operator runs it: the job ID printed, the record where the
options say (lane or delay tier), with the key, run-at and expiry in its headers."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from stream_jobs.job_ids import job_id_time_ms
from stream_jobs.naming import lane_topic, tier_topic
from stream_jobs.record import JobRecord, decode_record
from stream_jobs.settings import Settings

from .conftest import Declare
from .topic_reader import read_topic

CLI = str(Path(sys.executable).with_name("stream-jobs"))
TYPE = "cli.enqueue"


async def _enqueue(settings: Settings, *args: str) -> str:
    """Run `stream-jobs enqueue TYPE ARGS`; the one line it prints (the job ID)."""
    env = {**os.environ,
           "STREAM_JOBS_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
           "STREAM_JOBS_DATABASE_URL": settings.database_url,
           "STREAM_JOBS_TOPIC_PREFIX": settings.topic_prefix,
           "STREAM_JOBS_TOPICS_DIR": str(settings.topics_dir)}
    proc = await asyncio.create_subprocess_exec(
        CLI, "enqueue", TYPE, *args, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert err == b""
    lines = out.decode().splitlines()
    assert len(lines) == 1, out
    return lines[0]


def _only(records: list[Any]) -> tuple[Any, JobRecord]:
    assert len(records) == 1, records
    record = records[0]
    return record, decode_record(key=record.key, value=record.value, headers=record.headers,
                                 expected_type=TYPE, max_payload_bytes=10**6)


async def test_enqueue_prints_the_job_id_and_writes_the_record_where_the_options_say(
        declare: Declare, settings: Settings) -> None:
    await declare(TYPE, partitions=3, priorities=["high", "default"],
                  retry_tiers=["5s", "1m", "10m"])
    before_ms = int(time.time() * 1000)
    delayed_id, high_id, plain_id = await asyncio.gather(
        _enqueue(settings, '{"to": "a@b.c"}', "--key", "user-42", "--priority", "high",
                 "--delay", "90s", "--expires-in", "1h"),
        _enqueue(settings, '{"n": 1}', "--priority", "high", "--expires-in", "30m",
                 "--job-id", "order-7"),
        _enqueue(settings, "{}"))
    after_ms = int(time.time() * 1000)
    prefix = settings.topic_prefix

    # A delay of 90 s waits in the largest tier not longer than it, for the high lane.
    raw, delayed = _only(await read_topic(settings, tier_topic(prefix, TYPE, "1m")))
    assert delayed.job_id == delayed_id
    assert job_id_time_ms(delayed_id) is not None  # a time-ordered ID was made for it
    assert raw.key == b"user-42"
    assert (delayed.lane, delayed.attempt) == ("high", 1)
    assert orjson.loads(delayed.payload) == {"to": "a@b.c"}
    assert delayed.not_before_ms is not None
    assert delayed.expires_at_ms is not None
    assert before_ms + 90_000 <= delayed.not_before_ms <= after_ms + 90_000
    assert before_ms + 3_600_000 <= delayed.expires_at_ms <= after_ms + 3_600_000

    raw, high = _only(await read_topic(settings, lane_topic(prefix, TYPE, "high")))
    assert (high_id, high.job_id, raw.key) == ("order-7", "order-7", b"order-7")
    assert high.not_before_ms is None
    assert high.expires_at_ms is not None
    assert before_ms + 1_800_000 <= high.expires_at_ms <= after_ms + 1_800_000

    raw, plain = _only(await read_topic(settings, lane_topic(prefix, TYPE)))
    assert (plain.job_id, raw.key) == (plain_id, plain_id.encode())  # the key: the job ID
    assert (plain.lane, plain.not_before_ms, plain.expires_at_ms) == ("default", None, None)
    for tier in ("5s", "10m"):
        assert await read_topic(settings, tier_topic(prefix, TYPE, tier)) == []
