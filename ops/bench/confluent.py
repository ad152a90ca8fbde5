"""A second Kafka client (issue 29, point 4): confluent-kafka (librdkafka) beside aiokafka,
and a prototype of our dispatch on it, side by side in one run:

    BENCH_ONLY=confluent .venv/bin/python -m ops.bench.run     # under a minute on a quiet box

One backlog of our job records (`enqueue_many` through our own client, so the records
carry our value, key and `sj-*` headers; 6 partitions), filled once and drained again by
each contender in every run, the order rotated from run to run:

- **aiokafka, raw** (reference): ops/bench/raw.py's getmany(500) + commit-per-batch loop.
- **confluent-kafka, raw**: the sync `Consumer.consume(num_messages=500, timeout=0.2)` in a
  loop, in this process's main thread with no event loop running, `commit(asynchronous=
  True)` every 0.5 s, `fetch.queue.backoff.ms=10` (librdkafka's default 1000 ms stalls a
  consumer that drains its prefetch queue more slowly than fetches fill it:
  /work/shared/reference/share_groups_2026_12.md), other settings at their defaults. A
  batch call returns once it has its 500 records or its timeout has passed, so the
  backlog is a multiple of 500: no last, short batch waits out the timeout in the timing.
- **confluent-kafka AIOConsumer, raw**: the same loop on the event loop, `await
  consume(...)` (each call on the AIOConsumer's thread pool) and `await commit(...)`.
- **ours** (reference): the processing section's no-op drain (`ops.bench.ours.drain`,
  ordering=key, concurrency 64), its worker group rewound after each run.
- **prototype on confluent-kafka**: our dispatch fed by `Consumer.consume(500, 0.2)` on a
  thread of its own, one batch at a time: `stream_jobs.runtime.dispatch.Dispatcher`
  (chains by key, at most 64 runners), an `OffsetTracker` per partition, `decode_record`
  as the worker calls it, the handler's `parse_payload`, a `JobContext`, and a no-op
  `async def` handler; the member's backpressure (a partition paused over its buffer,
  resumed once half of it drained) and its commits: each partition's lowest unfinished
  offset, every 0.5 s, between two fetches (a call on the consumer waits for the one in
  flight, so pauses, resumes and commits go between batches, and the batch call waits
  10 ms instead of 0.2 s while a partition is paused). The member's fetch sizes (256 KiB
  a partition, 4 MiB a fetch).
- **prototype on aiokafka**: the same prototype fed by `getmany(max_records=500)`. The
  prototype leaves out what the worker does around a job (admission: debounce, cancels,
  expiry; outcome counts and history slots; the handler's timeout watchdog; retries, dead
  letters, the relay; rebalances: one member of a fresh group), so prototype / ours alone
  would credit the client with the worker's work: prototype on confluent / prototype on
  aiokafka is what the client changes, prototype on aiokafka / ours what the rest does.

Rates run from the first record (the raw loops) or handler call (the others) to the n-th,
as in the processing section; every drain checks its count, and the prototypes that
their commit positions add up to the backlog. The AIOConsumer is measured if it works:
if it fails, the report says how and the rest still runs.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from typing import TYPE_CHECKING, Any, Protocol, cast

from aiokafka import AIOKafkaConsumer

from ops.bench.backlog import new_backlog, rewind_worker_group
from ops.bench.common import (
    FETCH_RECORDS,
    PARTITIONS,
    Bench,
    BenchError,
    Tally,
    rotated,
    run_async,
)
from ops.bench.ours import drain
from ops.bench.raw import raw_consume
from stream_jobs.context import JobContext
from stream_jobs.errors import BadRecord
from stream_jobs.handlers import new_handler
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.connection import kafka_client_kwargs
from stream_jobs.record import Record, decode_record
from stream_jobs.runtime.dispatch import Dispatcher, PartitionWork, Runner
from stream_jobs.runtime.member import drained_enough, over_buffer
from stream_jobs.runtime.worker_options import DEFAULT_MAX_BUFFERED
from stream_jobs.settings import Settings
from stream_jobs.testing.memory_dedup import MemoryDedup

if TYPE_CHECKING:  # confluent-kafka is the `bench` extra, imported when the section runs
    import confluent_kafka  # type: ignore[import-not-found,unused-ignore]

HEADING = "A second Kafka client"
PREFIX = "confluent."
JOB_TYPE = "bench.confluent"
# (key, figure name, label); the run order rotates over these.
CONTENDERS = [
    ("ref_aiokafka", "confluent.ref_aiokafka",
     "aiokafka, raw: getmany(500) + commit per batch (reference)"),
    ("raw", "confluent.raw_consume",
     "confluent-kafka, raw: Consumer.consume(500) + async commit every 0.5 s"),
    ("aio", "confluent.aio_consume",
     "confluent-kafka, raw: AIOConsumer.consume(500) + async commit every 0.5 s"),
    ("ref_ours", "confluent.ref_ours", "ours: no-op, ordering=key (reference)"),
    ("proto", "confluent.noop_key",
     "prototype: our dispatch on confluent-kafka Consumer, no-op, ordering=key"),
    ("proto_aiokafka", "confluent.proto_aiokafka",
     "the same prototype on aiokafka getmany(500)"),
]
# (name, numerator, denominator): shown in the section, not in the shared Ratios table.
RATIOS = [
    ("confluent-kafka raw / aiokafka raw", "confluent.raw_consume", "confluent.ref_aiokafka"),
    ("AIOConsumer raw / aiokafka raw", "confluent.aio_consume", "confluent.ref_aiokafka"),
    ("AIOConsumer raw / Consumer raw", "confluent.aio_consume", "confluent.raw_consume"),
    ("prototype on confluent-kafka / ours (the issue's question)", "confluent.noop_key",
     "confluent.ref_ours"),
    ("prototype on confluent-kafka / the same on aiokafka (the client's part)",
     "confluent.noop_key", "confluent.proto_aiokafka"),
    ("prototype on aiokafka / ours (the worker's part)", "confluent.proto_aiokafka",
     "confluent.ref_ours"),
    ("ours / aiokafka raw (the plain loop, as in the processing section)", "confluent.ref_ours",
     "confluent.ref_aiokafka"),
    ("prototype on confluent-kafka / confluent-kafka raw", "confluent.noop_key",
     "confluent.raw_consume"),
]
# The threshold: a prototype this much faster than ours makes the case for a
# transport option. Informational: not a goal of the bench.
PROPOSE_AT = 1.5
GOALS: list[tuple[str, str, str | None, str, float, str]] = []
# Contenders that count records read, not jobs run.
RAW_LOOPS = ("ref_aiokafka", "raw", "aio")

COMMIT_INTERVAL_S = 0.5
POLL_TIMEOUT_S = 0.2
# The prototype's fetch wait while a partition is paused for backpressure.
PAUSED_POLL_S = 0.01
CONCURRENCY = 64
# The member's fetch sizes (stream_jobs.runtime.member.GroupMember).
PARTITION_FETCH_BYTES = 256 * 1024
FETCH_MAX_BYTES = 4 * 1024 * 1024


# -- confluent-kafka's settings -------------------------------------------------------------


def confluent_conf(settings: Settings, group: str, **extra: object) -> dict[str, Any]:
    """A librdkafka consumer's configuration on the bench's (loopback, PLAINTEXT) Kafka:
    a group of its own, reading from the earliest offset, committing by hand."""
    if settings.kafka_security_protocol != "PLAINTEXT":
        raise BenchError("the confluent-kafka arm runs against a PLAINTEXT Kafka only, not "
                         f"{settings.kafka_security_protocol}")
    return {"bootstrap.servers": settings.kafka_bootstrap, "group.id": group,
            "auto.offset.reset": "earliest", "enable.auto.commit": False,
            "fetch.queue.backoff.ms": 10, **extra}


class Message(Protocol):
    """What the bench reads of a confluent-kafka `Message` (tests build their own)."""

    def error(self) -> object: ...
    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def timestamp(self) -> tuple[int, int]: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def headers(self) -> Any: ...


def client_versions() -> dict[str, str]:
    import confluent_kafka

    return {"confluent-kafka": metadata.version("confluent-kafka"),
            "librdkafka": confluent_kafka.libversion()[0]}


def _checked(messages: Sequence[Message]) -> int:
    """How many of `messages` are records; BenchError for an error among them."""
    for message in messages:
        error = message.error()
        if error is not None:
            raise BenchError(f"confluent-kafka consumer: {error}")
    return len(messages)


# -- the raw loops ----------------------------------------------------------------------------


def confluent_consume(settings: Settings, topic: str, n: int, group: str,
                      timeout_s: float = 300.0) -> float:
    """Records per second of a sync consume(500) loop committing asynchronously every
    0.5 s, first batch to the n-th record. Blocks: run it where no event loop runs."""
    from confluent_kafka import Consumer

    consumer = Consumer(confluent_conf(settings, group))
    consumer.subscribe([topic])
    try:
        deadline = time.monotonic() + timeout_s
        count = 0
        began = last_commit = 0.0
        while count < n:
            if time.monotonic() > deadline:
                raise BenchError(f"confluent consumer read {count} of {n} in {timeout_s:.0f} s")
            got = _checked(consumer.consume(num_messages=FETCH_RECORDS, timeout=POLL_TIMEOUT_S))
            if not got:
                continue
            now = time.perf_counter()
            if count == 0:
                began = last_commit = now
            count += got
            if now - last_commit >= COMMIT_INTERVAL_S:
                consumer.commit(asynchronous=True)
                last_commit = now
        rate = n / (time.perf_counter() - began)
        consumer.commit(asynchronous=False)
        return rate
    finally:
        consumer.close()


async def aio_consume(settings: Settings, topic: str, n: int, group: str,
                      timeout_s: float = 300.0) -> float:
    """`confluent_consume` on confluent-kafka's AIOConsumer: each call on its thread pool."""
    from confluent_kafka.aio import AIOConsumer

    consumer = AIOConsumer(confluent_conf(settings, group), max_workers=2)
    try:
        await consumer.subscribe([topic])
        deadline = time.monotonic() + timeout_s
        count = 0
        began = last_commit = 0.0
        while count < n:
            if time.monotonic() > deadline:
                raise BenchError(f"AIOConsumer read {count} of {n} in {timeout_s:.0f} s")
            got = _checked(await consumer.consume(num_messages=FETCH_RECORDS,
                                                  timeout=POLL_TIMEOUT_S))
            if not got:
                continue
            now = time.perf_counter()
            if count == 0:
                began = last_commit = now
            count += got
            if now - last_commit >= COMMIT_INTERVAL_S:
                await consumer.commit(asynchronous=True)
                last_commit = now
        rate = n / (time.perf_counter() - began)
        await consumer.commit(asynchronous=False)
        return rate
    finally:
        await consumer.close()


# -- the prototype: our dispatch on either client ---------------------------------------------


class Delivered:
    """A confluent-kafka `Message` as the `stream_jobs.record.Record` our dispatch reads
    (aiokafka's `ConsumerRecord` is one as it comes)."""

    __slots__ = ("headers", "key", "offset", "partition", "timestamp", "topic", "value")

    def __init__(self, message: Message) -> None:
        self.topic: str = message.topic() or ""
        self.partition: int = message.partition() or 0
        self.offset: int = message.offset() or 0
        self.timestamp: int = message.timestamp()[1]
        self.key: bytes | None = message.key()
        self.value: bytes | None = message.value()
        # librdkafka hands header values over as bytes (None for a null one), as aiokafka.
        self.headers = cast("Sequence[tuple[str, bytes]]", message.headers() or ())


def by_partition(messages: Sequence[Message]) -> dict[TopicPartition, list[Record]]:
    """A confluent-kafka batch (partitions mixed, each in offset order) as getmany hands
    one over: the records of each partition, in order. BenchError for an error message."""
    batches: dict[tuple[str, int], list[Record]] = {}
    for message in messages:
        if message.error() is not None:
            raise BenchError(f"confluent-kafka consumer: {message.error()}")
        record = Delivered(message)
        where = (record.topic, record.partition)
        batch = batches.get(where)
        if batch is None:
            batch = batches[where] = []
        batch.append(record)
    return {TopicPartition(topic, partition): batch
            for (topic, partition), batch in batches.items()}


class Prototype:
    """Our dispatch without the worker around it: records in (`take`), a no-op `async def`
    handler run on at most `concurrency` runners with per-key order, and the positions to
    commit (`due_commits`). No Kafka in it: a fetch loop feeds it and applies the pauses,
    resumes and commits it asks for. `done` is set at the `n`-th handler call."""

    def __init__(self, job_type: str, n: int, *, max_payload_bytes: int,
                 concurrency: int = CONCURRENCY) -> None:
        self.job_type = job_type
        self.n = n
        self.max_payload_bytes = max_payload_bytes
        self.tally = Tally()
        self.done = asyncio.Event()
        self.failure: BadRecord | None = None
        self.works: dict[TopicPartition, PartitionWork] = {}
        self.to_resume: set[TopicPartition] = set()
        self.pauses = 0
        self.max_buffered = max(2 * concurrency, DEFAULT_MAX_BUFFERED)
        self._dedup = MemoryDedup("bench", _publish_nothing)

        async def noop(job: dict[str, Any], ctx: JobContext) -> None:
            self.tally.hit()
            if self.tally.count == self.n:
                self.done.set()

        self._noop = noop
        self.handler = new_handler(job_type, noop, timeout=60.0, concurrency=concurrency,
                                   ordering="key")
        self.dispatcher = Dispatcher(concurrency=concurrency, handle=self._handle,
                                     chain_of=self._chain_of, on_finished=self._relieve,
                                     stopping=asyncio.Event(), name="prototype")

    def take(self, tp: TopicPartition, records: list[Record]) -> bool:
        """Dispatch one partition's fetched records (offset order); True when the partition
        should be paused (its buffer is full)."""
        work = self.works.get(tp)
        if work is None:
            work = self.works[tp] = self.dispatcher.work_for(tp)
        self.dispatcher.dispatch(work, records)
        if not work.paused and over_buffer(work, self.max_buffered):
            work.paused = True
            self.pauses += 1
            return True
        return False

    def any_paused(self) -> bool:
        return any(work.paused for work in self.works.values())

    def resumable(self) -> list[TopicPartition]:
        """Paused partitions that have drained enough to fetch again (taken once)."""
        tps = sorted(self.to_resume)
        self.to_resume.clear()
        return tps

    def due_commits(self) -> dict[TopicPartition, int]:
        """Each partition's lowest unfinished offset, where it moved since the last commit;
        taken as committed (the fetch loop commits them next)."""
        offsets = {tp: w.tracker.position for tp, w in self.works.items()
                   if w.tracker is not None and w.tracker.needs_commit}
        for tp, position in offsets.items():
            tracker = self.works[tp].tracker
            assert tracker is not None
            tracker.mark_committed(position)
        return offsets

    def position_total(self) -> int:
        """The partitions' commit positions added up (the backlog's size once a fresh
        group has drained it)."""
        return sum(w.tracker.position for w in self.works.values() if w.tracker is not None)

    def _chain_of(self, record: Record) -> Hashable:
        # The worker's chain for ordering="key" (stream_jobs.runtime.worker.Worker.chain_of).
        return record.key if record.key is not None else record.offset

    def _relieve(self, work: PartitionWork) -> None:
        if work.paused and drained_enough(work, self.max_buffered):
            work.paused = False
            self.to_resume.add(work.tp)

    async def _handle(self, work: PartitionWork, record: Record, runner: Runner) -> None:
        try:
            job = decode_record(key=record.key, value=record.value, headers=record.headers,
                                expected_type=self.job_type,
                                max_payload_bytes=self.max_payload_bytes, check_json=False)
            payload = self.handler.parse_payload(job.payload)
        except BadRecord as bad:
            self.failure = bad
            self.done.set()
            return
        ctx = JobContext(job, topic=record.topic, partition=record.partition,
                         offset=record.offset, dedup=self._dedup)
        await self._noop(payload, ctx)


def _publish_nothing(records: Sequence[Any]) -> None:
    """The in-memory dedup store's publisher: the prototype's no-op handler writes nothing."""


def outcome(proto: Prototype, what: str) -> dict[str, float]:
    if proto.failure is not None:
        raise BenchError(f"{what}: a record that is not a job: {proto.failure}")
    if proto.tally.count != proto.n:
        raise BenchError(f"{what}: {proto.tally.count} handler calls for {proto.n} jobs")
    return {"rate": proto.tally.rate()}


async def finish_runners(proto: Prototype) -> None:
    """Wait for the runners still going after the n-th call, so every offset finishes."""
    tasks = [runner.task for runner in proto.dispatcher.runners if runner.task is not None]
    await asyncio.wait_for(asyncio.gather(*tasks), 30)


async def proto_confluent(settings: Settings, topic: str, proto: Prototype, group: str,
                          timeout_s: float = 300.0) -> dict[str, float]:
    """Drain `topic` through `proto`, fed by confluent-kafka's sync Consumer on a thread."""
    from confluent_kafka import Consumer

    consumer = Consumer(confluent_conf(
        settings, group, **{"max.partition.fetch.bytes": PARTITION_FETCH_BYTES,
                            "fetch.max.bytes": FETCH_MAX_BYTES}))
    loop = asyncio.get_running_loop()
    fetcher = ThreadPoolExecutor(1, thread_name_prefix="bench-confluent-fetch")
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout_s
        last_commit = loop.time()
        while not proto.done.is_set():
            if time.monotonic() > deadline:
                raise BenchError(f"the prototype ran {proto.tally.count} of {proto.n} jobs "
                                 f"in {timeout_s:.0f} s")
            # One consumer call at a time (a call waits for the one in flight): pauses,
            # resumes and commits go between two fetches, and while a partition is paused
            # the fetch waits briefly, so a resume is not held up to the full timeout (a
            # batch call waits for its 500 records or its timeout).
            wait_s = PAUSED_POLL_S if proto.any_paused() else POLL_TIMEOUT_S
            messages = await loop.run_in_executor(fetcher, _consume, consumer, wait_s)
            for tp, records in by_partition(messages).items():
                if proto.take(tp, records):
                    consumer.pause([_confluent_tp(tp)])
            resumed = proto.resumable()
            if resumed:
                consumer.resume([_confluent_tp(tp) for tp in resumed])
            if loop.time() - last_commit >= COMMIT_INTERVAL_S:
                last_commit = loop.time()
                _commit(consumer, proto.due_commits(), asynchronous=True)
        result = outcome(proto, "prototype on confluent-kafka")
        await finish_runners(proto)
        offsets = proto.due_commits()
        await loop.run_in_executor(fetcher, lambda: _commit(consumer, offsets,
                                                            asynchronous=False))
        _check_positions(proto, "prototype on confluent-kafka")
        return result
    finally:
        await loop.run_in_executor(fetcher, consumer.close)
        fetcher.shutdown()


def _consume(consumer: confluent_kafka.Consumer, wait_s: float) -> Sequence[Message]:
    messages: Sequence[Message] = consumer.consume(num_messages=FETCH_RECORDS, timeout=wait_s)
    return messages


def _confluent_tp(tp: TopicPartition, offset: int | None = None
                  ) -> confluent_kafka.TopicPartition:
    from confluent_kafka import TopicPartition as ConfluentPartition

    if offset is None:
        return ConfluentPartition(tp.topic, tp.partition)
    return ConfluentPartition(tp.topic, tp.partition, offset)


def _commit(consumer: confluent_kafka.Consumer, offsets: dict[TopicPartition, int], *,
            asynchronous: bool) -> None:
    if not offsets:
        return
    listed = [_confluent_tp(tp, at) for tp, at in offsets.items()]
    if asynchronous:
        consumer.commit(offsets=listed, asynchronous=True)
    else:
        consumer.commit(offsets=listed, asynchronous=False)


def _check_positions(proto: Prototype, what: str) -> None:
    if proto.position_total() != proto.n:
        raise BenchError(f"{what}: commit positions add up to {proto.position_total()}, "
                         f"not the backlog's {proto.n}")


async def proto_aiokafka(settings: Settings, topic: str, proto: Prototype, group: str,
                         timeout_s: float = 300.0) -> dict[str, float]:
    """Drain `topic` through `proto`, fed by aiokafka's getmany as our member is."""
    consumer = AIOKafkaConsumer(
        topic, **kafka_client_kwargs(settings), group_id=group, enable_auto_commit=False,
        auto_offset_reset="earliest", max_partition_fetch_bytes=PARTITION_FETCH_BYTES,
        fetch_max_bytes=FETCH_MAX_BYTES)
    await consumer.start()
    loop = asyncio.get_running_loop()
    try:
        deadline = time.monotonic() + timeout_s
        last_commit = loop.time()
        while not proto.done.is_set():
            if time.monotonic() > deadline:
                raise BenchError(f"the prototype ran {proto.tally.count} of {proto.n} jobs "
                                 f"in {timeout_s:.0f} s")
            batches = await consumer.getmany(timeout_ms=int(POLL_TIMEOUT_S * 1000),
                                             max_records=FETCH_RECORDS)
            for tp, records in batches.items():
                if records and proto.take(tp, records):
                    consumer.pause(tp)
            resumed = proto.resumable()
            if resumed:
                consumer.resume(*resumed)
            if loop.time() - last_commit >= COMMIT_INTERVAL_S:
                last_commit = loop.time()
                offsets = proto.due_commits()
                if offsets:
                    await consumer.commit(offsets)
        result = outcome(proto, "prototype on aiokafka")
        await finish_runners(proto)
        offsets = proto.due_commits()
        if offsets:
            await consumer.commit(offsets)
        _check_positions(proto, "prototype on aiokafka")
        return result
    finally:
        await consumer.stop()


# -- the section --------------------------------------------------------------------------


async def _prototype_run(settings: Settings, topic: str, n: int, group: str,
                         on: str) -> float:
    proto = Prototype(JOB_TYPE, n, max_payload_bytes=settings.max_payload_bytes)
    feed = proto_confluent if on == "confluent" else proto_aiokafka
    return (await feed(settings, topic, proto, group))["rate"]


def _one(b: Bench, kind: str, topic: str, n: int, group: str) -> float:
    """One drain of the backlog by contender `kind`: its rate."""
    s = b.settings()
    if kind == "ref_aiokafka":
        return run_async(raw_consume(s, topic, n, group), 600)
    if kind == "raw":
        return confluent_consume(s, topic, n, group)
    if kind == "aio":
        return run_async(aio_consume(s, topic, n, group), 600)
    if kind == "ref_ours":
        rate = run_async(drain(s, JOB_TYPE, n, ordering="key"), 600)["rate"]
        run_async(rewind_worker_group(s, JOB_TYPE), 60)
        return rate
    on = "confluent" if kind == "proto" else "aiokafka"
    return run_async(_prototype_run(s, topic, n, group, on), 600)


def confluent(b: Bench) -> None:
    began = time.monotonic()
    load_before = os.getloadavg()[0]
    n = b.scale.backlog_n
    if n % FETCH_RECORDS:
        raise BenchError(f"the backlog ({n:,}) must be a multiple of {FETCH_RECORDS}: a "
                         "confluent-kafka batch call waits out its timeout for a short batch")
    fill_rate = new_backlog(b, JOB_TYPE, n, 1200)
    topic = f"{b.prefix}.{JOB_TYPE}"
    rates: dict[str, list[float]] = {kind: [] for kind, _, _ in CONTENDERS}
    runs: list[dict[str, Any]] = []
    details: dict[str, Any] = {
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "quick": b.quick,
        "nproc": os.cpu_count(), "jobs": n, "fill_jobs_per_s": fill_rate,
        "versions": client_versions(), "load_avg_before": load_before, "runs": runs}
    b.results.details["confluent"] = details
    for run in range(b.scale.runs):
        for kind in rotated([kind for kind, _, _ in CONTENDERS], run):
            if kind == "aio" and "aio_error" in details:
                continue
            group = f"{b.prefix}.confluent-{kind}-{run}"
            try:
                rate = _one(b, kind, topic, n, group)
            except Exception as exc:
                if kind != "aio":
                    raise
                # The AIOConsumer is measured if it works; its failure is a finding.
                details["aio_error"] = f"{type(exc).__name__}: {exc}"
                continue
            rates[kind].append(rate)
            runs.append({"run": run + 1, "contender": kind, "rate": rate,
                         "load_avg_after": os.getloadavg()[0]})
    details["load_avg_after"] = os.getloadavg()[0]
    details["took_s"] = time.monotonic() - began
    for kind, name, label in CONTENDERS:
        if rates[kind]:
            unit = "msg/s" if kind in RAW_LOOPS else "jobs/s"
            b.results.add(name, label, unit, rates[kind],
                          f"{n:,} records of our jobs, {PARTITIONS} partitions")
