"""Asking Kafka's admin API: `Admin` for code above `stream_jobs.kafka`, and the few admin
steps the runtime needs (a group's state, creating our internal topics).

`Admin` wraps aiokafka's admin client so that a `KafkaError` arrives as `BrokerError`
with a sentence; `admin_client` hands out the raw client, for this package, tests and ops
scripts only. Topic administration (plan, apply, list) is `stream_jobs.kafka.topics`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from aiokafka.admin import AIOKafkaAdminClient, NewTopic, RecordsToDelete
from aiokafka.errors import (
    GroupCoordinatorNotAvailableError,
    GroupLoadInProgressError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    NodeNotReadyError,
    NotCoordinatorForGroupError,
    TopicAlreadyExistsError,
    for_code,
)

from stream_jobs.errors import BrokerError
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.connection import connect_error, kafka_client_kwargs
from stream_jobs.settings import Settings

# Errors that mean "the broker did not answer", as opposed to "the broker said no".
UNREACHABLE = (KafkaConnectionError, KafkaTimeoutError, NodeNotReadyError, OSError,
               asyncio.TimeoutError)
# A group's coordinator still being chosen or loading its groups: asked again, it answers.
# A fresh cluster's first group question is one (it creates `__consumer_offsets`).
COORDINATOR_MOVING = (GroupCoordinatorNotAvailableError, GroupLoadInProgressError,
                      NotCoordinatorForGroupError)
_COORDINATOR_MOVING_CODES = frozenset(e.errno for e in COORDINATOR_MOVING)
# `Admin`'s pauses between tries of a moving coordinator: the first, doubling to the longest.
_FIRST_PAUSE_S, _LONGEST_PAUSE_S = 0.05, 1.0

T = TypeVar("T")


@asynccontextmanager
async def admin_client(settings: Settings) -> AsyncIterator[Any]:
    """A started AIOKafkaAdminClient; BrokerUnavailable if no broker answers. For this
    package, tests and ops scripts: code above `stream_jobs.kafka` uses `open_admin`."""
    client = AIOKafkaAdminClient(**kafka_client_kwargs(settings, client_id="stream-jobs-admin"))
    try:
        await client.start()
        yield client
    except UNREACHABLE as exc:
        raise await connect_error(settings, exc) from exc
    finally:
        await client.close()


class Admin:
    """The admin requests stream-jobs' tools make; any `KafkaError` becomes `BrokerError`.

    A group question whose coordinator is moving is asked again for up to `patience_s`
    (the request timeout, from `open_admin`)."""

    def __init__(self, client: Any, *, patience_s: float = 30.0) -> None:
        self._client = client
        self._patience_s = patience_s

    async def _of_group(self, ask: Callable[[], Awaitable[T]]) -> T:
        """`ask()`, asked again while the group's coordinator is moving."""
        deadline = time.monotonic() + self._patience_s
        pause = _FIRST_PAUSE_S
        while True:
            try:
                return await ask()
            except COORDINATOR_MOVING:
                if time.monotonic() + pause > deadline:
                    raise
            await asyncio.sleep(pause)
            pause = min(_LONGEST_PAUSE_S, pause * 2)

    async def committed_offsets(self, group: str,
                                partitions: Sequence[TopicPartition] | None = None
                                ) -> dict[TopicPartition, int | None]:
        """The group's committed offset per partition, None where it never committed;
        without `partitions`, every partition the group has committed on."""
        if partitions is not None and not partitions:
            return {}
        try:
            offsets = await self._of_group(lambda: self._client.list_consumer_group_offsets(
                group, partitions=None if partitions is None else list(partitions)))
        except KafkaError as exc:
            raise BrokerError(f"Kafka did not return the offsets of group {group}: "
                              f"{exc}. Is the cluster healthy?") from exc
        # -1: the group has no offset for the partition (it never committed there).
        wanted = list(offsets) if partitions is None else partitions
        return {tp: (offsets[tp].offset if tp in offsets and offsets[tp].offset >= 0
                     else None) for tp in wanted}

    async def group_hosts(self, group: str) -> list[str]:
        """The client host of every member the group has now (none for an empty group)."""
        async def describe() -> dict[str, Any]:
            response = (await self._client.describe_consumer_groups([group]))[0]
            described: dict[str, Any] = response.to_object()["groups"][0]
            if described["error_code"] in _COORDINATOR_MOVING_CODES:
                raise for_code(described["error_code"])()
            return described

        try:
            described = await self._of_group(describe)
        except KafkaError as exc:
            raise BrokerError(f"Kafka did not describe consumer group {group!r}: {exc}.") \
                from exc
        if described["error_code"]:
            error = for_code(described["error_code"])
            raise BrokerError(f"Kafka did not describe consumer group {group!r} "
                              f"({error.__name__}).")
        return [str(m["client_host"]).lstrip("/") for m in described["members"]]

    async def topic_names(self) -> set[str]:
        try:
            return set(await self._client.list_topics())
        except KafkaError as exc:
            raise BrokerError(f"Kafka did not list its topics: {exc}.") from exc

    async def delete_records(self, before: Mapping[TopicPartition, int], timeout_ms: int
                             ) -> None:
        """Delete each partition's records below the offset given for it."""
        try:
            await self._client.delete_records(
                {tp: RecordsToDelete(offset) for tp, offset in before.items()},
                timeout_ms=timeout_ms)
        except KafkaError as exc:
            raise BrokerError(f"Kafka refused to delete records: {exc}.") from exc

    async def cluster(self) -> tuple[int, str | None]:
        """(brokers, cluster ID) as the cluster describes itself."""
        try:
            described: dict[str, Any] = await self._client.describe_cluster()
        except KafkaError as exc:
            raise BrokerError(f"Kafka did not describe its cluster: {exc}.") from exc
        return len(described.get("brokers", [])), described.get("cluster_id")


@asynccontextmanager
async def open_admin(settings: Settings, **options: Any) -> AsyncIterator[Admin]:
    """An `Admin` on our connection settings (plus aiokafka `options`), closed on the way
    out; a broker that does not answer is `BrokerUnavailable` (or a security error)."""
    kwargs = {**kafka_client_kwargs(settings, client_id="stream-jobs-admin"), **options}
    client = AIOKafkaAdminClient(**kwargs)
    try:
        await client.start()
        yield Admin(client, patience_s=settings.kafka_request_timeout_ms / 1000)
    except UNREACHABLE as exc:
        raise await connect_error(settings, exc) from exc
    finally:
        await client.close()


async def group_state(settings: Settings, group: str) -> tuple[str, int]:
    """(state, member count) of a consumer group as its coordinator describes it; a group
    that never existed is ("Dead", 0)."""
    async with admin_client(settings) as admin:
        described = (await admin.describe_consumer_groups([group]))[0].to_object()["groups"][0]
    return str(described["state"]), len(described["members"])


async def ensure_internal_topic(settings: Settings, name: str, configs: dict[str, str]) -> None:
    """Create one of stream-jobs' own topics (`P._stats`, `P._control`) if it is missing:
    one partition, replicated to as many brokers as there are, up to 3. Returns once the
    topic has a leader: a producer right after it (`stream-jobs throttle` on a fresh
    prefix) saw no topic while the broker's metadata lagged the controller."""
    async with admin_client(settings) as admin:
        if name not in set(await admin.list_topics()):
            brokers = len((await admin.describe_cluster())["brokers"])
            with contextlib.suppress(TopicAlreadyExistsError):  # another process made it first
                await admin.create_topics([NewTopic(
                    name, num_partitions=1, replication_factor=min(3, max(1, brokers)),
                    topic_configs=configs)])
        await until_led(admin, name, settings.kafka_request_timeout_ms / 1000)


async def until_led(admin: Any, name: str, patience_s: float) -> None:
    """Return once every partition of `name` has a leader in the broker's metadata;
    `BrokerError` after `patience_s`."""
    deadline = time.monotonic() + patience_s
    pause = _FIRST_PAUSE_S
    while True:
        [described] = await admin.describe_topics([name])
        partitions = described["partitions"]
        if described["error_code"] == 0 and partitions and all(
                p["error_code"] == 0 and p["leader"] >= 0 for p in partitions):
            return
        if time.monotonic() + pause > deadline:
            raise BrokerError(f"Kafka created {name} but gives it no leader after "
                              f"{patience_s:g} s: a broker may be down.")
        # Polling with a deadline: on a healthy cluster the metadata settles in milliseconds.
        await asyncio.sleep(pause)
        pause = min(pause * 2, _LONGEST_PAUSE_S)


__all__ = ["Admin", "admin_client", "ensure_internal_topic", "group_state", "open_admin",
           "until_led"]
