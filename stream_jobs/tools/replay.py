"""`stream-jobs replay`: the jobs in a range of records, written again to their lane.

`replay` reads a range of any of our topics (a lane, a delay tier, a DLQ) without a
consumer group and writes each job again to its lane, waiting for every acknowledgement.
It never changes the source, so stopping it part-way loses nothing: the result (or the
`ReplayInterrupted` message) says where to resume. Without `rerun` the job IDs are kept,
so `ctx.once()` acknowledges jobs that already finished without running them; with
`rerun` each job gets a new ID and `sj-rerun-of` names the original.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from stream_jobs import clock
from stream_jobs.durations import parse_duration
from stream_jobs.errors import (
    BadRecord,
    ConfigError,
    PublishError,
    ReplayInterrupted,
    StreamJobsError,
)
from stream_jobs.job_ids import new_job_id
from stream_jobs.job_types import JobTypePolicy, get_job_type, load_job_types
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.consumer import Consumer, open_reader
from stream_jobs.kafka.producer import JobProducer
from stream_jobs.kafka.scan import PartitionRange, partitions_of, ranges, scan
from stream_jobs.naming import DEFAULT_LANE, TopicRef, lane_topic, parse_topic
from stream_jobs.record import JobRecord, decode_record
from stream_jobs.runtime.heartbeats import is_heartbeat
from stream_jobs.settings import Settings
from stream_jobs.tracing import Hop, job_spans

log = logging.getLogger("stream_jobs.replay")

BATCH_RECORDS = 500  # written pipelined, then every acknowledgement awaited
SEND_ATTEMPTS = 5  # per batch; a batch sent again keeps its job IDs, so dedup covers it
MAX_LISTED_SKIPS = 1_000
_AGO = re.compile(r"^\s*(.+?)\s*(?:ago)?\s*$")


# -- pure parts ---------------------------------------------------------------------------


def parse_time_ms(text: str, *, now_ms: int) -> int:
    """Unix ms of `text`: ISO 8601 ("2024-05-01T03:00:00Z"; no zone means UTC) or a
    duration ago ("2h", "30m ago"). Raises ConfigError."""
    match = _AGO.match(text)
    spoken = match.group(1) if match else text
    with contextlib.suppress(ConfigError):
        return now_ms - round(parse_duration(spoken) * 1000)
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(
            f"{text!r} is not a time: write ISO 8601 such as 2024-05-01T03:00:00Z, or a "
            "duration ago such as 2h.") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return round(when.timestamp() * 1000)


def parse_lane_target(text: str) -> tuple[str, str | None]:
    """("email.send", "high") from "email.send:high"; the lane is None without ":"."""
    job_type, sep, lane = text.partition(":")
    if not job_type or (sep and not lane):
        raise ConfigError(f"{text!r} is not a lane: write TYPE or TYPE:priority, e.g. "
                          "email.send:high.")
    return job_type, lane or None


def check_selection(*, partition: int | None, from_offset: int | None, to_offset: int | None,
                    from_time_ms: int | None, to_time_ms: int | None) -> None:
    """ConfigError for a selection that cannot be meant: no start, offsets without a
    partition, negative numbers, or an end before the start."""
    if from_offset is None and from_time_ms is None:
        raise ConfigError("Say where to start: give --from-offset N or --from-time T.")
    if partition is not None and partition < 0:
        raise ConfigError(f"Partition {partition} does not exist; partitions count from 0.")
    if (from_offset is not None or to_offset is not None) and partition is None:
        raise ConfigError("Offsets are per partition: give --partition with --from-offset "
                          "and --to-offset.")
    for name, offset in (("--from-offset", from_offset), ("--to-offset", to_offset)):
        if offset is not None and offset < 0:
            raise ConfigError(f"{name} {offset} is negative; offsets count from 0.")
    if from_offset is not None and to_offset is not None and to_offset < from_offset:
        raise ConfigError(f"--to-offset {to_offset} is before --from-offset {from_offset}.")
    if from_time_ms is not None and to_time_ms is not None and to_time_ms < from_time_ms:
        raise ConfigError("--to-time is before --from-time.")


def replayed(job: JobRecord, *, job_type: str, lane: str, rerun: bool, now_ms: int,
             new_id: Callable[[], str] = new_job_id) -> JobRecord:
    """The record a replay writes for `job`: a first attempt, due now, with no last error.

    Without `rerun` the job ID (hence its dedup row) is kept. With `rerun` the job is a
    new one: new ID, `rerun_of` = the replayed ID, enqueued now, no origin yet, and no
    batch or chain membership.
    The key, payload, expiry, trace context and requeue count are kept.
    """
    fresh = job.with_(job_type=job_type, lane=lane, attempt=1, not_before_ms=None,
                      failure=None)
    if not rerun:
        return fresh
    # A new job is no member of the old one's batch or chain: it would count twice there.
    return fresh.with_(job_id=new_id(), rerun_of=job.job_id, enqueued_at_ms=now_ms,
                       origin=None, workflow=None)


class Pace:
    """At most `rate_per_s` records a second, with no credit: time lost before a record (a
    slow start, a stalled fetch) is not made up afterwards by a burst above the rate."""

    def __init__(self, rate_per_s: float, now_s: float) -> None:
        self.interval_s = 1.0 / rate_per_s
        self._next_s = now_s

    def wait_s(self, now_s: float) -> float:
        """Seconds to wait before the next record; its slot is taken."""
        wait = max(0.0, self._next_s - now_s)
        self._next_s = max(self._next_s, now_s) + self.interval_s
        return wait


# -- replay -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Skipped:
    """A record in the range that is not a job (it is left where it is)."""

    partition: int
    offset: int
    reason: str
    message: str


@dataclass
class ReplayResult:
    """What a replay selected, wrote and skipped; filled in as it runs."""

    topic: str
    selected: list[PartitionRange]
    target: str  # where the jobs go, in words
    rerun: bool
    dry_run: bool
    read: int = 0
    written: int = 0  # acknowledged by the broker (in a dry run: would be written)
    # (source partition, job type, destination topic) -> records
    counts: Counter[tuple[int, str, str]] = field(default_factory=Counter)
    skipped: list[Skipped] = field(default_factory=list)
    skipped_total: int = 0
    expired: int = 0  # past their expiry: the worker will count them expired, not run them
    # source partition -> last offset whose record is written (acknowledged) or skipped
    done_through: dict[int, int] = field(default_factory=dict)

    @property
    def planned(self) -> int:
        return sum(part.size for part in self.selected)

    def resume_offsets(self) -> dict[int, int]:
        """Partition -> the offset to start again from, for each partition not finished."""
        todo: dict[int, int] = {}
        for part in self.selected:
            next_offset = max(part.start, self.done_through.get(part.partition, -1) + 1)
            if part.size and next_offset < part.end:
                todo[part.partition] = next_offset
        return todo

    def headers_note(self) -> str:
        """One sentence on what happens to the jobs' headers, for plans and summaries."""
        common = "attempt reset to 1, not-before and last error cleared"
        if self.rerun:
            return (f"New job IDs, each with sj-rerun-of = the original ID ({common}): "
                    "handlers run again.")
        return (f"Job IDs kept ({common}): ctx.once() acknowledges jobs that already "
                "finished without running them.")


class ReplayProgress(Protocol):
    """What a caller (the CLI's progress bar) is told while a replay runs."""

    def started(self, result: ReplayResult) -> None:
        """The range is known (`result.selected`, `planned`); nothing is read yet."""

    def advanced(self, result: ReplayResult) -> None:
        """More records were read and, unless a dry run, acknowledged."""


@dataclass(frozen=True)
class _Target:
    policy: JobTypePolicy
    lane: str | None  # None: each job's own lane

    def lane_of(self, job: JobRecord) -> str:
        lane = self.lane or job.lane
        # A lane the type no longer declares goes to default, as the relay does.
        return lane if lane in self.policy.priorities else DEFAULT_LANE

    def describe(self, prefix: str) -> str:
        if self.lane is not None:
            return lane_topic(prefix, self.policy.job_type, self.lane)
        return f"each job's lane of {self.policy.job_type}"


async def replay(settings: Settings, topic: str, *, partition: int | None,
                 from_offset: int | None, to_offset: int | None = None,
                 from_time_ms: int | None = None, to_time_ms: int | None = None,
                 to_lane: str | None = None, rerun: bool = False, dry_run: bool = False,
                 rate_per_s: float | None = None,
                 progress: ReplayProgress | None = None) -> ReplayResult:
    """Write the jobs in a range of `topic` again to their lane (or `to_lane`).

    The range: one partition (or all, for a time range) from `from_offset` (inclusive)
    to `to_offset` (inclusive), and/or records stamped from `from_time_ms` (inclusive)
    to `to_time_ms` (exclusive); the end is the partition's end when the replay starts.
    Records that are not jobs are skipped and listed. A dry run reads and counts, and
    writes nothing. Raises ConfigError (one sentence) before anything is written when the
    selection or the target is wrong, and `ReplayInterrupted` if the broker fails midway.
    """
    check_selection(partition=partition, from_offset=from_offset, to_offset=to_offset,
                    from_time_ms=from_time_ms, to_time_ms=to_time_ms)
    if rate_per_s is not None and rate_per_s <= 0:
        raise ConfigError("--rate must be above zero, e.g. 200/s.")
    prefix = settings.topic_prefix
    source = parse_topic(prefix, topic)
    async with open_reader(settings) as consumer:
        await partitions_of(consumer, topic)  # a typo says so before anything else
        types = load_job_types(settings.topics_dir)
        target = _target(types, get_job_type(types, source.job_type), to_lane)
        selected = await _select(consumer, topic, partition, from_offset, to_offset,
                                 from_time_ms, to_time_ms)
        await _lanes_exist(consumer, prefix, target)
        result = ReplayResult(topic, selected, target.describe(prefix), rerun, dry_run)
        if progress is not None:
            progress.started(result)
        if result.planned == 0:
            return result
        async with contextlib.AsyncExitStack() as stack:
            producer = None
            if not dry_run:
                producer = await stack.enter_async_context(JobProducer(settings))
            pace = None if dry_run else rate_per_s  # reading alone needs no pacing
            copier = _Copier(settings, source, target, result, producer, pace, progress)
            try:
                async for record in scan(consumer, topic, selected):
                    await copier.take(record)
                await copier.flush()
            except StreamJobsError as exc:
                raise ReplayInterrupted(_stopped(result, exc)) from exc
    return result


def _target(types: Mapping[str, JobTypePolicy], source: JobTypePolicy,
            to_lane: str | None) -> _Target:
    if to_lane is None:
        return _Target(source, None)
    job_type, lane = parse_lane_target(to_lane)
    policy = get_job_type(types, job_type)
    lane = lane or DEFAULT_LANE
    if lane not in policy.priorities:
        raise ConfigError(f"Job type {job_type!r} has no {lane!r} lane; it declares "
                          f"{', '.join(policy.priorities)} (priorities in its TOML file).")
    return _Target(policy, lane)


async def _select(consumer: Consumer, topic: str, partition: int | None, from_offset: int | None,
                  to_offset: int | None, from_time_ms: int | None,
                  to_time_ms: int | None) -> list[PartitionRange]:
    chosen = None if partition is None else [partition]
    selected = await ranges(consumer, topic, partitions=chosen, from_offset=from_offset,
                            to_offset=to_offset, from_time_ms=from_time_ms,
                            to_time_ms=to_time_ms)
    if partition is not None and to_offset is not None:
        # `ranges` stops at the end; an end past it is a typo worth a question.
        tp = TopicPartition(topic, partition)
        first = (await consumer.beginning_offsets([tp]))[tp]
        end = (await consumer.end_offsets([tp]))[tp]
        if to_offset >= end:
            held = f"offsets {first} to {end - 1}" if end > first else "no records"
            raise ConfigError(f"Offset {to_offset} is out of range for {topic} partition "
                              f"{partition}, which holds {held}.")
    return selected


async def _lanes_exist(consumer: Consumer, prefix: str, target: _Target) -> None:
    lanes = ([target.lane] if target.lane is not None else list(target.policy.priorities))
    for lane in lanes:
        name = lane_topic(prefix, target.policy.job_type, lane)
        try:
            await partitions_of(consumer, name)
        except ConfigError:
            raise ConfigError(f"The lane {name} does not exist yet: run "
                              "`stream-jobs topics apply` first.") from None


class _Copier:
    """Decodes, rewrites and batches the records of a replay; a batch is written pipelined
    and every acknowledgement awaited before the next, so `done_through` is durable."""

    def __init__(self, settings: Settings, source: TopicRef, target: _Target,
                 result: ReplayResult, producer: JobProducer | None,
                 rate_per_s: float | None, progress: ReplayProgress | None) -> None:
        self.source = source
        self.target = target
        self.result = result
        self.producer = producer
        self.progress = progress
        self.prefix = settings.topic_prefix
        self.max_payload_bytes = (target.policy.max_payload_bytes
                                  or settings.max_payload_bytes)
        self.pace = None if rate_per_s is None else Pace(rate_per_s, time.monotonic())
        self.batch_limit = BATCH_RECORDS if rate_per_s is None else max(
            1, min(BATCH_RECORDS, int(rate_per_s)))
        self.batch: list[tuple[str, JobRecord]] = []
        self.marks: dict[int, int] = {}
        self.pending = 0  # records read into this batch, skipped ones included

    async def take(self, record: Any) -> None:
        if self.pace is not None:
            wait_s = self.pace.wait_s(time.monotonic())
            if wait_s > 0:
                await self.flush()
                await asyncio.sleep(wait_s)  # pacing to --rate, not waiting for a condition
        self.result.read += 1
        self.pending += 1
        self.marks[record.partition] = record.offset
        try:
            if is_heartbeat(record.key, record.headers):
                job = None  # the workers' liveness records: not jobs, nothing to replay
            else:
                job = decode_record(key=record.key, value=record.value, headers=record.headers,
                                    expected_type=self.source.job_type,
                                    max_payload_bytes=self.max_payload_bytes)
        except BadRecord as bad:
            self._skip(record, bad)
            job = None
        if job is not None:
            now_ms = clock.now_ms()
            lane = self.target.lane_of(job)
            out = replayed(job, job_type=self.target.policy.job_type, lane=lane,
                           rerun=self.result.rerun, now_ms=now_ms)
            if out.expires_at_ms is not None and out.expires_at_ms <= now_ms:
                self.result.expired += 1
            destination = lane_topic(self.prefix, out.job_type, lane)
            self.batch.append((destination, out))
            self.result.counts[(record.partition, out.job_type, destination)] += 1
        if self.pending >= self.batch_limit:
            await self.flush()

    def _skip(self, record: Any, bad: BadRecord) -> None:
        self.result.skipped_total += 1
        if len(self.result.skipped) < MAX_LISTED_SKIPS:
            self.result.skipped.append(
                Skipped(record.partition, record.offset, bad.reason, bad.message))

    async def flush(self) -> None:
        if self.batch and self.producer is not None:
            await _send(self.producer, self.batch)
        self.result.written += len(self.batch)
        self.result.done_through.update(self.marks)
        self.batch = []
        self.marks = {}
        if self.pending and self.progress is not None:
            self.progress.advanced(self.result)
        self.pending = 0


async def _send(producer: JobProducer, batch: Sequence[tuple[str, JobRecord]]) -> None:
    backoff_s = 0.5
    spans = job_spans()  # a replay continues each job's trace, if traced
    for attempt in range(1, SEND_ATTEMPTS + 1):
        try:
            if spans is None:
                await producer.send_many(batch)
            else:
                await spans.send_many(producer.send_many, list(batch), Hop.REPLAY)
            return
        except PublishError as exc:
            if attempt == SEND_ATTEMPTS:
                raise
            log.warning("replay batch not acknowledged, sending it again in %.1f s: %s",
                        backoff_s, exc)
            await asyncio.sleep(backoff_s)  # backoff before a retry
            backoff_s *= 2


def _stopped(result: ReplayResult, exc: BaseException) -> str:
    cause = str(exc).rstrip(".")
    text = (f"Replay of {result.topic} stopped after {result.written} of {result.planned} "
            f"records were written ({cause}).")
    return f"{text} {resume_hint(result)}"


def resume_hint(result: ReplayResult) -> str:
    """How to continue an interrupted replay, as a sentence or two."""
    todo = result.resume_offsets()
    if not todo:
        return "Every record of the range was written."
    where = "; ".join(f"--partition {p} --from-offset {o}" for p, o in sorted(todo.items()))
    text = f"To continue, run it again with {where} (keeping the other options)"
    if result.rerun:
        return (f"{text}; do not replay the whole range again with --rerun, or the "
                "records already written run twice.")
    return f"{text}; replaying the whole range again is also safe, as job IDs are kept."


__all__ = [
    "Pace",
    "ReplayInterrupted",
    "ReplayProgress",
    "ReplayResult",
    "Skipped",
    "check_selection",
    "parse_lane_target",
    "parse_time_ms",
    "replay",
    "replayed",
    "resume_hint",
]
