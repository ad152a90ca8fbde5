"""Where the runtime gets its Kafka clients: the `KafkaClients` seam, and aiokafka's.

A worker, its relay, a `JobClient` and a scheduler make their consumers and producers
through a `KafkaClients`; `AIOKAFKA` (the default everywhere) makes the real ones of this
package. `stream_jobs.testing` passes an in-memory one instead, so a test runs the same
`Worker` and `Relay` without a broker. `Producer` is the surface of `JobProducer` the
runtime writes through.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from stream_jobs.kafka.admin import ensure_internal_topic
from stream_jobs.kafka.consumer import Consumer, new_consumer
from stream_jobs.kafka.producer import JobProducer, Outgoing, Written
from stream_jobs.record import JobRecord
from stream_jobs.settings import Settings


class Producer(Protocol):
    """What the runtime writes through (`JobProducer`'s names and meanings): every send
    returns once the record is acknowledged, or raises `PublishError`."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def warm(self, topics: Sequence[str]) -> None: ...

    async def send(self, topic: str, record: JobRecord, *,
                   partition: int | None = None) -> Written: ...

    async def send_raw(self, topic: str, key: bytes | None, value: bytes | None,
                       headers: Sequence[tuple[str, bytes]], *,
                       partition: int | None = None) -> Written: ...

    async def send_many(self, items: Sequence[tuple[str, Outgoing]], *,
                        partition: int | None = None) -> list[Written]: ...


class KafkaClients(Protocol):
    """Makes the Kafka clients of a worker, a relay, a client or a scheduler."""

    def consumer(self, settings: Settings, **options: Any) -> Consumer:
        """A consumer, not started (`new_consumer`'s meaning of `options`)."""
        ...

    def producer(self, settings: Settings) -> Producer:
        """A producer, not started."""
        ...

    async def ensure_internal_topic(self, settings: Settings, name: str,
                                    configs: dict[str, str]) -> None:
        """Create one of stream-jobs' own topics (`P._stats`) if it is missing."""
        ...


class _Aiokafka:
    """The real clients: `new_consumer`, `JobProducer` and the admin client."""

    def consumer(self, settings: Settings, **options: Any) -> Consumer:
        return new_consumer(settings, **options)

    def producer(self, settings: Settings) -> Producer:
        return JobProducer(settings)

    async def ensure_internal_topic(self, settings: Settings, name: str,
                                    configs: dict[str, str]) -> None:
        await ensure_internal_topic(settings, name, configs)


AIOKAFKA: KafkaClients = _Aiokafka()

__all__ = ["AIOKAFKA", "KafkaClients", "Producer"]
