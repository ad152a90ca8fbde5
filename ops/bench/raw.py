"""Raw aiokafka, with what our client and worker would add taken away.

The producer has JobProducer's settings (acks=all, idempotent, same linger and batch
size) and sends records of the same bytes (payload, key, headers of the same sizes),
pipelining `send()` and then awaiting every future. The consumer is a bare
`getmany(max_records=500)` loop that commits after each batch and counts records.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

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
