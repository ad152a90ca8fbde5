"""The DLQ tools: list, show and purge one job type's dead letters (`P.T.dlq`), and the
reading they share with `stream_jobs.dlq.requeue`.

Every tool reads the DLQ up to the end offsets it saw when it started, so it terminates
on a DLQ that is still being written, and nothing here deletes a letter except `purge`.
Letters that cannot be decoded (raw bytes, garbled headers) are listed like any other
(`stream_jobs.dlq.letters` is the pure half: reading a letter, the requeue policy).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import orjson

from stream_jobs.clock import now_ms
from stream_jobs.dlq.letters import Letter, LetterRow, read_letter
from stream_jobs.dlq.tally import LatestJobs, LetterTally, job_key
from stream_jobs.errors import BrokerError, ConfigError, DlqRefused, LetterNotFound
from stream_jobs.failures import FailureInfo
from stream_jobs.job_types import JobTypePolicy, get_job_type, load_job_types
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.admin import open_admin
from stream_jobs.kafka.consumer import Consumer, open_reader
from stream_jobs.kafka.scan import PartitionRange, partitions_of, scan
from stream_jobs.naming import dlq_group, dlq_topic
from stream_jobs.record import Record
from stream_jobs.settings import Settings

# -- list and show --------------------------------------------------------------------------


@dataclass(frozen=True)
class DlqListing:
    """`dlq list`: the DLQ counted (`stream_jobs.dlq.tally`), then the rows that match.

    `letters`, `jobs` and `repeats` count the whole DLQ; `reasons` are letters per
    reason and `job_reasons` jobs per reason of their newest letter. A row is one job,
    its newest matching letter (`LetterRow.letters`: how many letters the job has in the
    whole DLQ); with `per_letter`, one row per letter. `rows` are the `limit` rows whose
    letter failed last, oldest first; `matching` letters of `matching_jobs` jobs match.
    `pending_drain` counts letters after the drain position of the group `P.T.dlq`,
    i.e. what `requeue --all` would look at.
    """

    job_type: str
    topic: str
    letters: int
    reasons: dict[str, int]
    matching: int
    rows: list[LetterRow]
    pending_drain: int
    jobs: int = 0
    repeats: int = 0
    job_reasons: dict[str, int] = field(default_factory=dict)
    matching_jobs: int = 0
    per_letter: bool = False


@dataclass(frozen=True)
class LetterDetail:
    """`dlq show`: everything one letter holds. `payload` is pretty JSON when the value
    is JSON, else the repr of its bytes. `letters` are the (partition, offset) of every
    letter with this job ID, oldest first; the newest is the one shown."""

    job_type: str
    topic: str
    job_id: str
    partition: int
    offset: int
    timestamp_ms: int
    key: str | None
    headers: list[tuple[str, str]]
    payload: str
    payload_is_json: bool
    failure: FailureInfo | None
    reason: str
    attempt: int | None
    requeues: int
    problem: str | None
    letters: list[tuple[int, int]]


async def list_letters(settings: Settings, job_type: str, *, reason: str | None = None,
                       since_ms: int | None = None, limit: int | None = None,
                       per_letter: bool = False) -> DlqListing:
    """The DLQ of `job_type` as it is now, read once: counts over every letter, and the
    rows of the letters that have `reason` and failed at or after `since_ms`."""
    policy = policy_of(settings, job_type)
    topic = dlq_topic(settings.topic_prefix, job_type)
    histogram: Counter[str] = Counter()
    whole, matched = LetterTally(), LetterTally()
    picked: LatestJobs[tuple[str, LetterRow]] = LatestJobs(limit, per_letter=per_letter)
    async with open_reader(settings) as consumer:
        spans = await dlq_spans(consumer, topic)
        async for record in scan(consumer, topic, spans):
            letter = read_letter(record, job_type, policy.payload_limit(settings))
            histogram[letter.reason] += 1
            whole.add(letter)
            if reason is not None and letter.reason != reason:
                continue
            if since_ms is not None and letter.failed_at_ms < since_ms:
                continue
            newest = matched.add(letter)
            # Rows of letters that are not the job's newest (so far) are never built.
            if newest or per_letter:
                picked.offer(letter, newest, (job_key(letter), LetterRow.of(letter)))
    pending = await pending_drain(settings, job_type, spans)
    counts, found = whole.counts, matched.counts
    rows = [replace(row, letters=whole.jobs[key].letters) for key, row in picked.rows()]
    return DlqListing(job_type, topic, counts.letters, dict(histogram.most_common()),
                      found.letters, rows, pending, jobs=counts.jobs, repeats=counts.repeats,
                      job_reasons=whole.reasons(), matching_jobs=found.jobs,
                      per_letter=per_letter)


async def show_letter(settings: Settings, job_type: str, job_id: str) -> LetterDetail:
    """The newest letter of `job_id`; LetterNotFound when the DLQ holds none."""
    policy = policy_of(settings, job_type)
    topic = dlq_topic(settings.topic_prefix, job_type)
    best: tuple[Letter, Record] | None = None
    positions: list[tuple[int, int]] = []
    async with open_reader(settings) as consumer:
        async for record in scan(consumer, topic, await dlq_spans(consumer, topic)):
            letter = read_letter(record, job_type, policy.payload_limit(settings))
            if letter.job_id != job_id:
                continue
            positions.append((letter.partition, letter.offset))
            if best is None or letter.rank > best[0].rank:
                best = (letter, record)
    if best is None:
        raise LetterNotFound(f"No letter in {topic} has job ID {job_id!r}; "
                             f"`stream-jobs dlq list {job_type}` shows the IDs it holds.")
    letter, record = best
    payload, is_json = _pretty_payload(record.value)
    return LetterDetail(
        job_type=job_type, topic=topic, job_id=job_id, partition=letter.partition,
        offset=letter.offset, timestamp_ms=letter.timestamp_ms,
        key=None if record.key is None else _readable(record.key),
        headers=[(name, _readable(value)) for name, value in record.headers],
        payload=payload, payload_is_json=is_json, failure=letter.failure,
        reason=letter.reason, attempt=letter.attempt, requeues=letter.requeues,
        problem=letter.problem, letters=sorted(positions))


def _pretty_payload(value: bytes | None) -> tuple[str, bool]:
    if value is None:
        return "None (the record has no value)", False
    try:
        return orjson.dumps(orjson.loads(value), option=orjson.OPT_INDENT_2).decode(), True
    except orjson.JSONDecodeError:
        return repr(value), False


def _readable(raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return repr(raw)


# -- purge ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PurgePlan:
    """The letters a purge deletes: each partition's records before its end snapshot."""

    job_type: str
    topic: str
    spans: tuple[PartitionRange, ...]
    pending_drain: int

    @property
    def letters(self) -> int:
        return sum(s.size for s in self.spans)


async def plan_purge(settings: Settings, job_type: str) -> PurgePlan:
    """What `purge` would delete now; `pending_drain` of those were never drained."""
    policy_of(settings, job_type)
    topic = dlq_topic(settings.topic_prefix, job_type)
    async with open_reader(settings) as consumer:
        spans = await dlq_spans(consumer, topic)
    return PurgePlan(job_type, topic, tuple(spans),
                     await pending_drain(settings, job_type, spans))


async def purge(settings: Settings, job_type: str, *, plan: PurgePlan | None = None) -> int:
    """Delete the DLQ's letters up to the end snapshot of `plan` (taken now if not given);
    letters dead-lettered after it are kept. Returns how many were deleted. Idempotent."""
    plan = plan if plan is not None else await plan_purge(settings, job_type)
    todo = {TopicPartition(plan.topic, s.partition): s.end for s in plan.spans if s.size > 0}
    if not todo:
        return 0
    async with open_admin(settings) as admin:
        try:
            await admin.delete_records(todo, timeout_ms=settings.kafka_request_timeout_ms)
        except BrokerError as exc:
            raise DlqRefused(f"Kafka refused to delete the records of {plan.topic}: {exc}. "
                              "Nothing is lost; check the topic's cleanup.policy "
                              "(delete, not compact) and try again.") from exc
    return plan.letters


# -- shared ---------------------------------------------------------------------------------


def policy_of(settings: Settings, job_type: str) -> JobTypePolicy:
    return get_job_type(load_job_types(settings.topics_dir), job_type)



async def dlq_spans(consumer: Consumer, topic: str) -> list[PartitionRange]:
    """Every partition of `topic` from its first to its end offset now."""
    try:
        parts = await partitions_of(consumer, topic)
    except ConfigError as exc:
        raise ConfigError(f"{exc} Run `stream-jobs topics apply` to create it.") from exc
    tps = [TopicPartition(topic, p) for p in parts]
    firsts = await consumer.beginning_offsets(tps)
    ends = await consumer.end_offsets(tps)
    return [PartitionRange(tp.partition, firsts[tp], ends[tp]) for tp in tps]


async def drain_starts(settings: Settings, job_type: str,
                       spans: Sequence[PartitionRange]) -> dict[int, int]:
    """Where `requeue --all` starts per partition: the group's position, clamped to what
    the partition holds (a purge may have deleted letters before it)."""
    group = dlq_group(settings.topic_prefix, job_type)
    topic = dlq_topic(settings.topic_prefix, job_type)
    tps = [TopicPartition(topic, s.partition) for s in spans]
    async with open_admin(settings) as admin:
        try:
            committed = await admin.committed_offsets(group, tps)
        except BrokerError as exc:
            raise DlqRefused(f"Kafka did not say where the group {group} is ({exc}); check "
                             "that these credentials may describe consumer groups.") from exc
    starts = {}
    for span, tp in zip(spans, tps, strict=True):
        at = committed.get(tp)
        offset = at if at is not None else span.start
        starts[span.partition] = min(max(offset, span.start), span.end)
    return starts


async def pending_drain(settings: Settings, job_type: str,
                        spans: Sequence[PartitionRange]) -> int:
    starts = await drain_starts(settings, job_type, spans)
    return sum(s.end - starts[s.partition] for s in spans)


__all__ = [
    "DlqListing",
    "DlqRefused",
    "LetterDetail",
    "LetterNotFound",
    "PurgePlan",
    "dlq_spans",
    "drain_starts",
    "list_letters",
    "now_ms",
    "pending_drain",
    "plan_purge",
    "policy_of",
    "purge",
    "show_letter",
]
