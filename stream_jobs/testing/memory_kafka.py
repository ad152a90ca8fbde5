"""Kafka's client surfaces on the in-memory broker: a `Consumer`, a `Producer` and the
`KafkaClients` that makes them, so the real `Worker` and `Relay` run on it unchanged.

The consumer keeps aiokafka's meanings: `subscribe` joins the group, and the first fetch
assigns every partition of the subscribed topics (the group's one member gets them all),
telling the rebalance listener before positions are read from the group's committed
offsets (`auto_offset_reset` where there are none); a paused partition is not fetched; a
fetch with nothing to return waits for a write, at most `timeout_ms`. The producer places
a keyed record where Kafka's default partitioner would (`partition_for_key`, so one key's
jobs keep their order), an unkeyed one on a partition chosen at random (sticky for one
`send_many` call), and refuses a topic that does not exist with the sentence the real
one says.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from stream_jobs.errors import CommitRefused, ConfigError, PublishError
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.consumer import Consumer, RebalanceListener
from stream_jobs.kafka.partitioning import partition_for_key
from stream_jobs.kafka.producer import Outgoing, Written
from stream_jobs.record import JobRecord
from stream_jobs.settings import Settings
from stream_jobs.testing.broker import MemoryBroker, StoredRecord, topic_partitions

# Headers and framing on top of the payload limit, as the real producer allows.
_RECORD_OVERHEAD_BYTES = 64 * 1024


class MemoryConsumer:
    """A `Consumer` on a `MemoryBroker` (see the module)."""

    def __init__(self, broker: MemoryBroker, options: Mapping[str, Any]) -> None:
        self._broker = broker
        self.group_id: str | None = options.get("group_id")
        self._reset = str(options.get("auto_offset_reset", "latest"))
        self._topics: list[str] = []
        self._listener: RebalanceListener | None = None
        self._assigned: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int] = {}
        self._paused: set[TopicPartition] = set()
        self._fetched: set[TopicPartition] = set()
        self._must_join = False
        self._turn = 0
        # True once the group assigned this member its partitions.
        self.joined = False

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        if self.group_id is not None and self._listener is not None:
            self._broker.leave(self.group_id, self)
        self._assigned, self._positions, self._paused = [], {}, set()
        self.joined = False

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None:
        if self.group_id is None:
            raise ConfigError("subscribe() needs a consumer group: make the consumer with "
                              "group_id=...")
        self._broker.join(self.group_id, self)
        self._topics, self._listener, self._must_join = list(topics), listener, True

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self._assigned = list(dict.fromkeys(partitions))
        self._positions = {tp: at for tp, at in self._positions.items() if tp in self._assigned}
        self._paused &= set(self._assigned)
        self.joined = True

    def assignment(self) -> set[TopicPartition]:
        return set(self._assigned)

    async def _join(self) -> None:
        self._must_join = False
        self.assign(topic_partitions(self._broker, self._topics))
        self.joined = False  # until the listener has taken the partitions
        if self._listener is not None:
            await self._listener.on_assigned(list(self._assigned))
        self.joined = True
        self._broker.changed()

    def fetch_position(self, tp: TopicPartition) -> int:
        """Where the next fetch of `tp` starts (committed offset or reset, if not yet read)."""
        at = self._positions.get(tp)
        if at is None:
            committed = (self._broker.committed(self.group_id, tp)
                         if self.group_id is not None else None)
            if committed is not None:
                at = committed
            else:
                at = 0 if self._reset == "earliest" else self._broker.end(tp)
            self._positions[tp] = at
        return at

    async def getmany(self, *partitions: TopicPartition, timeout_ms: int,
                      max_records: int | None = None) -> dict[TopicPartition, list[Any]]:
        if self._must_join:
            await self._join()
        found = self._collect(partitions, max_records)
        if found or timeout_ms <= 0:
            return found
        await self._broker.wait_for_change(timeout_ms / 1000)
        if self._must_join:
            await self._join()
        return self._collect(partitions, max_records)

    def _collect(self, asked: Sequence[TopicPartition],
                 max_records: int | None) -> dict[TopicPartition, list[Any]]:
        chosen = [tp for tp in (asked or self._assigned)
                  if tp in self._assigned and tp not in self._paused]
        if not chosen:
            return {}
        # Start with a different partition each time, so no partition starves the others.
        self._turn = (self._turn + 1) % len(chosen)
        left = 500 if max_records is None else max_records
        found: dict[TopicPartition, list[Any]] = {}
        for tp in chosen[self._turn:] + chosen[:self._turn]:
            if left <= 0:
                break
            records: list[StoredRecord] = self._broker.read(tp, self.fetch_position(tp), left)
            self._fetched.add(tp)
            if records:
                found[tp] = list(records)
                self._positions[tp] = records[-1].offset + 1
                left -= len(records)
        return found

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._positions[tp] = offset

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        for tp in partitions or tuple(self._assigned):
            self._positions[tp] = 0

    async def position(self, tp: TopicPartition) -> int:
        return self.fetch_position(tp)

    def pause(self, *partitions: TopicPartition) -> None:
        self._paused.update(tp for tp in partitions if tp in self._assigned)

    def resume(self, *partitions: TopicPartition) -> None:
        self._paused.difference_update(partitions)
        self._broker.changed()  # a fetch waiting now may have something to return

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    def highwater(self, tp: TopicPartition) -> int | None:
        return self._broker.end(tp) if tp in self._fetched else None

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        if self.group_id is None:
            raise CommitRefused("A consumer without a group cannot commit offsets.")
        self._broker.commit(self.group_id, offsets)

    async def committed(self, tp: TopicPartition) -> int | None:
        return None if self.group_id is None else self._broker.committed(self.group_id, tp)

    async def beginning_offsets(self, partitions: Sequence[TopicPartition]
                                ) -> dict[TopicPartition, int]:
        return {tp: 0 for tp in partitions}  # nothing is ever deleted

    async def end_offsets(self, partitions: Sequence[TopicPartition]
                          ) -> dict[TopicPartition, int]:
        return {tp: self._broker.end(tp) for tp in partitions}

    async def offsets_for_times(self, times_ms: Mapping[TopicPartition, int]
                                ) -> dict[TopicPartition, int | None]:
        return {tp: self._broker.offset_for_time(tp, at) for tp, at in times_ms.items()}

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        count = self._broker.partitions(topic)
        return set(range(count)) if count else None

    async def refresh_metadata(self) -> None:
        pass

    async def cluster_partitions(self, topic: str) -> set[int] | None:
        return self.partitions_for_topic(topic)

    async def learn_topics(self, topics: Sequence[str]) -> dict[str, set[int]]:
        return {topic: parts for topic in topics
                if (parts := self.partitions_for_topic(topic))}


class MemoryProducer:
    """The `Producer` surface on a `MemoryBroker` (see the module)."""

    def __init__(self, broker: MemoryBroker, settings: Settings) -> None:
        self._broker = broker
        self._max_value_bytes = settings.max_payload_bytes + _RECORD_OVERHEAD_BYTES

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def warm(self, topics: Sequence[str]) -> None:
        pass

    async def send(self, topic: str, record: JobRecord, *,
                   partition: int | None = None) -> Written:
        return self.write(topic, record.key, record.payload, record.headers(), partition)

    async def send_raw(self, topic: str, key: bytes | None, value: bytes | None,
                       headers: Sequence[tuple[str, bytes]], *,
                       partition: int | None = None) -> Written:
        return self.write(topic, key, value, headers, partition)

    async def send_many(self, items: Sequence[tuple[str, Outgoing]], *,
                        partition: int | None = None) -> list[Written]:
        unkeyed: dict[str, int] = {}
        written = []
        for topic, rec in items:
            chosen = partition
            if chosen is None and rec.key is None:
                chosen = unkeyed.setdefault(topic, self._random_partition(topic))
            written.append(self.write(topic, rec.key, rec.payload, rec.headers(), chosen))
        return written

    def write(self, topic: str, key: bytes | None, value: bytes | None,
              headers: Sequence[tuple[str, bytes]], partition: int | None = None) -> Written:
        """Write one record now (also from a thread that is not the loop's)."""
        count = self._broker.partitions(topic)
        if not count:
            raise PublishError(f"Topic {topic} does not exist: declare its type in topics/ "
                               "(or in the JobTester's types=) before writing to it.")
        if value is not None and len(value) > self._max_value_bytes:
            raise PublishError(f"Kafka refused a record for {topic}: its {len(value)} bytes "
                               "are over the broker's message size limit.")
        if partition is None:
            partition = (partition_for_key(key, count) if key is not None
                         else self._random_partition(topic))
        elif not 0 <= partition < count:
            raise PublishError(f"Kafka refused a record for {topic}: it has no partition "
                               f"{partition}.")
        stored = self._broker.append(topic, partition, key, value, headers)
        return Written(topic, partition, stored.offset)

    def _random_partition(self, topic: str) -> int:
        return random.randrange(max(1, self._broker.partitions(topic)))


class MemoryKafka:
    """`KafkaClients` on a `MemoryBroker`; remembers the consumer it made for each group."""

    def __init__(self, broker: MemoryBroker) -> None:
        self.broker = broker
        self.members: dict[str, MemoryConsumer] = {}

    def consumer(self, settings: Settings, **options: Any) -> Consumer:
        made = MemoryConsumer(self.broker, options)
        if made.group_id is not None:
            self.members[made.group_id] = made
        return made

    def producer(self, settings: Settings) -> MemoryProducer:
        return MemoryProducer(self.broker, settings)

    async def ensure_internal_topic(self, settings: Settings, name: str,
                                    configs: dict[str, str]) -> None:
        if not self.broker.has_topic(name):
            self.broker.create_topic(name, 1)


__all__ = ["MemoryConsumer", "MemoryKafka", "MemoryProducer"]
