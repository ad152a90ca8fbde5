"""The in-memory broker under JobTester keeps the meanings the runtime relies on: Kafka's
partitioner for keyed records, offsets in order, a consumer group's one member assigned
every partition (its listener told first), positions from committed offsets, pauses,
fetches that wait for a write, and the real producer's refusal of a missing topic."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_jobs.errors import ConfigError, PublishError
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.partitioning import partition_for_key
from stream_jobs.record import JobRecord
from stream_jobs.settings import Settings
from stream_jobs.testing.broker import MemoryBroker
from stream_jobs.testing.memory_kafka import MemoryConsumer, MemoryKafka, MemoryProducer

TP0 = TopicPartition("jobs.a", 0)
TP1 = TopicPartition("jobs.a", 1)


class Listener:
    def __init__(self) -> None:
        self.assigned: list[list[TopicPartition]] = []

    async def on_revoked(self, revoked: list[TopicPartition]) -> None:
        pass

    async def on_assigned(self, assigned: list[TopicPartition]) -> None:
        self.assigned.append(sorted(assigned))


def made(partitions: int = 2) -> tuple[MemoryBroker, MemoryKafka, MemoryProducer]:
    broker = MemoryBroker()
    broker.create_topic("jobs.a", partitions)
    kafka = MemoryKafka(broker)
    return broker, kafka, kafka.producer(Settings())


def member(kafka: MemoryKafka, group: str = "g", reset: str = "earliest") -> MemoryConsumer:
    consumer = kafka.consumer(Settings(), group_id=group, auto_offset_reset=reset)
    assert isinstance(consumer, MemoryConsumer)
    return consumer


@settings(max_examples=50, deadline=None)
@given(keys=st.lists(st.binary(min_size=1, max_size=12), min_size=1, max_size=40),
       partitions=st.integers(min_value=1, max_value=7))
def test_a_keyed_record_lands_where_kafkas_partitioner_puts_it_in_order(
        keys: list[bytes], partitions: int) -> None:
    broker = MemoryBroker()
    broker.create_topic("jobs.a", partitions)
    producer = MemoryProducer(broker, Settings())
    for index, key in enumerate(keys):
        written = producer.write("jobs.a", key, str(index).encode(), [])
        assert written.partition == partition_for_key(key, partitions)
    for p in range(partitions):
        log = broker.read(TopicPartition("jobs.a", p), 0, len(keys))
        assert [r.offset for r in log] == list(range(len(log)))
        # One key's records keep the order they were written in.
        indexes = [int(r.value or b"") for r in log]
        assert indexes == sorted(indexes)


async def test_send_many_writes_an_unkeyed_calls_records_to_one_partition() -> None:
    _broker, _, producer = made(partitions=4)
    record = JobRecord("id", "a", b"{}", None)
    written = await producer.send_many([("jobs.a", record)] * 5)
    assert len({w.partition for w in written}) == 1
    assert [w.offset for w in written] == list(range(5))


async def test_a_missing_topic_is_refused_with_what_to_do() -> None:
    _, _, producer = made()
    with pytest.raises(PublishError, match=r"Topic jobs\.b does not exist: declare its type"):
        await producer.send_raw("jobs.b", b"k", b"{}", [])


async def test_the_groups_one_member_gets_every_partition_its_listener_told_first() -> None:
    _broker, kafka, producer = made()
    producer.write("jobs.a", None, b"x", [], partition=1)
    consumer = member(kafka)
    listener = Listener()
    consumer.subscribe(["jobs.a"], listener)
    assert not consumer.joined
    batches = await consumer.getmany(timeout_ms=0)
    assert listener.assigned == [[TP0, TP1]]
    assert consumer.joined
    assert consumer.assignment() == {TP0, TP1}
    assert [r.value for r in batches[TP1]] == [b"x"]


async def test_a_second_member_of_a_group_is_refused() -> None:
    _, kafka, _ = made()
    member(kafka).subscribe(["jobs.a"], Listener())
    with pytest.raises(ConfigError, match="one member per group"):
        member(kafka).subscribe(["jobs.a"], Listener())


async def test_positions_start_at_the_committed_offset_else_at_the_reset() -> None:
    _broker, kafka, producer = made()
    for value in (b"0", b"1", b"2"):
        producer.write("jobs.a", None, value, [], partition=0)
    first = member(kafka)
    first.subscribe(["jobs.a"], Listener())
    await first.getmany(timeout_ms=0)
    await first.commit({TP0: 2})
    await first.stop()
    again = member(kafka)
    again.subscribe(["jobs.a"], Listener())
    assert [r.value for r in (await again.getmany(timeout_ms=0))[TP0]] == [b"2"]
    latest = member(kafka, group="other", reset="latest")
    latest.subscribe(["jobs.a"], Listener())
    assert await latest.getmany(timeout_ms=0) == {}
    assert await again.committed(TP0) == 2
    assert await again.end_offsets([TP0, TP1]) == {TP0: 3, TP1: 0}


async def test_a_paused_partition_is_not_fetched_until_resumed() -> None:
    _, kafka, producer = made()
    consumer = member(kafka)
    consumer.subscribe(["jobs.a"], Listener())
    await consumer.getmany(timeout_ms=0)
    consumer.pause(TP0)
    producer.write("jobs.a", None, b"held", [], partition=0)
    assert await consumer.getmany(timeout_ms=0) == {}
    assert consumer.paused() == {TP0}
    consumer.resume(TP0)
    assert next(iter((await consumer.getmany(timeout_ms=0))[TP0])).value == b"held"


async def test_a_fetch_with_nothing_waits_for_a_write_and_returns_it() -> None:
    _, kafka, producer = made()
    consumer = member(kafka)
    consumer.subscribe(["jobs.a"], Listener())
    await consumer.getmany(timeout_ms=0)
    fetching = asyncio.create_task(consumer.getmany(timeout_ms=30_000))
    await asyncio.sleep(0)  # let it start waiting (an ordering step, not a wait for time)
    assert not fetching.done()
    await producer.send_raw("jobs.a", None, b"late", [], partition=1)
    batches = await asyncio.wait_for(fetching, 5)
    assert [r.value for r in batches[TP1]] == [b"late"]


async def test_max_records_bounds_a_fetch_across_partitions() -> None:
    _, kafka, producer = made()
    for p in (0, 1):
        for _ in range(5):
            producer.write("jobs.a", None, b"x", [], partition=p)
    consumer = member(kafka)
    consumer.subscribe(["jobs.a"], Listener())
    batches = await consumer.getmany(timeout_ms=0, max_records=3)
    assert sum(len(records) for records in batches.values()) == 3


async def test_offsets_for_times_finds_the_first_record_at_or_after() -> None:
    broker, kafka, producer = made()
    producer.write("jobs.a", None, b"x", [], partition=0)
    stamp = broker.read(TP0, 0, 1)[0].timestamp
    consumer = member(kafka)
    assert await consumer.offsets_for_times({TP0: stamp, TP1: stamp}) == {TP0: 0, TP1: None}
    assert await consumer.offsets_for_times({TP0: stamp + 1}) == {TP0: None}


operations = st.lists(st.one_of(
    st.tuples(st.just("write"), st.integers(0, 1), st.integers(1, 4)),
    st.tuples(st.just("fetch"), st.integers(1, 6), st.just(0)),
    st.tuples(st.just("commit"), st.just(0), st.just(0)),
    st.tuples(st.just("restart"), st.just(0), st.just(0)),
), max_size=30)


@settings(max_examples=100, deadline=None)
@given(steps=operations)
def test_a_member_that_commits_reads_every_record_once_per_life_and_resumes_at_its_commit(
        steps: list[tuple[str, int, int]]) -> None:
    async def run() -> None:
        broker, kafka, producer = made()
        consumer = member(kafka)
        consumer.subscribe(["jobs.a"], Listener())
        seen: list[tuple[int, int]] = []  # (partition, offset) in this consumer's life
        committed: dict[TopicPartition, int] = {}
        for op, a, b in steps:
            if op == "write":
                for _ in range(b):
                    producer.write("jobs.a", None, b"x", [], partition=a)
            elif op == "fetch":
                for tp, records in (await consumer.getmany(timeout_ms=0, max_records=a)).items():
                    offsets = [r.offset for r in records]
                    assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
                    assert offsets[0] == max([o + 1 for p, o in seen if p == tp.partition],
                                             default=committed.get(tp, 0))
                    seen += [(tp.partition, o) for o in offsets]
            elif op == "commit":
                positions = {tp: await consumer.position(tp) for tp in (TP0, TP1)}
                await consumer.commit(positions)
                committed.update(positions)
            else:
                await consumer.stop()
                consumer = member(kafka)
                consumer.subscribe(["jobs.a"], Listener())
                seen = []
            assert len(seen) == len(set(seen))
        # Whatever happened, the member reads on to the end from where it stands.
        while await consumer.getmany(timeout_ms=0):
            pass
        for tp in (TP0, TP1):
            assert await consumer.position(tp) == broker.end(tp)

    asyncio.run(run())
