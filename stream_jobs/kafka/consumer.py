"""Consuming from Kafka: `open_consumer`, `new_consumer` and the `Consumer` surface we use.

Everything above `stream_jobs.kafka` reads Kafka through a `Consumer`: group members
(the worker, the relay, shadow mode), the throttle follower, scans, stats, lookup, the
DLQ drain and offset resets. This module is the only code that touches aiokafka's
consumer, and the only code that reaches into its internals (`_client`, for metadata
about topics the consumer does not read); checked against aiokafka 0.13.0 and 0.14.0,
the range `pyproject.toml` allows.

Every `KafkaError` becomes one of ours here: a refused connection `BrokerUnavailable`
(or, for credentials and certificates, `AuthenticationFailed` / `ConfigError`), a
refused authorisation `AccessDenied`, a refused commit `CommitRefused`, anything else
`BrokerError`, each with a sentence that names what was asked. Code above catches only
`StreamJobsError`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, NoReturn, Protocol

from aiokafka import AIOKafkaConsumer
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import (
    CommitFailedError,
    GroupAuthorizationFailedError,
    IllegalGenerationError,
    KafkaConnectionError,
    KafkaError,
    RebalanceInProgressError,
    TopicAuthorizationFailedError,
    UnknownMemberIdError,
)
from aiokafka.protocol.metadata import MetadataRequest

from stream_jobs.errors import BrokerError, CommitRefused, GroupInUse
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.connection import access_denied, connect_error, kafka_client_kwargs
from stream_jobs.record import Record
from stream_jobs.settings import Settings

# A commit these refuse was made by a member the group no longer counts (a rebalance
# moved on without it), or by an outsider while the group has members.
_FENCED = (CommitFailedError, UnknownMemberIdError, IllegalGenerationError,
           RebalanceInProgressError)
_DENIED = (GroupAuthorizationFailedError, TopicAuthorizationFailedError)
# How old the consumer's view of partition leaders may get (aiokafka's default is 5
# minutes). When a partition newly assigned to it lost its leader, aiokafka asks the old
# leader for the partition's offset again and again and never asks who leads now, until
# its metadata is this old: in the batches@cluster chaos trial a worker's partition
# stood still 4 minutes after a broker kill (2,383 refused requests). Bound: 10 s.
METADATA_MAX_AGE_MS = 10_000


class RebalanceListener(Protocol):
    """What a group member is told when the group moves partitions (aiokafka's contract:
    `revoked` runs before the partitions go, and its commits still count)."""

    async def on_revoked(self, revoked: list[TopicPartition]) -> None: ...

    async def on_assigned(self, assigned: list[TopicPartition]) -> None: ...


class Consumer(Protocol):
    """The consumer operations stream-jobs uses (aiokafka's names and meanings)."""

    group_id: str | None

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None: ...

    def assign(self, partitions: Iterable[TopicPartition]) -> None: ...

    def assignment(self) -> set[TopicPartition]: ...

    async def getmany(self, *partitions: TopicPartition, timeout_ms: int,
                      max_records: int | None = None) -> dict[TopicPartition, list[Record]]:
        ...

    def seek(self, tp: TopicPartition, offset: int) -> None: ...

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None: ...

    async def position(self, tp: TopicPartition) -> int: ...

    def pause(self, *partitions: TopicPartition) -> None: ...

    def resume(self, *partitions: TopicPartition) -> None: ...

    def paused(self) -> set[TopicPartition]: ...

    def highwater(self, tp: TopicPartition) -> int | None:
        """The end offset of `tp` as of the last fetch (None before one)."""
        ...

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None: ...

    async def committed(self, tp: TopicPartition) -> int | None: ...

    async def beginning_offsets(self, partitions: Sequence[TopicPartition]
                                ) -> dict[TopicPartition, int]: ...

    async def end_offsets(self, partitions: Sequence[TopicPartition]
                          ) -> dict[TopicPartition, int]: ...

    async def offsets_for_times(self, times_ms: Mapping[TopicPartition, int]
                                ) -> dict[TopicPartition, int | None]:
        """The first offset at or after each time (None where no record is that late)."""
        ...

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        """The partitions of `topic` in this consumer's metadata (None: not known to it)."""
        ...

    async def refresh_metadata(self) -> None:
        """Fetch the metadata of the topics this consumer knows again (new topics and
        partitions are learnt lazily otherwise)."""
        ...

    async def learn_topics(self, topics: Sequence[str]) -> dict[str, set[int]]:
        """The partitions of each of `topics` that exists, with their leaders kept in this
        consumer's metadata, so offset questions about them go out at once (a consumer
        learns each topic by itself otherwise, a retry each). Never creates a topic."""
        ...

    async def cluster_partitions(self, topic: str) -> set[int] | None:
        """The partitions of `topic` in the whole cluster's metadata, asked now (None: no
        such topic). Unlike `partitions_for_topic`, right after the reader assigned other
        topics too."""
        ...


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, listener: RebalanceListener) -> None:
        self._listener = listener

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        await self._listener.on_revoked(list(revoked))

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        await self._listener.on_assigned(list(assigned))


class _KafkaConsumer:
    """`Consumer` on aiokafka, translating its errors (see the module docstring)."""

    def __init__(self, settings: Settings, options: dict[str, Any]) -> None:
        self._settings = settings
        self.group_id: str | None = options.get("group_id")
        self._topics: Sequence[str] = ()
        self._consumer = AIOKafkaConsumer(**{**kafka_client_kwargs(settings),
                                             "metadata_max_age_ms": METADATA_MAX_AGE_MS,
                                             **options})

    def _failed(self, what: str, exc: KafkaError) -> NoReturn:
        if isinstance(exc, _DENIED):
            group = f" in consumer group {self.group_id}" if self.group_id else ""
            topics = ", ".join(self._topics) or "its topics"
            raise access_denied(self._settings, f"read {topics}{group} (Read on the topics "
                                "and the group)") from exc
        raise BrokerError(f"Kafka failed to {what}: {exc}. Is the cluster healthy?") from exc

    async def start(self) -> None:
        try:
            await self._consumer.start()
        except KafkaConnectionError as exc:
            await self._consumer.stop()
            raise await connect_error(self._settings, exc) from exc

    async def stop(self) -> None:
        """Leave the group and close every connection. aiokafka's fetcher re-raises the
        cancellation of a fetch it cancels itself while closing (one waiting out its
        backoff after a broker connection broke): that is no cancellation of ours, so the
        close is finished here instead of ending the caller with a bare CancelledError."""
        try:
            await self._consumer.stop()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the caller is being cancelled: that one goes on
            await self._finish_close()

    async def _finish_close(self) -> None:
        fetcher = self._consumer._fetcher
        left = [t for t in (fetcher._pending_tasks if fetcher is not None else ()) if not t.done()]
        for t in left:
            t.cancel()
        await asyncio.gather(*left, return_exceptions=True)
        await self._consumer._client.close()

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None:
        self._topics = topics
        self._consumer.subscribe(list(topics), listener=_Listener(listener))

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self._consumer.assign(list(partitions))

    def assignment(self) -> set[TopicPartition]:
        return set(self._consumer.assignment())

    async def getmany(self, *partitions: TopicPartition, timeout_ms: int,
                      max_records: int | None = None) -> dict[TopicPartition, list[Record]]:
        try:
            batches: dict[TopicPartition, list[Record]] = await self._consumer.getmany(
                *partitions, timeout_ms=timeout_ms, max_records=max_records)
        except KafkaError as exc:
            self._failed("fetch records", exc)
        return batches

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._consumer.seek(tp, offset)

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        try:
            await self._consumer.seek_to_beginning(*partitions)
        except KafkaError as exc:
            self._failed("find the beginning of a partition", exc)

    async def position(self, tp: TopicPartition) -> int:
        try:
            return int(await self._consumer.position(tp))
        except KafkaError as exc:
            self._failed(f"tell the position in {tp.topic} partition {tp.partition}", exc)

    def pause(self, *partitions: TopicPartition) -> None:
        self._consumer.pause(*partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self._consumer.resume(*partitions)

    def paused(self) -> set[TopicPartition]:
        return set(self._consumer.paused())

    def highwater(self, tp: TopicPartition) -> int | None:
        high: int | None = self._consumer.highwater(tp)
        return high

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        try:
            await self._consumer.commit(dict(offsets))
        except KafkaError as exc:
            raise CommitRefused(f"Kafka refused a commit of group {self.group_id}: {exc}"
                                ) from exc

    async def committed(self, tp: TopicPartition) -> int | None:
        try:
            offset: int | None = await self._consumer.committed(tp)
        except KafkaError as exc:
            self._failed(f"tell the committed offset of group {self.group_id}", exc)
        return offset

    async def beginning_offsets(self, partitions: Sequence[TopicPartition]
                                ) -> dict[TopicPartition, int]:
        try:
            return dict(await self._consumer.beginning_offsets(list(partitions)))
        except KafkaError as exc:
            self._failed("list beginning offsets", exc)

    async def end_offsets(self, partitions: Sequence[TopicPartition]
                          ) -> dict[TopicPartition, int]:
        try:
            return dict(await self._consumer.end_offsets(list(partitions)))
        except KafkaError as exc:
            self._failed("list end offsets", exc)

    async def offsets_for_times(self, times_ms: Mapping[TopicPartition, int]
                                ) -> dict[TopicPartition, int | None]:
        try:
            found = await self._consumer.offsets_for_times(dict(times_ms))
        except KafkaError as exc:
            self._failed("look offsets up by time", exc)
        return {tp: (None if at is None else int(at.offset)) for tp, at in found.items()}

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        found: set[int] | None = self._consumer.partitions_for_topic(topic)
        return found

    async def refresh_metadata(self) -> None:
        try:
            await self._consumer._client.force_metadata_update()
        except KafkaError as exc:
            self._failed("refresh its metadata", exc)

    async def learn_topics(self, topics: Sequence[str]) -> dict[str, set[int]]:
        found = {topic: parts for topic in topics
                 if (parts := await self.cluster_partitions(topic))}
        if found:
            try:
                await self._consumer._client.set_topics(sorted(found))
            except KafkaError as exc:
                self._failed("learn its topics", exc)
        return found

    async def cluster_partitions(self, topic: str) -> set[int] | None:
        # Only this topic's metadata: the whole cluster's takes most of a second to read
        # on a cluster of thousands of topics. Never auto-created by the question.
        client = self._consumer._client
        node, question = client.get_random_node(), _metadata_question(topic)
        try:
            if node is None or question is None:
                metadata = await client.fetch_all_metadata()
            else:
                metadata = ClusterMetadata()
                metadata.need_all_topic_metadata = True  # a missing topic is an answer
                metadata.update_metadata(await client.send(node, question))
        except KafkaError as exc:
            self._failed("return its metadata", exc)
        found: set[int] | None = metadata.partitions_for_topic(topic)
        return found


def _metadata_question(topic: str) -> Any:
    """A metadata request for `topic` alone that never creates it; None on an aiokafka
    whose requests are built otherwise (then the whole cluster's metadata is asked)."""
    try:
        return MetadataRequest([topic], allow_auto_topic_creation=False)
    except TypeError:  # aiokafka 0.13: MetadataRequest is a list of versioned classes
        return None


def new_consumer(settings: Settings, **options: Any) -> Consumer:
    """A consumer on our connection settings plus aiokafka `options` (e.g. `group_id`,
    `request_timeout_ms`), not started: for a member that starts and stops it itself.
    Make it on the running event loop."""
    return _KafkaConsumer(settings, options)


@asynccontextmanager
async def open_consumer(settings: Settings, **options: Any) -> AsyncIterator[Consumer]:
    """`new_consumer(settings, **options)`, started, and stopped on the way out."""
    consumer = new_consumer(settings, **options)
    await consumer.start()
    try:
        yield consumer
    finally:
        await consumer.stop()


def open_reader(settings: Settings, **options: Any) -> AbstractAsyncContextManager[Consumer]:
    """A group-less consumer (nothing is committed) that reads from the beginning."""
    return open_consumer(settings, enable_auto_commit=False, auto_offset_reset="earliest",
                         group_id=None, **options)


async def commit_as_outsider(settings: Settings, group: str,
                             offsets: Mapping[TopicPartition, int]) -> None:
    """Set `group`'s committed offsets from outside the group. Kafka takes such a commit
    (generation -1) only while the group has no members; otherwise `GroupInUse`."""
    # assign() instead of subscribe(): the consumer never joins the group.
    async with open_consumer(settings, client_id="stream-jobs-admin", group_id=group,
                             enable_auto_commit=False) as consumer:
        consumer.assign(offsets)
        try:
            await consumer.commit(offsets)
        except CommitRefused as exc:
            if isinstance(exc.__cause__, _FENCED):
                raise GroupInUse(
                    f"Kafka refused the new offsets because consumer group {group!r} has "
                    "active members (it takes offsets from outside a group only when the "
                    "group is empty): stop its workers first.") from exc.__cause__
            raise BrokerError(f"Kafka refused the new offsets of group {group!r}: "
                              f"{exc.__cause__}.") from exc.__cause__


__all__ = [
    "METADATA_MAX_AGE_MS",
    "Consumer",
    "RebalanceListener",
    "commit_as_outsider",
    "new_consumer",
    "open_consumer",
    "open_reader",
]


def copartitioned() -> dict[str, Any]:
    """Options of a group whose member owning partition p of one topic must own partition
    p of the others it reads (topics with the same partition count): Kafka's range
    assignor. Fair dispatch's lanes and overflow lane need it."""
    return {"partition_assignment_strategy": (RangePartitionAssignor,)}
