"""Read a whole topic as it is now (no consumer group), for assertions."""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer

from stream_jobs.kafka import TopicPartition
from stream_jobs.settings import Settings


async def read_topic(settings: Settings, topic: str) -> list[Any]:
    """Every record of `topic` up to its current end, in partition then offset order."""
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap,
                                enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        partitions = consumer.partitions_for_topic(topic)
        if partitions is None:
            await consumer._client.force_metadata_update()
            partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        if not tps:
            return []
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        await consumer.seek_to_beginning(*tps)
        records: list[Any] = []
        remaining = {tp for tp in tps if ends[tp] > 0}
        while remaining:
            batches = await consumer.getmany(*remaining, timeout_ms=5_000)
            if not batches:
                raise AssertionError(f"{topic}: no records within 5 s before its end")
            for tp, batch in batches.items():
                records.extend(r for r in batch if r.offset < ends[tp])
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        await consumer.stop()
