"""The one way stream-jobs writes records: an idempotent producer with acks=all.

Every send returns only after the broker acknowledged the record, so a caller that got
a result knows the record is on the in-sync replicas. Broker errors become `PublishError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, TypeVar

from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    OutOfOrderSequenceNumber,
    TopicAuthorizationFailedError,
)

from stream_jobs.errors import Abandoned, PublishError
from stream_jobs.kafka.connection import (
    access_denied,
    connect_error,
    kafka_client_kwargs,
    sasl_user,
)
from stream_jobs.kafka.partitioning import partition_for_key
from stream_jobs.record import JobRecord
from stream_jobs.settings import Settings

log = logging.getLogger("stream_jobs.producer")

# A call's records for one partition go as record batches of their own from this many.
OWN_BATCH_MIN = 32
# How long a batch of our own may wait to be queued behind the partition's previous one.
BATCH_QUEUE_WAIT_S = 0.1
# Headers and batch framing on top of the payload limit.
RECORD_OVERHEAD_BYTES = 64 * 1024


_W = TypeVar("_W")


class Outgoing(Protocol):
    """What `send_many` writes: a `JobRecord`, or a record kept elsewhere until it is sent
    (the outbox's rows), with its key, value and headers as they are."""

    @property
    def key(self) -> bytes | None: ...

    @property
    def payload(self) -> bytes: ...

    def headers(self) -> list[tuple[str, bytes]]: ...


@dataclass(frozen=True, slots=True)
class Written:
    """Where the broker put a record."""

    topic: str
    partition: int
    offset: int


class JobProducer:
    """An `AIOKafkaProducer` configured for jobs: acks=all, idempotent, bounded batches."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._producer = self._new_producer()
        self._renewing = asyncio.Lock()
        self._started = False
        self._known_topics: set[str] = set()
        self._batch_locks: dict[tuple[str, int], asyncio.Lock] = {}

    def _new_producer(self) -> AIOKafkaProducer:
        settings = self._settings
        return AIOKafkaProducer(
            **kafka_client_kwargs(settings),
            acks="all",
            enable_idempotence=True,
            linger_ms=settings.producer_linger_ms,
            max_batch_size=min(settings.producer_max_batch_bytes, 16 * 1024 * 1024),
            max_request_size=settings.max_payload_bytes + RECORD_OVERHEAD_BYTES,
        )

    async def _renew(self, failed: AIOKafkaProducer) -> None:
        """Replace `failed` with a producer that has a new producer ID.

        aiokafka's idempotent producer gives a batch its sequence numbers when it sends
        it and does not take them back when the broker refuses the batch for good (too
        large, not authorised): every later write to that partition then fails with
        OutOfOrderSequenceNumber, so a retry or dead-letter write would never succeed.
        """
        async with self._renewing:
            if self._producer is not failed or not self._started:
                return  # renewed by another writer meanwhile, or stopping
            fresh = self._new_producer()
            try:
                await fresh.start()
            except KafkaError as exc:  # the next failed write tries again
                log.warning("could not renew the producer yet: %s", exc)
                with contextlib.suppress(Exception):
                    await fresh.stop()
                return
            self._producer = fresh
        log.warning("producer renewed after an out-of-order sequence number")
        with contextlib.suppress(Exception):
            await asyncio.wait_for(failed.stop(), 10)

    async def start(self) -> None:
        try:
            await self._producer.start()
        except KafkaConnectionError as exc:
            await self._producer.stop()
            raise await connect_error(self._settings, exc) from exc
        except (ClusterAuthorizationFailedError, TopicAuthorizationFailedError) as exc:
            # Since KIP-679 an idempotent producer may start with Write on any one topic.
            await self._producer.stop()
            raise access_denied(self._settings, "start an idempotent producer (Write on at "
                                "least one topic)") from exc
        self._started = True

    async def warm(self, topics: Sequence[str]) -> None:
        """Learn the partitions of `topics` now. The first write to a topic otherwise waits
        for the producer to fetch its metadata, which delayed a cold worker's first
        retries by seconds."""
        try:
            metadata = await self._producer.client.fetch_all_metadata()
            self._known_topics.update(metadata.topics())
            for topic in topics:
                if topic in self._known_topics:  # a missing one is reported when written
                    await self._producer.partitions_for(topic)
        except KafkaError as exc:
            log.warning("could not learn the topics' partitions yet: %s", exc)

    async def stop(self) -> None:
        if self._started:
            self._started = False
            await self._producer.stop()

    async def __aenter__(self) -> JobProducer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    async def send(self, topic: str, record: JobRecord, *, partition: int | None = None) -> Written:
        """Write `record` to `topic` and wait for the broker's acknowledgement."""
        return await self.send_raw(topic, record.key, record.payload, record.headers(),
                                   partition=partition)

    async def send_raw(self, topic: str, key: bytes | None, value: bytes | None,
                       headers: Sequence[tuple[str, bytes]], *,
                       partition: int | None = None) -> Written:
        """Write bytes as they are (dead letters of undecodable records, replays)."""
        producer = self._producer
        future = await self._enqueue(topic, key, value, headers, partition)
        try:
            return await self._acked(topic, future)
        except PublishError as exc:
            if isinstance(exc.__cause__, OutOfOrderSequenceNumber):
                await self._renew(producer)
            raise

    async def send_many(self, items: Sequence[tuple[str, Outgoing]], *,
                        partition: int | None = None) -> list[Written]:
        """Write many records, then wait for every acknowledgement.

        With `partition`, every record goes to that partition (the overflow lane keeps a
        lane partition's records in the partition of the same number).

        Each record's partition is computed here (Kafka's own key hashing, so a key lands
        where a single send would put it); records without a key all go to one partition
        per call, as Kafka's sticky partitioner does. A partition's share of the call goes
        as record batches of its own when it has `OWN_BATCH_MIN` records or more (one
        acknowledgement per batch instead of a future per record), else record by record,
        joining the batch already open for that partition. Order within a partition is
        that of `items`. Raises `PublishError` if any record was not acknowledged; the
        others may be written.
        """
        producer = self._producer
        counts: dict[str, int] = {}
        unkeyed: dict[str, int] = {}
        by_partition: dict[tuple[str, int], list[int]] = {}
        for index, (topic, rec) in enumerate(items):
            count = counts.get(topic)
            if count is None:
                count = counts[topic] = await self._partition_count(topic)
            if partition is not None:
                chosen = partition
            elif rec.key is not None:
                chosen = partition_for_key(rec.key, count)
            else:
                chosen = unkeyed.setdefault(topic, random.randrange(count))
            by_partition.setdefault((topic, chosen), []).append(index)
        sent: list[tuple[list[int], asyncio.Future[Any]]] = []
        for (topic, part), indexes in by_partition.items():
            if len(indexes) >= OWN_BATCH_MIN:
                sent.extend(await self._send_batches(topic, part, indexes, items))
                continue
            for index in indexes:
                rec = items[index][1]
                sent.append(([index], await self._enqueue(topic, rec.key, rec.payload,
                                                          rec.headers(), part)))
        placed: list[Written | None] = [None] * len(items)
        failure: KafkaError | None = None
        renew = False
        for indexes, future in sent:  # awaited as they are: no task per future
            try:
                meta = await future
            except KafkaError as exc:
                failure = failure or exc
                renew = renew or isinstance(exc, OutOfOrderSequenceNumber)
                continue
            for position, index in enumerate(indexes):
                placed[index] = Written(meta.topic, meta.partition, meta.offset + position)
        if renew:
            await self._renew(producer)
        if failure is not None:
            missing = sorted({items[i][0] for i, where in enumerate(placed) if where is None})
            raise PublishError(f"Kafka did not acknowledge records for {', '.join(missing)}: "
                               f"{failure}") from failure
        return [where for where in placed if where is not None]

    async def _send_batches(self, topic: str, partition: int, indexes: list[int],
                            items: Sequence[tuple[str, Outgoing]]
                            ) -> list[tuple[list[int], asyncio.Future[Any]]]:
        """`items[indexes]` as record batches of their own, in order; (indexes, future) each.

        One call at a time per partition. aiokafka queues a batch only once the partition's
        previous one has drained, and its wait for that gives up (KafkaTimeoutError) when
        other sends keep opening new ones; a batch not queued within `BATCH_QUEUE_WAIT_S`
        is sent record by record instead, as are the rest of the call's records."""
        lock = self._batch_locks.setdefault((topic, partition), asyncio.Lock())
        sent: list[tuple[list[int], asyncio.Future[Any]]] = []
        async with lock:
            chunks: list[tuple[list[int], Any]] = []
            chunk: list[int] = []
            builder = self._producer.create_batch()
            for index in indexes:
                rec = items[index][1]
                headers = rec.headers()
                if builder.append(timestamp=None, key=rec.key, value=rec.payload,
                                  headers=headers) is None:
                    chunks.append((chunk, builder))  # full (or the record alone is larger)
                    builder, chunk = self._producer.create_batch(), []
                    if builder.append(timestamp=None, key=rec.key, value=rec.payload,
                                      headers=headers) is None:
                        chunks.append(([index], None))  # for send() to refuse
                        continue
                chunk.append(index)
            chunks.append((chunk, builder))
            one_by_one = False
            for chunk, built in chunks:
                if not chunk:
                    continue
                future = None
                if built is not None and not one_by_one:
                    future = await self._queue_batch(topic, partition, built)
                    one_by_one = future is None
                if future is not None:
                    sent.append((chunk, future))
                    continue
                for index in chunk:
                    rec = items[index][1]
                    sent.append(([index], await self._enqueue(
                        topic, rec.key, rec.payload, rec.headers(), partition)))
        return sent

    async def _queue_batch(self, topic: str, partition: int,
                           builder: Any) -> asyncio.Future[Any] | None:
        """Queue a built batch; None if it could not be queued soon (nothing was sent)."""
        builder.close()  # or a concurrent send() could append to it
        try:
            future: asyncio.Future[Any] = await asyncio.wait_for(
                self._producer.send_batch(builder, topic, partition=partition),
                BATCH_QUEUE_WAIT_S)
        except (TimeoutError, KafkaTimeoutError):
            return None  # cancelled while waiting for the previous batch: not queued
        except KafkaError as exc:
            raise PublishError(f"Kafka refused records for {topic}: {exc}") from exc
        return future

    async def _partition_count(self, topic: str) -> int:
        if topic not in self._known_topics:
            await self._check_topic(topic)
        try:
            return len(await self._producer.partitions_for(topic))
        except KafkaError as exc:
            raise PublishError(f"Kafka did not return the partitions of {topic}: {exc}"
                               ) from exc

    async def _enqueue(self, topic: str, key: bytes | None, value: bytes | None,
                       headers: Sequence[tuple[str, bytes]],
                       partition: int | None) -> asyncio.Future[Any]:
        if topic not in self._known_topics:
            await self._check_topic(topic)
        try:
            future: asyncio.Future[Any] = await self._producer.send(
                topic, value=value, key=key, headers=list(headers), partition=partition)
        except KafkaError as exc:
            raise PublishError(f"Kafka refused a record for {topic}: {exc}") from exc
        return future

    async def _check_topic(self, topic: str) -> None:
        """Fail at once for a missing topic; aiokafka would wait out its request timeout."""
        try:
            metadata = await self._producer.client.fetch_all_metadata()
        except KafkaError as exc:
            raise PublishError(f"Kafka did not return its metadata: {exc}") from exc
        self._known_topics.update(metadata.topics())
        if topic not in self._known_topics:
            # Kafka leaves topics a principal may not Describe out of its metadata.
            user = sasl_user(self._settings)
            hidden = f", or {user} may not Describe it" if user else ""
            raise PublishError(f"Topic {topic} does not exist{hidden}: declare its type in "
                               "topics/ and run `stream-jobs topics apply`.")

    async def _acked(self, topic: str, future: asyncio.Future[Any]) -> Written:
        try:
            meta = await future
        except KafkaError as exc:
            raise PublishError(f"Kafka did not acknowledge a record for {topic}: {exc}") from exc
        return Written(meta.topic, meta.partition, meta.offset)


async def until_acked(send: Callable[[], Awaitable[_W]], stopping: asyncio.Event) -> _W:
    """Retry a write until the broker acknowledges it, backing off up to 10 s.

    Used for retry, dead-letter and relay writes, whose source offset stays unfinished
    meanwhile: a crash here means the job is delivered again, never lost. Once `stopping`
    is set it gives up with `Abandoned`, leaving the source record to its next owner.
    """
    backoff_s = 0.2
    while True:
        try:
            return await send()
        except PublishError as exc:
            log.warning("write failed, trying again in %.1f s: %s", backoff_s, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), backoff_s)
            if stopping.is_set():
                raise Abandoned("stopped before the broker acknowledged the write") from exc
            backoff_s = min(backoff_s * 2, 10.0)
