"""Raw aiokafka, with what our client and worker would add taken away.

The producer has JobProducer's settings (acks=all, idempotent, same linger and batch
size) and sends records of the same bytes (payload, key, headers of the same sizes),
pipelining `send()` and then awaiting every future. Two consume loops count records:

- `raw_consume`, the plain loop: a bare `getmany(max_records=500)` that commits after
  each batch (the exactly-once goals' denominator).
- `raw_consume_strong`, the strongest loop this box runs (issue 29 §3, the no-op goals'
  denominator): on uvloop (`common.run_async`, as the worker), committing on the
  worker's 0.5 s cadence rather than after every batch, with the fetch settings
  (STRONG_FETCH) that drained fastest of those tried here.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from dataclasses import dataclass

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.abc import ConsumerRebalanceListener

from ops.bench.backlog import payload
from ops.bench.common import FETCH_RECORDS, BenchError
from stream_jobs.client import Job, JobClient
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.kafka.connection import kafka_client_kwargs
from stream_jobs.record import JobRecord
from stream_jobs.settings import Settings


def typical_record(settings: Settings) -> JobRecord:
    """The record our client makes for one bench job (no I/O)."""
    client = JobClient(settings, {"bench.shape": JobTypePolicy("bench.shape")})
    return client.prepare(Job("bench.shape", payload(123_456)))[1]


def record_bytes(record: JobRecord) -> int:
    """Value, key and header bytes of a record: what ProducerPerformance is given per record."""
    headers = sum(len(k) + len(v) for k, v in record.headers())
    return len(record.payload) + len(record.key or b"") + headers


def producer(settings: Settings) -> AIOKafkaProducer:
    """An AIOKafkaProducer with JobProducer's settings."""
    return AIOKafkaProducer(
        **kafka_client_kwargs(settings), acks="all", enable_idempotence=True,
        linger_ms=settings.producer_linger_ms,
        max_batch_size=min(settings.producer_max_batch_bytes, 16 * 1024 * 1024),
        max_request_size=settings.max_payload_bytes + 64 * 1024)


async def raw_produce(settings: Settings, topic: str, n: int) -> float:
    """Records per second: `n` sends pipelined, from the first send to the last ack."""
    shape = typical_record(settings)
    value = orjson.dumps(payload(123_456))
    fixed = [h for h in shape.headers() if h[0] != "sj-job-id"]
    id_width = len(shape.job_id)
    client = producer(settings)
    await client.start()
    try:
        began = time.perf_counter()
        futures: list[Awaitable[object]] = []
        for i in range(n):
            job_id = b"%0*d" % (id_width, i)
            futures.append(await client.send(topic, value=value, key=job_id,
                                             headers=[("sj-job-id", job_id), *fixed]))
        for future in futures:
            await future
        return n / (time.perf_counter() - began)
    finally:
        await client.stop()


async def raw_consume(settings: Settings, topic: str, n: int, group: str,
                      timeout_s: float = 300.0) -> float:
    """Records per second of a getmany + commit-per-batch loop, first batch to the n-th record."""
    consumer = AIOKafkaConsumer(
        topic, **kafka_client_kwargs(settings), group_id=group, enable_auto_commit=False,
        auto_offset_reset="earliest", max_partition_fetch_bytes=settings.max_payload_bytes * 2)
    await consumer.start()
    try:
        deadline = time.monotonic() + timeout_s
        count = 0
        began = 0.0
        while count < n:
            if time.monotonic() > deadline:
                raise BenchError(f"raw consumer read {count} of {n} in {timeout_s:.0f} s")
            batches = await consumer.getmany(timeout_ms=1000, max_records=FETCH_RECORDS)
            got = sum(len(records) for records in batches.values())
            if not got:
                continue
            if count == 0:
                began = time.perf_counter()
            count += got
            await consumer.commit()
        return n / (time.perf_counter() - began)
    finally:
        await consumer.stop()


@dataclass(frozen=True)
class Fetch:
    """How a raw consume loop fetches: what the strongest loop tunes."""

    max_partition_fetch_bytes: int
    fetch_max_bytes: int
    fetch_max_wait_ms: int
    max_records: int | None  # per getmany; None: all that is buffered
    check_crcs: bool = True


# The worker's commit cadence (`commit_interval_s`, stream_jobs.runtime.member).
COMMIT_INTERVAL_S = 0.5
# Settings tried on this box (2026-12-07, load 0.6): 100,000 records of the processing
# backlog, each drained 3 times interleaved (uvloop, a commit every 0.5 s, timed from the
# assignment), medians in records/s. The plain loop (`raw_consume`) did 257,000 beside
# them (from its first batch). Smaller batches drained faster: getmany hands back to the
# loop sooner, so the fetcher's next requests go out while the batch is counted.
FETCH_TRIED = {
    "worker's buffers, 500 a batch": Fetch(  # 354,000
        256 * 1024, 4 * 1024 * 1024, 500, FETCH_RECORDS),
    "aiokafka defaults, 100 a batch": Fetch(  # 600,000
        1024 * 1024, 50 * 1024 * 1024, 500, 100),
    "aiokafka defaults, 200 a batch": Fetch(  # 588,000
        1024 * 1024, 50 * 1024 * 1024, 500, 200),
    "aiokafka defaults, 500 a batch": Fetch(  # 393,000
        1024 * 1024, 50 * 1024 * 1024, 500, FETCH_RECORDS),
    "aiokafka defaults, all buffered": Fetch(  # 220,000
        1024 * 1024, 50 * 1024 * 1024, 500, None),
    "4 MiB a partition, 200 a batch, no CRC check": Fetch(  # 555,000
        4 * 1024 * 1024, 64 * 1024 * 1024, 500, 200, check_crcs=False),
    "256 KiB a partition, 200 a batch, no CRC check": Fetch(  # 570,000
        256 * 1024, 4 * 1024 * 1024, 500, 200, check_crcs=False),
    "aiokafka defaults, 200 a batch, no CRC check": Fetch(  # 687,000
        1024 * 1024, 50 * 1024 * 1024, 500, 200, check_crcs=False),
}
# The fastest with CRC checks on (100 a batch is within noise of it): the worker verifies
# every batch's CRC, and a ceiling that skips it (about 15% faster here) would not notice
# a corrupt record.
STRONG_NAME = "aiokafka defaults, 200 a batch"
STRONG_FETCH = FETCH_TRIED[STRONG_NAME]


class _Stamp(ConsumerRebalanceListener):  # type: ignore[misc]
    """Stamps when the group gave the consumer its partitions: fetching starts then."""

    def __init__(self) -> None:
        self.assigned_at = 0.0

    async def on_partitions_revoked(self, revoked: object) -> None:
        pass

    async def on_partitions_assigned(self, assigned: object) -> None:
        self.assigned_at = time.perf_counter()


async def raw_consume_strong(settings: Settings, topic: str, n: int, group: str,
                             fetch: Fetch = STRONG_FETCH, timeout_s: float = 300.0) -> float:
    """Records per second of the strongest raw loop: getmany with `fetch`'s settings,
    a commit every COMMIT_INTERVAL_S (and one at the end, untimed); from the partitions'
    assignment to the n-th record. Not from the first batch, as the plain loop: by then
    the consumer has fetched up to `max_partition_fetch_bytes` of every partition, and
    large buffers would look fast by leaving their fetches out of the time."""
    consumer = AIOKafkaConsumer(
        **kafka_client_kwargs(settings), group_id=group, enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=fetch.max_partition_fetch_bytes,
        fetch_max_bytes=fetch.fetch_max_bytes, fetch_max_wait_ms=fetch.fetch_max_wait_ms,
        check_crcs=fetch.check_crcs)
    stamp = _Stamp()
    consumer.subscribe(topics=[topic], listener=stamp)
    await consumer.start()
    try:
        deadline = time.monotonic() + timeout_s
        count = 0
        last_commit = time.perf_counter()
        while count < n:
            if time.monotonic() > deadline:
                raise BenchError(f"raw consumer read {count} of {n} in {timeout_s:.0f} s")
            batches = await consumer.getmany(timeout_ms=1000, max_records=fetch.max_records)
            count += sum(len(records) for records in batches.values())
            now = time.perf_counter()
            if count and now - last_commit >= COMMIT_INTERVAL_S:
                await consumer.commit()
                last_commit = now
        rate = n / (time.perf_counter() - stamp.assigned_at)
        await consumer.commit()
        return rate
    finally:
        await consumer.stop()
