"""`send_many` picks each record's partition itself and sends a partition's share of a call
as record batches of its own when it is large; the records must land where a single
`send` would put them, in the caller's order, at the offsets it reports, also when many
calls run at once."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest
from aiokafka.admin import NewTopic

import stream_jobs.kafka.producer as producer_module
from stream_jobs.job_ids import new_job_id
from stream_jobs.kafka.admin import admin_client
from stream_jobs.kafka.producer import BATCH_QUEUE_WAIT_S, OWN_BATCH_MIN, JobProducer, Written
from stream_jobs.record import JobRecord
from stream_jobs.settings import Settings
from tests.integration.topic_reader import read_topic
from tests.waiting import until


def _job(key: bytes | None, size: int = 8) -> JobRecord:
    return JobRecord(job_id=new_job_id(), job_type="batches.x", payload=b"x" * size, key=key)


async def _topics(settings: Settings, *names: str, partitions: int = 6) -> list[str]:
    topics = [f"{settings.topic_prefix}.{name}" for name in names]
    async with admin_client(settings) as admin:
        await admin.create_topics([NewTopic(t, partitions, 1) for t in topics])

        async def known() -> bool:  # a fresh broker lists a new topic a moment later
            return set(topics) <= set(await admin.list_topics())

        await until(known, f"the broker lists {topics}")
    return topics


async def test_keyed_records_land_where_a_single_send_puts_them(settings: Settings) -> None:
    first, second = await _topics(settings, "keys-a", "keys-b")
    keys = [f"customer-{n}".encode() for n in range(25)]
    items = [(first if n % 3 else second, _job(keys[n % len(keys)])) for n in range(600)]
    async with JobProducer(settings) as producer:
        written = await producer.send_many(items)
        single = {(topic, key): await producer.send(topic, _job(key))
                  for topic in (first, second) for key in keys}
    assert len(written) == len(items)
    for (topic, record), where in zip(items, written, strict=True):
        assert where.topic == topic
        assert where.partition == single[(topic, record.key)].partition
    used = {where.partition for where in written if where.topic == first}
    assert len(used) > 1  # 25 keys over 6 partitions: a hash, not one partition
    # Every reported offset holds that record, and each partition keeps the call's order.
    for topic in (first, second):
        on_disk = {(r.partition, r.offset): dict(r.headers)["sj-job-id"].decode()
                   for r in await read_topic(settings, topic)}
        expected: dict[int, list[int]] = defaultdict(list)
        for (item_topic, record), where in zip(items, written, strict=True):
            if item_topic == topic:
                assert on_disk[(where.partition, where.offset)] == record.job_id
                expected[where.partition].append(where.offset)
        for offsets in expected.values():
            assert offsets == sorted(offsets)


async def test_records_without_a_key_stay_together(settings: Settings) -> None:
    (topic,) = await _topics(settings, "unkeyed", partitions=3)
    small = settings.model_copy(update={"producer_max_batch_bytes": 4096})
    items = [(topic, _job(None, size=300)) for _ in range(100)]  # ~30 KB: several batches
    async with JobProducer(small) as producer:
        written = await producer.send_many(items)
    assert len({w.partition for w in written}) == 1  # one sticky partition per call
    offsets = [w.offset for w in written]
    assert offsets == list(range(offsets[0], offsets[0] + len(items)))
    assert len(await read_topic(settings, topic)) == len(items)


async def test_a_record_larger_than_a_batch_still_goes_alone(settings: Settings) -> None:
    (topic,) = await _topics(settings, "large", partitions=1)
    small = settings.model_copy(update={"producer_max_batch_bytes": 1024})
    items = [(topic, _job(b"k", size=100)), (topic, _job(b"k", size=5000)),
             (topic, _job(b"k", size=100))]
    async with JobProducer(small) as producer:
        written = await producer.send_many(items)
    assert [w.offset for w in written] == [0, 1, 2]
    assert [len(r.value) for r in await read_topic(settings, topic)] == [100, 5000, 100]
    assert all(isinstance(w, Written) for w in written)


@pytest.mark.parametrize("queue_wait_s", [BATCH_QUEUE_WAIT_S, 0.0],
                         ids=["batches", "batches-not-queued-in-time"])
async def test_many_large_calls_at_once_all_land_in_order(
        settings: Settings, monkeypatch: pytest.MonkeyPatch, queue_wait_s: float) -> None:
    # With no time to queue a batch, every large share falls back to record-by-record.
    monkeypatch.setattr(producer_module, "BATCH_QUEUE_WAIT_S", queue_wait_s)
    (topic,) = await _topics(settings, "concurrent", partitions=2)
    # Large calls (a batch of their own per partition) and small ones (record by record,
    # joining the open batch) on the same partitions at the same time.
    sizes = [300 if c % 2 else 2 * OWN_BATCH_MIN // 4 for c in range(20)]
    calls = [[(topic, _job(f"k{c}-{n % 7}".encode())) for n in range(size)]
             for c, size in enumerate(sizes)]
    async with JobProducer(settings) as producer:
        results = await asyncio.gather(*(producer.send_many(call) for call in calls))
    on_disk = {(r.partition, r.offset): dict(r.headers)["sj-job-id"].decode()
               for r in await read_topic(settings, topic)}
    assert len(on_disk) == sum(sizes)
    for call, written in zip(calls, results, strict=True):
        for (_, record), where in zip(call, written, strict=True):
            assert on_disk[(where.partition, where.offset)] == record.job_id
        for partition in (0, 1):
            offsets = [w.offset for w in written if w.partition == partition]
            assert offsets == sorted(offsets)
