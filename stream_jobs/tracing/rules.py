"""What a job's spans say: their names, kinds of hop, attributes and the W3C trace context
a record carries. Pure: no OpenTelemetry here, so it is tested without it.

Attribute names are the OpenTelemetry messaging conventions' where one fits
(`messaging.system`, the destination, partition, offset, consumer group, operation) and
`stream_jobs.*` for ours (job type, ID, attempt, lane, tier, outcome, hop, tenant).
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

from stream_jobs.record import TRACEPARENT, JobRecord

# The messaging semantic conventions' names.
MESSAGING_SYSTEM = "messaging.system"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
DESTINATION = "messaging.destination.name"
PARTITION = "messaging.destination.partition.id"
OFFSET = "messaging.kafka.offset"
CONSUMER_GROUP = "messaging.consumer.group.name"
MESSAGE_KEY = "messaging.kafka.message.key"
# Ours.
JOB_TYPE = "stream_jobs.job.type"
JOB_ID = "stream_jobs.job.id"
ATTEMPT = "stream_jobs.job.attempt"
LANE = "stream_jobs.job.lane"
OUTCOME = "stream_jobs.job.outcome"
TIER = "stream_jobs.tier"
HOP = "stream_jobs.hop"
TENANT = "stream_jobs.tenant"
# On a link: what the linked span was to this one.
LINK_KIND = "stream_jobs.link"
LINK_ATTEMPT_BEFORE = "attempt-before"

KAFKA = "kafka"
SEND = "send"
PROCESS = "process"

_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16


class Hop(StrEnum):
    """Why a record is sent: the `stream_jobs.hop` of its send span."""

    ENQUEUE = "enqueue"  # a client's enqueue (the gateway's and a scheduler's too)
    OUTBOX = "outbox"  # the outbox relay sends a row a transaction wrote
    RETRY = "retry"  # a failed attempt's retry, to its delay tier
    DEAD_LETTER = "dead-letter"  # a failed attempt's dead letter
    RELEASE = "release"  # the delay relay brings a due job back to its lane
    DELAY = "delay"  # the delay relay sends a job not yet due on to the tier that fits
    REQUEUE = "requeue"  # `dlq requeue` sends a letter back to its lane
    REPLAY = "replay"  # `replay` sends a job again

    @property
    def continues(self) -> bool:
        """Whether the hop moves a job that ran or waited before, so its span links to the
        span before it (the attempt, or the write of the record it moves)."""
        return self not in _FIRST_SENDS


_FIRST_SENDS = frozenset({Hop.ENQUEUE, Hop.OUTBOX})


class TraceParent(NamedTuple):
    """A W3C `traceparent`, its IDs as integers (how OpenTelemetry holds them)."""

    trace_id: int
    span_id: int
    flags: int


def parse_traceparent(text: str | None) -> TraceParent | None:
    """The trace context of a `traceparent` header, or None when it is absent or not one
    (version `ff`, zero IDs, wrong lengths): a bad header never costs a job its run."""
    if not text:
        return None
    found = TRACEPARENT.fullmatch(text.strip().lower())
    if found is None:
        return None
    version, trace_id, span_id, flags, more = found.groups()
    if version == "ff" or trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    if version == "00" and more:
        return None  # version 00 has exactly these four fields
    return TraceParent(int(trace_id, 16), int(span_id, 16), int(flags, 16))


def format_traceparent(trace_id: int, span_id: int, flags: int) -> str:
    """The `traceparent` header (version 00) of a span's context."""
    return f"00-{trace_id:032x}-{span_id:016x}-{flags & 0xFF:02x}"


def span_name(operation: str, topic: str) -> str:
    """`send jobs.email.send`, `process jobs.email.send`: the conventions' span name."""
    return f"{operation} {topic}"


def tenant_of(job: JobRecord | object) -> str | None:
    """The tenant a job belongs to (its record's `sj-tenant`, or what a lookup found of
    it), for the `stream_jobs.tenant` attribute and the job's page; None for none."""
    return getattr(job, "tenant", None)


Attributes = dict[str, str | int]


def job_attributes(job: JobRecord) -> Attributes:
    """What every span of a job says about it: type, ID, attempt, lane (and tenant)."""
    found: Attributes = {MESSAGING_SYSTEM: KAFKA, JOB_TYPE: job.job_type, JOB_ID: job.job_id,
                         ATTEMPT: job.attempt, LANE: job.lane}
    tenant = tenant_of(job)
    if tenant is not None:
        found[TENANT] = tenant
    return found


def send_attributes(topic: str, job: JobRecord, hop: Hop, tier: str | None = None
                    ) -> Attributes:
    """A send span's attributes before the broker answered (the partition and offset
    come with its acknowledgement: `written_attributes`)."""
    found = job_attributes(job)
    found.update({OPERATION_TYPE: SEND, OPERATION_NAME: SEND, DESTINATION: topic,
                  HOP: hop.value})
    if tier is not None:
        found[TIER] = tier
    return found


def written_attributes(partition: int, offset: int) -> Attributes:
    """Where the broker put a sent record."""
    return {PARTITION: str(partition), OFFSET: offset}


def process_attributes(job: JobRecord, topic: str, partition: int, offset: int,
                       group: str) -> Attributes:
    """A process span's attributes: the job, and where its record was read."""
    found = job_attributes(job)
    found.update({OPERATION_TYPE: PROCESS, OPERATION_NAME: PROCESS, DESTINATION: topic,
                  PARTITION: str(partition), OFFSET: offset, CONSUMER_GROUP: group})
    return found


__all__ = ["Attributes", "Hop", "TraceParent", "format_traceparent", "job_attributes",
           "parse_traceparent", "process_attributes", "send_attributes", "span_name",
           "tenant_of", "written_attributes"]
