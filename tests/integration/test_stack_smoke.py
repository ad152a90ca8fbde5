"""The real broker and database answer: produce/consume round trip and a Postgres query."""

from __future__ import annotations

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from stream_jobs.settings import Settings


async def test_idempotent_produce_is_consumed_back(settings: Settings) -> None:
    topic = f"{settings.topic_prefix}.smoke"
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    finally:
        await admin.close()

    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap, acks="all", enable_idempotence=True
    )
    await producer.start()
    try:
        sent = [await producer.send_and_wait(topic, f"v{i}".encode(), key=f"k{i}".encode())
                for i in range(10)]
    finally:
        await producer.stop()
    assert all(meta.offset >= 0 for meta in sent)

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=f"{settings.topic_prefix}.smoke",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    seen: set[bytes] = set()
    try:
        while len(seen) < 10:
            batches = await consumer.getmany(timeout_ms=10_000)
            assert batches, "the broker returned nothing within 10 s"
            for records in batches.values():
                seen.update(r.value for r in records if r.value is not None)
    finally:
        await consumer.stop()
    assert seen == {f"v{i}".encode() for i in range(10)}


async def test_postgres_answers_a_query(settings: Settings) -> None:
    conn = await asyncpg.connect(settings.database_url)
    try:
        version = await conn.fetchval("SHOW server_version_num")
        assert int(version) >= 150000
        assert await conn.fetchval("SELECT 40 + 2") == 42
    finally:
        await conn.close()
