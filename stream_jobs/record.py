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
import os
import re
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, TypeVar, Unpack

import orjson
from pydantic import BaseModel
from typing_extensions import dataclass_transform

from stream_jobs.errors import BadRecord, PayloadError
from stream_jobs.naming import DEFAULT_LANE, LANES

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

# Reason codes: why a job failed or was dead-lettered (FailureInfo.reason, BadRecord.reason).
REASON_HANDLER_ERROR = "handler-error"
REASON_TIMEOUT = "timeout"
REASON_PERMANENT = "permanent"
REASON_MAX_ATTEMPTS = "max-attempts"
REASON_INVALID_PAYLOAD = "invalid-payload"
REASON_MISSING_VALUE = "missing-value"
REASON_TOO_LARGE = "too-large"
REASON_MISSING_HEADER = "missing-header"
REASON_BAD_HEADER = "bad-header"
REASON_WRONG_TYPE = "wrong-type"
REASON_BAD_JSON = "bad-json"

MAX_MESSAGE_CHARS = 1_000
MAX_TRACEBACK_CHARS = 4_000
# Job IDs end up in log lines, dedup rows (a btree key) and CLI tables; a client makes
# them at most 64 characters, so a far longer one is hostile or garbled.
MAX_JOB_ID_BYTES = 256

_KNOWN_HEADERS = frozenset(
    {
        HEADER_JOB_ID,
        HEADER_TYPE,
        HEADER_ATTEMPT,
        HEADER_ENQUEUED_AT,
        HEADER_NOT_BEFORE,
        HEADER_EXPIRES_AT,
        HEADER_LANE,
        HEADER_ORIGIN,
        HEADER_ERROR,
        HEADER_REQUEUES,
        HEADER_RERUN_OF,
        HEADER_TRACEPARENT,
    }
)
# Integers travel as plain ASCII digits; bounding the length keeps them within Kafka's
# int64 and keeps int() away from pathological inputs.
_INT_DIGITS_MAX = 19
_INT64_MAX = 2**63 - 1
_UUID7 = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", re.IGNORECASE
)
_ORIGIN_NUMBER = re.compile(r"[0-9]{1,19}")
# Random bytes per job ID, and IDs' worth fetched per os.urandom call.
_ID_RANDOM_BYTES = 10
ID_RANDOM_CHUNK = 256


@dataclass(frozen=True, slots=True)
class FailureInfo:
    """The last failure of a job, carried in the `sj-error` header as a JSON object."""

    reason: str
    error_class: str
    message: str
    traceback: str
    failed_at_ms: int

    @classmethod
    def from_exception(cls, exc: BaseException, reason: str, now_ms: int) -> FailureInfo:
        """Describe `exc`, with the message cut to 1,000 chars and the traceback to 4,000.

        The traceback keeps its last lines: that is where the error was raised.
        """
        kind = type(exc)
        name = kind.__qualname__
        if kind.__module__ != "builtins":
            name = f"{kind.__module__}.{name}"
        try:
            message = str(exc)
        except Exception:  # a broken __str__ must not cost us the dead letter
            message = f"<{name} with an unprintable message>"
        try:
            trace = "".join(traceback.format_exception(exc))
        except Exception:
            trace = ""
        return cls(
            reason=reason,
            error_class=_clean(name),
            message=_clip_head(_clean(message), MAX_MESSAGE_CHARS),
            traceback=_clip_tail_lines(_clean(trace), MAX_TRACEBACK_CHARS),
            failed_at_ms=now_ms,
        )

    def to_json(self) -> bytes:
        fields = {
            "reason": self.reason,
            "error_class": self.error_class,
            "message": self.message,
            "traceback": self.traceback,
            "failed_at_ms": self.failed_at_ms,
        }
        try:
            return orjson.dumps(fields)
        except TypeError:
            # Lone surrogates (from surrogateescape-decoded text) are not UTF-8.
            return orjson.dumps(
                {k: _clean(v) if isinstance(v, str) else v for k, v in fields.items()}
            )

    @classmethod
    def from_json(cls, raw: bytes) -> FailureInfo:
        """Parse `to_json` output. Raises ValueError if it is not one; see `parse_failure`."""
        obj = orjson.loads(raw)
        if not isinstance(obj, dict):
            raise ValueError("a failure is a JSON object")
        texts = {}
        for name in ("reason", "error_class", "message", "traceback"):
            value = obj.get(name)
            if not isinstance(value, str):
                raise ValueError(f"failure field {name!r} is not a string")
            texts[name] = value
        failed_at_ms = obj.get("failed_at_ms")
        if not isinstance(failed_at_ms, int) or isinstance(failed_at_ms, bool):
            raise ValueError("failure field 'failed_at_ms' is not an integer")
        return cls(failed_at_ms=failed_at_ms, **texts)


def parse_failure(raw: bytes | None) -> FailureInfo | None:
    """The failure in an `sj-error` header, or None if absent or garbled. Never raises.

    A garbled error header only loses the history of a job, so it is not worth
    dead-lettering the job for.
    """
    if raw is None:
        return None
    try:
        return FailureInfo.from_json(raw)
    except Exception:
        return None


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
    no parsing; a job ID over `MAX_JOB_ID_BYTES` is a bad header.
    `check_json=False` skips parsing the payload, for a caller that parses it next anyway
    (the worker, whose handler's model does; it raises bad-json itself).
    """
    if value is None:
        raise BadRecord(
            REASON_MISSING_VALUE, "The record has no value; a job's value is its JSON payload."
        )
    payload = _as_bytes(value)
    if payload is None:
        raise BadRecord(REASON_MISSING_VALUE, "The record's value is not bytes.")
    if len(payload) > max_payload_bytes:
        raise BadRecord(
            REASON_TOO_LARGE,
            f"The payload is {len(payload)} bytes, over the limit of {max_payload_bytes}.",
        )

    found = _our_headers(headers)
    for required in (HEADER_JOB_ID, HEADER_TYPE):
        if required not in found:
            raise BadRecord(REASON_MISSING_HEADER, f"The record has no {required!r} header.")

    raw_id = found[HEADER_JOB_ID]
    if raw_id is not None and len(raw_id) > MAX_JOB_ID_BYTES:
        raise BadRecord(REASON_BAD_HEADER, f"The {HEADER_JOB_ID!r} header is {len(raw_id)} "
                                           f"bytes, over the limit of {MAX_JOB_ID_BYTES}.")
    job_id = _text(found, HEADER_JOB_ID)
    if not job_id:
        raise BadRecord(REASON_BAD_HEADER, f"The {HEADER_JOB_ID!r} header is empty.")
    job_type = _text(found, HEADER_TYPE)
    attempt = _int(found, HEADER_ATTEMPT, default=1, minimum=1)
    enqueued_at_ms = _int(found, HEADER_ENQUEUED_AT, default=0)
    not_before_ms = _optional_int(found, HEADER_NOT_BEFORE)
    expires_at_ms = _optional_int(found, HEADER_EXPIRES_AT)
    lane = _text(found, HEADER_LANE) if HEADER_LANE in found else DEFAULT_LANE
    if lane not in LANES:
        raise BadRecord(
            REASON_BAD_HEADER,
            f"The {HEADER_LANE!r} header names {lane!r}, not one of {', '.join(LANES)}.",
        )
    origin = _text(found, HEADER_ORIGIN) if HEADER_ORIGIN in found else None
    requeues = _int(found, HEADER_REQUEUES, default=0)
    rerun_of = _text(found, HEADER_RERUN_OF) if HEADER_RERUN_OF in found else None
    failure = parse_failure(found.get(HEADER_ERROR))
    # Trace context is set by other tools' instrumentation too; a bad one must never
    # cost a job, so it is dropped instead of rejected.
    traceparent: str | None = None
    raw_trace = found.get(HEADER_TRACEPARENT)
    if raw_trace is not None:
        try:
            traceparent = raw_trace.decode()
        except UnicodeDecodeError:
            traceparent = None

    if job_type != expected_type:
        raise BadRecord(
            REASON_WRONG_TYPE,
            f"The record is a {job_type!r} job on a topic for {expected_type!r} jobs.",
        )
    if check_json:
        try:
            orjson.loads(payload)
        except Exception as exc:
            raise BadRecord(REASON_BAD_JSON, f"The payload is not valid JSON: {exc}.") from exc

    return JobRecord(
        job_id=job_id,
        job_type=job_type,
        payload=payload,
        # aiokafka hands keys over as bytes or None; nothing else can be a partition key.
        key=_as_bytes(key),
        attempt=attempt,
        enqueued_at_ms=enqueued_at_ms,
        not_before_ms=not_before_ms,
        expires_at_ms=expires_at_ms,
        lane=lane,
        origin=origin,
        failure=failure,
        requeues=requeues,
        rerun_of=rerun_of,
        traceparent=traceparent,
    )


def decode_payload(record: JobRecord) -> Any:
    """The payload as Python values. Raises `BadRecord` ("bad-json") if it is not JSON."""
    try:
        return orjson.loads(record.payload)
    except Exception as exc:
        raise BadRecord(REASON_BAD_JSON, f"The payload is not valid JSON: {exc}.") from exc


def encode_payload(obj: object, *, max_bytes: int | None = None) -> bytes:
    """`obj` as JSON bytes: a dict, a list, a pydantic model, or any JSON value.

    Pydantic models (also nested ones) are written as `model_dump(mode="json")`.
    Raises `PayloadError` for anything JSON cannot hold (bytes, sets, non-string keys,
    integers beyond 64 bits) or, given `max_bytes`, for a payload larger than that.
    """
    try:
        value = _model_json(obj) if isinstance(obj, BaseModel) else obj
        data = orjson.dumps(value, default=_nested)
    except (TypeError, ValueError) as exc:
        raise PayloadError(
            f"The payload cannot be written as JSON ({exc}); "
            "pass a dict, a list or a pydantic model of JSON values."
        ) from exc
    if max_bytes is not None and len(data) > max_bytes:
        raise PayloadError(
            f"The payload is {len(data)} bytes as JSON, over the limit of {max_bytes}; "
            "store large data elsewhere and enqueue a reference to it."
        )
    return data


def _model_json(model: BaseModel) -> Any:
    return model.model_dump(mode="json")


def _nested(obj: object) -> Any:
    if isinstance(obj, BaseModel):
        return _model_json(obj)
    raise TypeError(f"Type is not JSON serializable: {type(obj).__name__}")


class JobIdSource:
    """UUIDv7 job IDs (RFC 9562), strictly increasing within one source.

    Layout: 48-bit Unix ms | version 7 | 12-bit counter (rand_a) | variant | 62 random bits.
    Within one millisecond the counter increments from a random start below 2048, so
    IDs sort in creation order; if it overflows, or the clock steps back, the source
    keeps counting on its own last millisecond instead of going backwards.

    Random bits come from `os.urandom` in chunks of `ID_RANDOM_CHUNK` IDs: one system call
    per ID was a tenth of `enqueue_many`'s CPU. A forked child drops the chunk it
    inherited, so parent and child never hand out the same bits.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ms = -1
        self._counter = 0
        self._random = b""
        self._used = 0
        forget = weakref.WeakMethod(self._forget_random)
        os.register_at_fork(after_in_child=lambda: _call_if_alive(forget))

    def _forget_random(self) -> None:
        self._random = b""
        self._used = 0

    def next_id(self, now_ms: int) -> str:
        with self._lock:
            used = self._used
            if used >= len(self._random):
                self._random = os.urandom(_ID_RANDOM_BYTES * ID_RANDOM_CHUNK)
                used = 0
            self._used = used + _ID_RANDOM_BYTES
            # 80 bits: 62 for rand_b, 11 to seed the counter.
            rand = int.from_bytes(self._random[used:used + _ID_RANDOM_BYTES], "big")
            if now_ms > self._ms:
                self._ms = now_ms
                self._counter = rand >> 69
            else:
                self._counter += 1
                if self._counter > 0xFFF:
                    self._ms += 1
                    self._counter = 0
            ms, counter = self._ms, self._counter
        value = (
            (ms & 0xFFFF_FFFF_FFFF) << 80
            | 0x7 << 76
            | counter << 64
            | 0b10 << 62
            | rand & 0x3FFF_FFFF_FFFF_FFFF
        )
        text = value.to_bytes(16, "big").hex()
        return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def _call_if_alive(method: weakref.WeakMethod[Callable[[], None]]) -> None:
    bound = method()
    if bound is not None:
        bound()


_job_ids = JobIdSource()


def new_job_id() -> str:
    """A fresh UUIDv7 string; IDs from one process sort in the order they were made."""
    return _job_ids.next_id(time.time_ns() // 1_000_000)


def job_id_time_ms(job_id: str) -> int | None:
    """The Unix ms a UUIDv7 job ID was made at; None for IDs of any other shape."""
    if not isinstance(job_id, str) or not _UUID7.fullmatch(job_id):
        return None
    return int(job_id[:8] + job_id[9:13], 16)


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
        raise BadRecord(REASON_BAD_HEADER, f"The {name!r} header has no bytes value.")
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise BadRecord(REASON_BAD_HEADER, f"The {name!r} header is not UTF-8 text.") from exc


def _int(found: dict[str, bytes | None], name: str, *, default: int, minimum: int = 0) -> int:
    if name not in found:
        return default
    raw = found[name]
    # bytes.isdigit() is true for ASCII digits only.
    if raw is None or not raw.isdigit() or len(raw) > _INT_DIGITS_MAX:
        raise BadRecord(REASON_BAD_HEADER, f"The {name!r} header is not a non-negative integer.")
    number = int(raw)
    if number > _INT64_MAX or number < minimum:
        raise BadRecord(
            REASON_BAD_HEADER, f"The {name!r} header is {number}, outside {minimum}..{_INT64_MAX}."
        )
    return number


def _optional_int(found: dict[str, bytes | None], name: str) -> int | None:
    return _int(found, name, default=0) if name in found else None


def _clean(text: str) -> str:
    return text.encode("utf-8", "replace").decode("utf-8")


def _clip_head(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _clip_tail_lines(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    marker = "…\n"  # shows the reader that the top of the traceback was cut
    budget = limit - len(marker)
    kept: list[str] = []
    size = 0
    for line in reversed(text.splitlines(keepends=True)):
        if size + len(line) > budget:
            break
        kept.append(line)
        size += len(line)
    if not kept:  # the last line alone is too long: keep its end
        return marker + text[-budget:]
    return marker + "".join(reversed(kept))
