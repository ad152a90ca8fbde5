"""The job record on the wire: key, JSON value, and `sj-*` headers. Pure functions.

A record is readable by any Kafka tool: the value is the user's payload as JSON and the
envelope (job ID, type, attempt, times, lane, last failure) lives in headers, so a retry
or a dead letter carries the payload bytes unchanged.

`decode_record` is the one gate between bytes from the broker and the runtime: whatever
it is given, it returns a `JobRecord` or raises `BadRecord` with a reason code, so a
poison record is dead-lettered with its reason and never blocks its partition.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict, TypeVar, Unpack

import orjson
from typing_extensions import dataclass_transform

from stream_jobs.errors import BadRecord
from stream_jobs.failures import FailureInfo, parse_failure
from stream_jobs.job_ids import (
    MAX_JOB_ID_BYTES,
    MAX_JOB_ID_CHARS,
    control_character,
    new_job_id,
)
from stream_jobs.naming import DEFAULT_LANE, LANES
from stream_jobs.outcomes import Reason
from stream_jobs.tenants import TENANT_HEADER, tenant_from_header

HEADER_JOB_ID = "sj-job-id"
HEADER_TYPE = "sj-type"
HEADER_ATTEMPT = "sj-attempt"
HEADER_ENQUEUED_AT = "sj-enqueued-at"
HEADER_NOT_BEFORE = "sj-not-before"
HEADER_EXPIRES_AT = "sj-expires-at"
HEADER_LANE = "sj-lane"
HEADER_ORIGIN = "sj-origin"
HEADER_ERROR = "sj-error"
HEADER_REQUEUES = "sj-requeues"
HEADER_RERUN_OF = "sj-rerun-of"
HEADER_TRACEPARENT = "traceparent"
# The trace context of the attempt a retry or a dead letter came from: what a release from
# the tier, a requeue and a replay link to as "the attempt before" (stream_jobs/tracing/).
HEADER_ATTEMPT_TRACE = "sj-attempt-trace"
# Unique jobs and debounce (stream_jobs/unique/rules.py): the key a job holds, so the worker
# releases it (or checks for a newer job of it) only for jobs that carry one.
HEADER_UNIQUE = "sj-unique"
HEADER_DEBOUNCE = "sj-debounce"
# The batch or chain a job belongs to (stream_jobs/workflows/): "batch:ID" or "chain:STEP:ID".
HEADER_WORKFLOW = "sj-workflow"
# The customer a job is for: stream_jobs.tenants says what one may be.
HEADER_TENANT = TENANT_HEADER

_KNOWN_HEADERS = frozenset({
    HEADER_JOB_ID, HEADER_TYPE, HEADER_ATTEMPT, HEADER_ENQUEUED_AT, HEADER_NOT_BEFORE,
    HEADER_EXPIRES_AT, HEADER_LANE, HEADER_ORIGIN, HEADER_ERROR, HEADER_REQUEUES,
    HEADER_RERUN_OF, HEADER_TRACEPARENT, HEADER_ATTEMPT_TRACE, HEADER_UNIQUE, HEADER_DEBOUNCE,
    HEADER_WORKFLOW, HEADER_TENANT,
})
# Integers travel as plain ASCII digits; bounding the length keeps them within Kafka's
# int64 and keeps int() away from pathological inputs.
_INT_DIGITS_MAX = 19
_INT64_MAX = 2**63 - 1
# The longest unique or debounce key (a column of 255) or workflow header a job may carry.
MAX_ROW_TEXT_CHARS = 255
_ORIGIN_NUMBER = re.compile(r"[0-9]{1,19}")
# A W3C trace context: version, trace ID, parent span ID, flags (a later version may add
# fields after these four).
TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")


class Record(Protocol):
    """The fields of a consumed Kafka record that stream-jobs reads (aiokafka's
    `ConsumerRecord` has them; tests build their own)."""

    # Read-only here: nothing of ours changes a record it consumed.
    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...


class _Changes(TypedDict, total=False):
    job_id: str
    job_type: str
    payload: bytes
    key: bytes | None
    attempt: int
    enqueued_at_ms: int
    not_before_ms: int | None
    expires_at_ms: int | None
    lane: str
    origin: str | None
    failure: FailureInfo | None
    requeues: int
    rerun_of: str | None
    traceparent: str | None
    attempt_trace: str | None
    unique_key: str | None
    debounce_key: str | None
    workflow: str | None
    tenant: str | None


_T = TypeVar("_T")


@dataclass_transform(frozen_default=True)
def _hot_value(cls: type[_T]) -> type[_T]:
    """A value type built for every job (enqueue, decode): immutable to the type checker,
    a plain slotted dataclass at run time. A frozen dataclass sets each field through
    `object.__setattr__`, which made building a 14-field `JobRecord` 4x slower (4.3 us
    against 1.1, a tenth of a no-op job's worker CPU). Change one with
    `dataclasses.replace`, as for a frozen one; mypy rejects assigning to a field."""
    return dataclass(slots=True)(cls)


@_hot_value
class JobRecord:
    """One job as it travels between topics. `payload` is the raw JSON value bytes.

    Not validated on construction: `decode_record` is the gate for bytes from the broker.
    """

    job_id: str
    job_type: str
    payload: bytes
    key: bytes | None
    attempt: int = 1
    enqueued_at_ms: int = 0
    not_before_ms: int | None = None
    expires_at_ms: int | None = None
    lane: str = DEFAULT_LANE
    origin: str | None = None
    failure: FailureInfo | None = None
    requeues: int = 0
    rerun_of: str | None = None
    traceparent: str | None = None
    attempt_trace: str | None = None  # the attempt a retry or dead letter came from
    unique_key: str | None = None  # held from enqueue until the job finishes
    debounce_key: str | None = None  # of its key's jobs in one window, only the last runs
    workflow: str | None = None
    tenant: str | None = None  # the customer it is for (stream_jobs.tenants)

    def headers(self) -> list[tuple[str, bytes]]:
        """Kafka headers for this record; fields that are None are left out."""
        out = [
            (HEADER_JOB_ID, self.job_id.encode()),
            (HEADER_TYPE, self.job_type.encode()),
            (HEADER_ATTEMPT, b"%d" % self.attempt),
            (HEADER_ENQUEUED_AT, b"%d" % self.enqueued_at_ms),
            (HEADER_LANE, self.lane.encode()),
            (HEADER_REQUEUES, b"%d" % self.requeues),
        ]
        if self.not_before_ms is not None:
            out.append((HEADER_NOT_BEFORE, b"%d" % self.not_before_ms))
        if self.expires_at_ms is not None:
            out.append((HEADER_EXPIRES_AT, b"%d" % self.expires_at_ms))
        if self.origin is not None:
            out.append((HEADER_ORIGIN, self.origin.encode()))
        if self.failure is not None:
            out.append((HEADER_ERROR, self.failure.to_json()))
        if self.rerun_of is not None:
            out.append((HEADER_RERUN_OF, self.rerun_of.encode()))
        if self.traceparent is not None:
            out.append((HEADER_TRACEPARENT, self.traceparent.encode()))
        if self.attempt_trace is not None:
            out.append((HEADER_ATTEMPT_TRACE, self.attempt_trace.encode()))
        if self.unique_key is not None:
            out.append((HEADER_UNIQUE, self.unique_key.encode()))
        if self.debounce_key is not None:
            out.append((HEADER_DEBOUNCE, self.debounce_key.encode()))
        if self.workflow is not None:
            out.append((HEADER_WORKFLOW, self.workflow.encode()))
        if self.tenant is not None:
            out.append((HEADER_TENANT, self.tenant.encode()))
        return out

    def with_(self, **changes: Unpack[_Changes]) -> JobRecord:
        """A copy with `changes` applied (type-checked `dataclasses.replace`)."""
        return dataclasses.replace(self, **changes)


def decode_record(
    *,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes]],
    expected_type: str,
    max_payload_bytes: int,
    check_json: bool = True,
) -> JobRecord:
    """The job in a consumed record, or `BadRecord` saying why it is not one.

    Checks run in this order, so the reason is predictable: missing-value / too-large,
    missing-header (job ID, type), bad-header, wrong-type, bad-json. When a header
    repeats, the last one wins. Raises nothing but `BadRecord`, whatever the input.
    The size limit is checked before anything is parsed, so an oversized value costs
    no parsing; a job ID over `MAX_JOB_ID_CHARS` characters is a bad header.
    `check_json=False` skips parsing the payload, for a caller that parses it next anyway
    (the worker, whose handler's model does; it raises bad-json itself).
    """
    if value is None:
        raise BadRecord(Reason.MISSING_VALUE,
                        "The record has no value; a job's value is its JSON payload.")
    payload = _as_bytes(value)
    if payload is None:
        raise BadRecord(Reason.MISSING_VALUE, "The record's value is not bytes.")
    if len(payload) > max_payload_bytes:
        raise BadRecord(
            Reason.TOO_LARGE,
            f"The payload is {len(payload)} bytes, over the limit of {max_payload_bytes}.",
        )
    found = _our_headers(headers)
    for required in (HEADER_JOB_ID, HEADER_TYPE):
        if required not in found:
            raise BadRecord(Reason.MISSING_HEADER, f"The record has no {required!r} header.")
    # aiokafka hands keys over as bytes or None; nothing else can be a partition key.
    job = _from_headers(found, payload, _as_bytes(key))
    if job.job_type != expected_type:
        raise BadRecord(Reason.WRONG_TYPE, f"The record is a {job.job_type!r} job on a topic "
                                           f"for {expected_type!r} jobs.")
    if check_json:
        try:
            orjson.loads(payload)
        except Exception as exc:
            raise BadRecord(Reason.BAD_JSON, f"The payload is not valid JSON: {exc}.") from exc
    return job


def _from_headers(found: dict[str, bytes | None], payload: bytes, key: bytes | None
                  ) -> JobRecord:
    """The job our headers describe; `BadRecord` ("bad-header") for one that is garbled.
    Headers are read in a fixed order, so the first garbled one is the one reported."""
    job_id = _job_id(found)
    job_type = _text(found, HEADER_TYPE)
    attempt = _int(found, HEADER_ATTEMPT, default=1, minimum=1)
    enqueued_at_ms = _int(found, HEADER_ENQUEUED_AT, default=0)
    not_before_ms = _optional_int(found, HEADER_NOT_BEFORE)
    expires_at_ms = _optional_int(found, HEADER_EXPIRES_AT)
    lane = _text(found, HEADER_LANE) if HEADER_LANE in found else DEFAULT_LANE
    if lane not in LANES:
        raise BadRecord(
            Reason.BAD_HEADER,
            f"The {HEADER_LANE!r} header names {lane!r}, not one of {', '.join(LANES)}.",
        )
    return JobRecord(
        job_id=job_id, job_type=job_type, payload=payload, key=key, attempt=attempt,
        enqueued_at_ms=enqueued_at_ms, not_before_ms=not_before_ms,
        expires_at_ms=expires_at_ms, lane=lane,
        origin=_text(found, HEADER_ORIGIN) if HEADER_ORIGIN in found else None,
        requeues=_int(found, HEADER_REQUEUES, default=0),
        rerun_of=_text(found, HEADER_RERUN_OF) if HEADER_RERUN_OF in found else None,
        failure=parse_failure(found.get(HEADER_ERROR)),
        traceparent=_traceparent(found.get(HEADER_TRACEPARENT)),
        attempt_trace=_traceparent(found.get(HEADER_ATTEMPT_TRACE)),
        unique_key=_row_text(found, HEADER_UNIQUE) if HEADER_UNIQUE in found else None,
        debounce_key=_row_text(found, HEADER_DEBOUNCE) if HEADER_DEBOUNCE in found else None,
        workflow=_row_text(found, HEADER_WORKFLOW) if HEADER_WORKFLOW in found else None,
        tenant=_tenant(found.get(HEADER_TENANT)) if HEADER_TENANT in found else None,
    )


def _job_id(found: dict[str, bytes | None]) -> str:
    raw_id = found[HEADER_JOB_ID]
    if raw_id is not None and len(raw_id) > MAX_JOB_ID_BYTES:
        raise BadRecord(Reason.BAD_HEADER, f"The {HEADER_JOB_ID!r} header is {len(raw_id)} "
                                           f"bytes, over the limit of {MAX_JOB_ID_BYTES}.")
    # Longer, the dedup row could not hold it; a '/' only keeps the gateway's routes away.
    job_id = _row_text(found, HEADER_JOB_ID, MAX_JOB_ID_CHARS)
    if not job_id:
        raise BadRecord(Reason.BAD_HEADER, f"The {HEADER_JOB_ID!r} header is empty.")
    return job_id


def _row_text(found: dict[str, bytes | None], name: str,
              limit: int = MAX_ROW_TEXT_CHARS) -> str:
    """A header written to a table row and shown: over `limit`, or with a control character
    (which forges log lines; a NUL fails the row's write on every try), it is bad."""
    text = _text(found, name)
    if len(text) > limit:
        raise BadRecord(Reason.BAD_HEADER, f"The {name!r} header is {len(text)} characters, "
                                           f"over the limit of {limit}.")
    char = control_character(text)
    if char is not None:
        raise BadRecord(Reason.BAD_HEADER, f"The {name!r} header holds the control "
                                           f"character U+{ord(char):04X}.")
    return text


def _tenant(raw: bytes | None) -> str:
    """The tenant of an `sj-tenant` header; `BadRecord` ("bad-header") for one that names
    none: such a job is dead-lettered, not run under no tenant or a garbled one."""
    try:
        if raw is None:
            raise ValueError("has no bytes value")
        return tenant_from_header(raw)
    except ValueError as exc:
        raise BadRecord(Reason.BAD_HEADER, f"The {HEADER_TENANT!r} header {exc}.") from None


def _traceparent(raw: bytes | None) -> str | None:
    """Trace context is set by other tools' instrumentation too; a bad one must never
    cost a job, so it is dropped instead of rejected."""
    if raw is None:
        return None
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return None


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace ID (32 lowercase hex digits) a W3C `traceparent` names, or None when there
    is none or it is not one: what logs, `stream-jobs job` and the dashboard show."""
    found = TRACEPARENT.fullmatch(traceparent.strip().lower()) if traceparent else None
    if found is None or found.group(1) == "ff" or found.group(2) == "0" * 32:
        return None
    return found.group(2)


def decode_payload(record: JobRecord) -> Any:
    """The payload as Python values. Raises `BadRecord` ("bad-json") if it is not JSON."""
    try:
        return orjson.loads(record.payload)
    except Exception as exc:
        raise BadRecord(Reason.BAD_JSON, f"The payload is not valid JSON: {exc}.") from exc


def dead_letter_origin(topic: str, partition: int, offset: int) -> str:
    """The `sj-origin` spelling of a record's position: "topic/partition/offset"."""
    return f"{topic}/{partition}/{offset}"


def dead_letter_headers(headers: Sequence[tuple[str, bytes]] | None, *, failure: FailureInfo,
                        origin: str, job_type: str) -> list[tuple[str, bytes]]:
    """Headers for the dead letter of a record that could not be decoded.

    The original headers stay as they were (the raw record is evidence), the failure and
    origin are replaced, and a job ID and type are added when missing so DLQ tools can
    name and requeue the letter.
    """
    replaced = {HEADER_ERROR, HEADER_ORIGIN}
    kept: list[tuple[str, bytes]] = []
    for item in headers or ():
        try:
            name, raw = item
        except (TypeError, ValueError):
            continue  # not a (name, value) pair: nothing a Kafka tool could show anyway
        value = _as_bytes(raw)
        if isinstance(name, str) and value is not None and name not in replaced:
            kept.append((name, value))
    present = {name for name, _ in kept}
    if HEADER_JOB_ID not in present:
        kept.append((HEADER_JOB_ID, new_job_id().encode()))
    if HEADER_TYPE not in present:
        kept.append((HEADER_TYPE, job_type.encode()))
    kept.append((HEADER_ERROR, failure.to_json()))
    kept.append((HEADER_ORIGIN, origin.encode()))
    return kept


def parse_origin(text: str) -> tuple[str, int, int] | None:
    """(topic, partition, offset) from `dead_letter_origin` output; None if malformed."""
    if not isinstance(text, str):
        return None
    parts = text.rsplit("/", 2)
    if len(parts) != 3:
        return None
    topic, partition, offset = parts
    if not topic or not _ORIGIN_NUMBER.fullmatch(partition) or not _ORIGIN_NUMBER.fullmatch(offset):
        return None
    return topic, int(partition), int(offset)


def _our_headers(headers: Sequence[tuple[str, bytes]] | None) -> dict[str, bytes | None]:
    """Our headers by name (the last of a repeated one wins), each value as bytes, or None
    when it is not bytes-like."""
    try:
        # The common case: (str, bytes) pairs, as aiokafka hands them over.
        found: dict[str, object] = {name: raw for name, raw in headers or ()
                                    if name in _KNOWN_HEADERS}
    except (TypeError, ValueError):
        found = {}
        for item in headers or ():
            try:
                name, raw = item
            except (TypeError, ValueError):
                continue  # not a (name, value) pair, so not one of ours
            if isinstance(name, str) and name in _KNOWN_HEADERS:
                found[name] = raw
    for name, value in found.items():
        if type(value) is not bytes:
            found[name] = _as_bytes(value)
    return found  # type: ignore[return-value]  # every value is now bytes or None


def _as_bytes(raw: object) -> bytes | None:
    if isinstance(raw, bytes):
        return raw
    if isinstance(raw, bytearray | memoryview):
        return bytes(raw)
    return None


def _text(found: dict[str, bytes | None], name: str) -> str:
    raw = found.get(name)
    if raw is None:
        raise BadRecord(Reason.BAD_HEADER, f"The {name!r} header has no bytes value.")
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise BadRecord(Reason.BAD_HEADER, f"The {name!r} header is not UTF-8 text.") from exc


def _int(found: dict[str, bytes | None], name: str, *, default: int, minimum: int = 0) -> int:
    if name not in found:
        return default
    raw = found[name]
    # bytes.isdigit() is true for ASCII digits only.
    if raw is None or not raw.isdigit() or len(raw) > _INT_DIGITS_MAX:
        raise BadRecord(Reason.BAD_HEADER, f"The {name!r} header is not a non-negative integer.")
    number = int(raw)
    if number > _INT64_MAX or number < minimum:
        raise BadRecord(
            Reason.BAD_HEADER, f"The {name!r} header is {number}, outside {minimum}..{_INT64_MAX}."
        )
    return number


def _optional_int(found: dict[str, bytes | None], name: str) -> int | None:
    return _int(found, name, default=0) if name in found else None


