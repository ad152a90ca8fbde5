"""The overflow lane: a noisy tenant's jobs move out of the way, in order, durably.

On Kafka a flood is physically ahead of the quiet tenants in the log, so fair dispatch
alone cannot reach them: the worker has to get past the flood. A worker of a type with
`[fairness]` forwards each job it reads from a lane, while its tenant is noisy
(`stream_jobs.fairness.noisy`), to `P.T.overflow`, the way a failing job hops to a delay
tier: the record as it is (key, value, headers), to the overflow partition of the lane
partition's number, and the lane offset is marked finished only once the broker
acknowledged the copy. The lane then moves on at forwarding speed (records go in batches,
one acknowledgement per batch) to the quiet tenants behind the flood.

Order per key: a record is forwarded only when no earlier record of its key waits in
the lane, and a key with records in the overflow stays sticky (its later records follow
them there, whichever tenant they are for) until the overflow has finished them, so a
key's jobs never overtake each other. The sticky keys of an overflow partition are known
to whoever owns it: the workers' group assigns lane partition p and overflow partition p
to the same member (Kafka's range assignor, over topics with the same partition count),
and a member that takes an overflow partition over reads its unfinished records' keys
first (`adopt`). A member that does not own overflow partition p never forwards from
lane partition p.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from functools import partial

from stream_jobs.kafka.clients import Producer
from stream_jobs.kafka.producer import until_acked
from stream_jobs.record import Record

log = logging.getLogger("stream_jobs.worker")


@dataclass(frozen=True, slots=True)
class _Copy:
    """A lane record as `send_many` writes it: key, value and headers as they were."""

    key: bytes | None
    payload: bytes
    raw_headers: tuple[tuple[str, bytes], ...]

    def headers(self) -> list[tuple[str, bytes]]:
        return list(self.raw_headers)


Forwarded = Callable[[Record], None]


class _Sender:
    """One lane partition's records on their way to the overflow, sent in order by one
    task at a time (a batch retried as a whole cannot overtake a later one)."""

    __slots__ = ("done", "partition", "pending", "task")

    def __init__(self, partition: int, done: Forwarded) -> None:
        self.partition = partition
        self.done = done
        self.pending: list[Record] = []
        self.task: asyncio.Task[None] | None = None


class Overflow:
    """Forwards a lane's records to the type's overflow topic and keeps keys sticky."""

    def __init__(self, producer: Producer, topic: str, stopping: asyncio.Event) -> None:
        self.producer = producer
        self.topic = topic
        self._stopping = stopping
        # Overflow partitions this member owns, and per partition the keys with records
        # there not finished yet (how many each).
        self._sticky: dict[int, Counter[bytes]] = {}
        self._senders: dict[Hashable, _Sender] = {}
        self.forwarded = 0  # records moved to the overflow, acknowledged

    def owns(self, partition: int) -> bool:
        """Whether this member may forward from lane partition `partition`."""
        return partition in self._sticky

    def sticky(self, partition: int, key: bytes | None) -> bool:
        """Whether `key`'s later records must follow earlier ones into the overflow."""
        return key is not None and key in self._sticky[partition]

    def forward(self, lane: Hashable, partition: int, record: Record, done: Forwarded) -> None:
        """Send `record` (of lane partition `lane`, number `partition`) to the overflow;
        `done(record)` once acknowledged. Its key is sticky from now on."""
        if record.key is not None:
            self._sticky[partition][record.key] += 1
        sender = self._senders.get(lane)
        if sender is None:
            sender = self._senders[lane] = _Sender(partition, done)
        sender.pending.append(record)
        if sender.task is None:
            sender.task = asyncio.create_task(self._send(lane, sender))

    async def _send(self, lane: Hashable, sender: _Sender) -> None:
        try:
            while sender.pending:
                batch, sender.pending = sender.pending, []
                await until_acked(partial(self.producer.send_many, [
                    (self.topic, _Copy(r.key, r.value or b"", tuple(r.headers)))
                    for r in batch], partition=sender.partition), self._stopping)
                self.forwarded += len(batch)
                for record in batch:
                    sender.done(record)
        except Exception as exc:  # Abandoned once stopping: the offsets stay unfinished
            log.info("forwarding to %s stopped: %s", self.topic, exc)
        finally:
            sender.task = None
            if not sender.pending:
                self._senders.pop(lane, None)

    def finished(self, partition: int, key: bytes | None) -> None:
        """A record of the overflow partition finished: one fewer for its key."""
        keys = self._sticky.get(partition)
        if keys is None or key is None:
            return
        left = keys[key] - 1
        if left > 0:
            keys[key] = left
        else:
            keys.pop(key, None)

    def adopt(self, partition: int, waiting: Iterable[bytes | None]) -> None:
        """This member owns overflow partition `partition` now; `waiting` are the keys of
        its records not finished yet (read from the group's committed offset on)."""
        self._sticky[partition] = Counter(key for key in waiting if key is not None)

    def drop(self, partition: int) -> None:
        """Overflow partition `partition` went to another member."""
        self._sticky.pop(partition, None)

    async def settle(self, lanes: Iterable[Hashable], timeout_s: float) -> None:
        """Wait up to `timeout_s` for the forwards of `lanes` (being revoked) to land."""
        tasks = [s.task for lane in lanes if (s := self._senders.get(lane)) is not None
                 and s.task is not None]
        if tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait(tasks, timeout=timeout_s)

    def sticky_keys(self) -> int:
        """Keys held to the overflow now (for reports)."""
        return sum(len(keys) for keys in self._sticky.values())


__all__ = ["Overflow"]
