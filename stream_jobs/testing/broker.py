"""The in-memory broker under `JobTester`: topics with partitions, their records in offset
order, and each consumer group's committed offsets.

It holds what a Kafka cluster holds for stream-jobs, and nothing of Kafka's machinery:
no retention (nothing is ever deleted, so a test can read every record a job left), no
replicas, one member per consumer group. Records are appended under a lock, so a
`SyncJobClient` on its own thread (or a handler thread's commit) may write too; waiting
fetches are woken on the loop the broker was first waited on.

`stream_jobs.testing.memory_kafka` puts the `Consumer` and producer surfaces on it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from stream_jobs import clock
from stream_jobs.errors import ConfigError
from stream_jobs.kafka import TopicPartition


@dataclass(slots=True)
class StoredRecord:
    """One record as the broker keeps it and a consumer returns it (a `Record`)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]]

    def header(self, name: str) -> bytes | None:
        """The last value of header `name`, or None."""
        found = None
        for key, value in self.headers:
            if key == name:
                found = value
        return found


class MemoryBroker:
    """Topics, records and committed offsets (see the module)."""

    def __init__(self) -> None:
        self._logs: dict[str, list[list[StoredRecord]]] = {}
        self._committed: dict[str, dict[TopicPartition, int]] = {}
        # group -> the consumer in it now (one member per group)
        self._members: dict[str, object] = {}
        self._lock = threading.Lock()
        self._waiters: list[asyncio.Future[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        # Bumped by every change a waiting fetch or a settling tester may care about.
        self.changes = 0

    # -- topics ------------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int) -> None:
        """Make `name` with `partitions` partitions, or grow it to that many (never shrink)."""
        if partitions < 1:
            raise ConfigError(f"Topic {name} needs at least one partition, not {partitions}.")
        with self._lock:
            log = self._logs.setdefault(name, [])
            while len(log) < partitions:
                log.append([])
        self.changed()

    def has_topic(self, name: str) -> bool:
        return name in self._logs

    def topics(self) -> list[str]:
        return sorted(self._logs)

    def partitions(self, topic: str) -> int:
        """How many partitions `topic` has (0: no such topic)."""
        return len(self._logs.get(topic, ()))

    # -- records -----------------------------------------------------------------------------

    def append(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
               headers: Iterable[tuple[str, bytes]]) -> StoredRecord:
        """Write one record at the end of `topic`'s `partition`, stamped with the clock
        stream-jobs reads (`clock.now_ms`, the tester's virtual one)."""
        with self._lock:
            log = self._logs[topic][partition]
            record = StoredRecord(topic, partition, len(log), clock.now_ms(), key, value,
                                  tuple((name, bytes(data)) for name, data in headers))
            log.append(record)
        self.changed()
        return record

    def read(self, tp: TopicPartition, offset: int, limit: int) -> list[StoredRecord]:
        """Up to `limit` records of `tp` from `offset` on."""
        log = self._logs[tp.topic][tp.partition]
        return log[offset:offset + limit] if limit > 0 else []

    def end(self, tp: TopicPartition) -> int:
        """The offset the next record of `tp` gets (Kafka's end offset)."""
        return len(self._logs[tp.topic][tp.partition])

    def records(self, topic: str) -> list[StoredRecord]:
        """Every record of `topic`, partition by partition, each in offset order."""
        return [record for log in self._logs.get(topic, ()) for record in log]

    def offset_for_time(self, tp: TopicPartition, at_ms: int) -> int | None:
        """The first offset of `tp` whose timestamp is at or after `at_ms` (None: none)."""
        for record in self._logs[tp.topic][tp.partition]:
            if record.timestamp >= at_ms:
                return int(record.offset)
        return None

    # -- groups ------------------------------------------------------------------------------

    def join(self, group: str, member: object) -> None:
        """`member` becomes the group's one member."""
        current = self._members.get(group)
        if current is not None and current is not member:
            raise ConfigError(f"Consumer group {group} already has a member: the in-memory "
                              "broker runs one member per group (stop the other worker).")
        self._members[group] = member
        self.changed()

    def leave(self, group: str, member: object) -> None:
        if self._members.get(group) is member:
            del self._members[group]
        self.changed()

    def commit(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        self._committed.setdefault(group, {}).update(offsets)
        self.changed()

    def committed(self, group: str, tp: TopicPartition) -> int | None:
        offset = self._committed.get(group, {}).get(tp)
        return None if offset is None else int(offset)

    def groups(self) -> dict[str, dict[TopicPartition, int]]:
        """Every group's committed offsets (a copy)."""
        return {group: dict(offsets) for group, offsets in self._committed.items()}

    # -- waiting -----------------------------------------------------------------------------

    def changed(self) -> None:
        """Wake whatever waits for the broker to change (from any thread)."""
        self.changes += 1
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        if threading.get_ident() == self._loop_thread:
            self._wake_waiters()
        else:
            loop.call_soon_threadsafe(self._wake_waiters)

    def _wake_waiters(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait_for_change(self, timeout_s: float) -> bool:
        """Wait until the broker changes or `timeout_s` passes; whether it changed."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._loop_thread = loop, threading.get_ident()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            return False
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
        return True


def topic_partitions(broker: MemoryBroker, topics: Sequence[str]) -> list[TopicPartition]:
    """Every partition of `topics` that exist, in order."""
    return [TopicPartition(topic, p) for topic in topics
            for p in range(broker.partitions(topic))]


__all__ = ["MemoryBroker", "StoredRecord", "topic_partitions"]
