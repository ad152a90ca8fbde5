"""Dead letters as the DLQ tools see them, and what a requeue makes of one. Pure.

`read_letter` turns any DLQ record into a `Letter`, also one that is not a job (raw
bytes, garbled headers): the worker gave every dead letter a job ID and an `sj-error`
header, so even those can be listed, shown and counted. `judge` and `requeued_record`
are the requeue policy; `stream_jobs.dlq.listing` does the reading and writing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from stream_jobs.durations import parse_duration
from stream_jobs.errors import BadRecord, ConfigError
from stream_jobs.failures import FailureInfo, parse_failure
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.naming import DEFAULT_LANE
from stream_jobs.record import (
    HEADER_ATTEMPT,
    HEADER_ENQUEUED_AT,
    HEADER_ERROR,
    HEADER_JOB_ID,
    HEADER_ORIGIN,
    HEADER_REQUEUES,
    HEADER_TENANT,
    JobRecord,
    Record,
    decode_record,
)
from stream_jobs.tenants import tenant_from_header

DEFAULT_MAX_REQUEUES = 3  # the loop guard: letters requeued this often are left
UNKNOWN_REASON = "unknown"  # a letter whose sj-error header is missing or garbled
SHORT_MESSAGE_CHARS = 100
_DIGITS = re.compile(rb"[0-9]{1,19}")


@dataclass(frozen=True)
class Letter:
    """One dead letter as read from the DLQ, runnable or not.

    `job` is the decoded job, or None when the letter cannot run as this type; then
    `problem` is the decoder's reason and the other fields are read leniently from the
    headers (None, or 0 requeues, where a header is missing or garbled).
    """

    partition: int
    offset: int
    timestamp_ms: int
    job_id: str
    failure: FailureInfo | None
    attempt: int | None
    requeues: int
    enqueued_at_ms: int | None
    origin: str | None
    job: JobRecord | None
    problem: str | None

    @property
    def reason(self) -> str:
        return self.failure.reason if self.failure is not None else UNKNOWN_REASON

    @property
    def failed_at_ms(self) -> int:
        return self.failure.failed_at_ms if self.failure is not None else self.timestamp_ms

    @property
    def rank(self) -> tuple[int, int, int, int]:
        """Orders one job's letters: the newest (most requeued, latest) is the greatest."""
        return (self.requeues, self.failed_at_ms, self.timestamp_ms, self.offset)


def read_letter(record: Record, job_type: str, max_payload_bytes: int) -> Letter:
    """The letter in a DLQ record. Never raises, whatever the record holds.

    An `sj-tenant` header that names no tenant (another producer's: too long, not UTF-8,
    a control character) is dropped, so such a letter is a job of no tenant: a requeue
    runs it, and never carries the bad header back into a lane.
    """
    try:
        job = _decoded(record, job_type, max_payload_bytes)
    except BadRecord as bad:
        found = _last_headers(record.headers)
        return Letter(
            partition=record.partition, offset=record.offset, timestamp_ms=record.timestamp,
            job_id=_lenient_text(found.get(HEADER_JOB_ID)) or "",
            failure=parse_failure(found.get(HEADER_ERROR)),
            attempt=_lenient_int(found.get(HEADER_ATTEMPT)),
            requeues=_lenient_int(found.get(HEADER_REQUEUES)) or 0,
            enqueued_at_ms=_lenient_int(found.get(HEADER_ENQUEUED_AT)),
            origin=_lenient_text(found.get(HEADER_ORIGIN)), job=None, problem=bad.reason)
    return Letter(
        partition=record.partition, offset=record.offset, timestamp_ms=record.timestamp,
        job_id=job.job_id, failure=job.failure, attempt=job.attempt, requeues=job.requeues,
        enqueued_at_ms=job.enqueued_at_ms or None, origin=job.origin, job=job, problem=None)


def _decoded(record: Record, job_type: str, max_payload_bytes: int) -> JobRecord:
    headers = record.headers
    if headers and any(_bad_tenant(item) for item in headers):
        headers = [item for item in headers if not _bad_tenant(item)]
    return decode_record(key=record.key, value=record.value, headers=headers,
                         expected_type=job_type, max_payload_bytes=max_payload_bytes)


def _bad_tenant(item: object) -> bool:
    """Whether a header is an `sj-tenant` that `tenant_from_header` refuses."""
    if not isinstance(item, tuple) or len(item) != 2 or item[0] != HEADER_TENANT:
        return False
    raw = item[1]
    if not isinstance(raw, bytes | bytearray):
        return True
    try:
        tenant_from_header(bytes(raw))
    except ValueError:
        return True
    return False


def _last_headers(headers: Sequence[tuple[str, bytes]] | None) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    for item in headers or ():
        try:
            name, raw = item
        except (TypeError, ValueError):
            continue
        if isinstance(name, str) and isinstance(raw, bytes | bytearray):
            found[name] = bytes(raw)
    return found


def _lenient_text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode(errors="replace")


def _lenient_int(raw: bytes | None) -> int | None:
    return int(raw) if raw is not None and _DIGITS.fullmatch(raw) else None


class Verdict(StrEnum):
    """What `requeue` does with a selected letter."""

    REQUEUE = "requeue"
    LOOP_GUARD = "loop-guard"  # requeued max_requeues times already; left unless forced
    UNDECODABLE = "undecodable"  # not a job of this type (bad JSON, headers, type): left
    EXPIRED = "expired"  # past its expiry, so the worker would drop it; left unless forced


def judge(letter: Letter, *, force: bool, max_requeues: int, now_ms: int) -> Verdict:
    if letter.job is None:
        return Verdict.UNDECODABLE
    if force:
        return Verdict.REQUEUE
    expires = letter.job.expires_at_ms
    if expires is not None and now_ms >= expires:
        return Verdict.EXPIRED
    if letter.requeues >= max_requeues:
        return Verdict.LOOP_GUARD
    return Verdict.REQUEUE


def requeued_record(job: JobRecord, policy: JobTypePolicy, *, reset_attempts: bool,
                    now_ms: int) -> tuple[str, JobRecord]:
    """The lane and record that put a dead job back to work.

    Same job ID, key and payload; `sj-requeues` + 1; the failure and not-before cleared;
    the lane kept if the type still declares it, else the default lane; the next attempt
    number (or 1 with `reset_attempts`). An expiry already past (only a forced requeue
    gets here with one) is cleared, or the worker would drop the job without running it.
    """
    lane = job.lane if job.lane in policy.priorities else DEFAULT_LANE
    expires = job.expires_at_ms
    if expires is not None and expires <= now_ms:
        expires = None
    return lane, job.with_(attempt=1 if reset_attempts else job.attempt + 1, failure=None,
                           not_before_ms=None, lane=lane, requeues=job.requeues + 1,
                           expires_at_ms=expires)


def parse_since(text: str, now_ms: int) -> int:
    """Unix ms of `--since`: an ISO time ("2024-05-01T12:00", UTC unless it has an
    offset) or a duration ago ("90s", "1h", "2d", "1h ago"). Raises ConfigError."""
    cleaned = text.strip().removesuffix(" ago").strip()
    try:
        return now_ms - round(parse_duration(cleaned) * 1000)
    except ConfigError:
        pass
    try:
        moment = datetime.fromisoformat(cleaned)
    except ValueError:
        raise ConfigError(f"--since {text!r} is neither an ISO time such as "
                          "2024-05-01T12:00 nor a duration ago such as 1h or 30m.") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


@dataclass(frozen=True)
class LetterRow:
    """One line of `dlq list`. Times are Unix ms; None where the letter does not say."""

    job_id: str
    reason: str
    error_class: str
    message: str
    attempt: int | None
    origin: str | None
    enqueued_at_ms: int | None
    failed_at_ms: int
    partition: int
    offset: int
    requeues: int
    runnable: bool  # False: undecodable, `requeue` leaves it
    letters: int = 1  # the letters of this job in the whole DLQ (this one is its newest)

    @classmethod
    def of(cls, letter: Letter) -> LetterRow:
        failure = letter.failure
        lines = failure.message.strip().splitlines() if failure is not None else []
        message = lines[0] if lines else ""
        if len(message) > SHORT_MESSAGE_CHARS:
            message = message[: SHORT_MESSAGE_CHARS - 1] + "…"
        return cls(letter.job_id, letter.reason, failure.error_class if failure else "",
                   message, letter.attempt, letter.origin, letter.enqueued_at_ms,
                   letter.failed_at_ms, letter.partition, letter.offset, letter.requeues,
                   letter.job is not None)


__all__ = [
    "DEFAULT_MAX_REQUEUES",
    "UNKNOWN_REASON",
    "Letter",
    "LetterRow",
    "Verdict",
    "judge",
    "parse_since",
    "read_letter",
    "requeued_record",
]
