"""Where one job is, as the dedup table, the cancels and the scanned topics tell: a
`JobLocation` made of `Sighting`s (records carrying the job ID), and the status the
latest one gives. Pure: `stream_jobs.lookup.locate` does the reading."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

from stream_jobs.failures import FailureInfo, parse_failure
from stream_jobs.naming import TopicRole
from stream_jobs.plurals import counted
from stream_jobs.record import (
    HEADER_ATTEMPT,
    HEADER_ERROR,
    HEADER_JOB_ID,
    HEADER_NOT_BEFORE,
    HEADER_REQUEUES,
    HEADER_TENANT,
    HEADER_TRACEPARENT,
    HEADER_WORKFLOW,
    Record,
    trace_id_of,
)
from stream_jobs.results.rules import StoredResult
from stream_jobs.tenants import tenant_from_header

Status = Literal["done", "dead_lettered", "running", "retrying", "scheduled", "pending",
                 "finished", "not_seen", "cancelled", "superseded"]

# Of two sightings with the same requeue count, attempt and timestamp, the later role.
# A job moved from its lane to the overflow lane is there next.
_ROLE_ORDER: dict[TopicRole, int] = {"tier": 0, "lane": 1, "overflow": 2, "dlq": 3}



@dataclass(frozen=True)
class Sighting:
    """One record carrying the job ID."""

    topic: str
    role: TopicRole
    name: str  # the lane ("default"), the tier ("5s") or "dlq"
    partition: int
    offset: int
    timestamp_ms: int
    attempt: int
    requeues: int = 0
    # Its group committed past it: a lane record's job reached an outcome, a tier
    # record was put back in its lane. Always False in the DLQ.
    behind_commit: bool = False
    not_before_ms: int | None = None
    failure: FailureInfo | None = None
    workflow: str | None = None  # its `sj-workflow` header: a batch member or chain step
    trace_id: str | None = None  # of its `traceparent` header: the job's trace (docs/tracing.md)
    tenant: str | None = None  # its `sj-tenant` header, when that names a tenant
    # The record's value, the job's payload: shown only to an operator (`shown_payload`).
    payload: bytes | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class RunningOn:
    """A live worker's report lists the job in its handler (a pending job, running)."""

    worker_id: str
    attempt: int
    topic: str
    partition: int
    offset: int
    started_at_ms: int
    running_for_s: float  # when the lookup read the report


@dataclass(frozen=True)
class JobLocation:
    """Where a job is, as far as the dedup table and the scanned topics tell."""

    job_id: str
    status: Status
    job_type: str | None = None
    attempt: int | None = None
    finished_at: datetime | None = None  # from the dedup row (a cancel: when it was made)
    last: Sighting | None = None  # the sighting the status rests on
    sightings: tuple[Sighting, ...] = ()
    scanned_records: int = 0
    complete: bool = True  # False: a scan stopped at its cap, the job may be further on
    notes: tuple[str, ...] = ()
    detail: str = ""  # cancelled or superseded: when, why, by which job
    # Its row of stream_jobs_results: a kept result, or how a job that keeps one ended.
    result: StoredResult | None = None
    running_on: RunningOn | None = None  # status "running": where and since when
    # False when Postgres did not answer for the dedup row or the kept result: a job that
    # shows as finished (or done without a result) may have both, unread.
    rows_read: bool = True

    @property
    def trace_id(self) -> str | None:
        """The job's trace ID, as its latest record that carries one says (docs/tracing.md)."""
        traced = [seen for seen in self.sightings if seen.trace_id is not None]
        return traced[-1].trace_id if traced else None

    @property
    def tenant(self) -> str | None:
        """The customer the job is for, as its latest record that names one says."""
        named = [seen.tenant for seen in self.sightings if seen.tenant is not None]
        return named[-1] if named else None

    @property
    def payload(self) -> bytes | None:
        """The job's payload as its latest record carries it (None when no record was read)."""
        latest = [self.last] if self.last is not None else []
        carried = [s.payload for s in (*self.sightings, *latest) if s.payload is not None]
        return carried[-1] if carried else None

    def summary(self) -> str:
        """One sentence for a person (two when a result is kept)."""
        return self._where() + _result_sentence(self.result)

    def _where(self) -> str:
        job, last = f"Job {self.job_id}", self.last
        if self.status in ("cancelled", "superseded"):
            kind = f" ({self.job_type})" if self.job_type else ""
            return f"{job}{kind} is {self.status}: {self.detail}"
        if self.status == "running" and self.running_on is not None:
            on = self.running_on
            return (f"{job} ({self.job_type}) is running on {on.worker_id} for "
                    f"{on.running_for_s:.0f} s (attempt {on.attempt}, {on.topic} partition "
                    f"{on.partition} offset {on.offset}).")
        if self.status == "done":
            when = self.finished_at.isoformat() if self.finished_at else "an unknown time"
            return (f"{job} ({self.job_type}) is done: attempt {self.attempt} committed "
                    f"its effects at {when}.")
        if last is None:
            scope = "" if self.complete else " (the scan stopped at its cap; it may be further on)"
            return (f"{job} has no dedup row and is in none of the topics scanned "
                    f"({counted(self.scanned_records, 'record')}){scope}.")
        where = f"{last.topic} partition {last.partition} offset {last.offset}"
        if self.status == "dead_lettered":
            why = (f": {last.failure.reason}, {last.failure.error_class}: "
                   f"{last.failure.message}" if last.failure else "")
            return f"{job} is dead-lettered after attempt {last.attempt} ({where}){why}."
        if self.status == "retrying":
            due = _iso(last.not_before_ms) if last.not_before_ms else "when due"
            return (f"{job} waits in delay tier {last.name} ({where}) for attempt "
                    f"{last.attempt}, due {due}.")
        if self.status == "scheduled":
            due = _iso(last.not_before_ms) if last.not_before_ms else "when due"
            return (f"{job} waits in delay tier {last.name} ({where}) for its first attempt, "
                    f"due {due}: it was enqueued with a delay.")
        if self.status == "pending":
            return f"{job} waits in its {last.name} lane, or is running ({where})."
        return (f"{job} left its {last.name} lane after attempt {last.attempt} ({where}) "
                "without a dedup row: it succeeded without ctx.once(), or expired.")

    def to_dict(self) -> dict[str, Any]:
        def sighting(s: Sighting) -> dict[str, Any]:
            out = asdict(s)
            del out["payload"]  # only where the operator's token is (`shown_payload`)
            out["failure"] = None if s.failure is None else asdict(s.failure)
            return out

        return {
            "job_id": self.job_id, "status": self.status, "summary": self.summary(),
            "job_type": self.job_type, "attempt": self.attempt, "trace_id": self.trace_id,
            "tenant": self.tenant,
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "last": None if self.last is None else sighting(self.last),
            "sightings": [sighting(s) for s in self.sightings],
            "scanned_records": self.scanned_records, "complete": self.complete,
            "notes": list(self.notes),
            "result": None if self.result is None else self.result.to_dict(),
            "running_on": None if self.running_on is None else asdict(self.running_on),
        }

    def running(self, on: RunningOn) -> JobLocation:
        """This pending job as running `on` a worker (its report lists it in a handler)."""
        return replace(self, status="running", attempt=on.attempt, running_on=on)


RESULT_SHOWN_CHARS = 200


def _result_sentence(result: StoredResult | None) -> str:
    if result is None:
        return ""
    kept = f"kept until {result.expires_at.isoformat(timespec='seconds')}"
    if result.succeeded:
        text = result.result_json if result.result_json is not None else "null"
        if len(text) > RESULT_SHOWN_CHARS:
            text = text[:RESULT_SHOWN_CHARS] + f"... ({len(text):,} characters)"
        return f" Its result ({kept}): {text}"
    because = f": {result.error}" if result.error else ""
    return f" Its result row says {result.state} ({kept}){because}."


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def sighting_of(record: Record, job_id: str, *, role: TopicRole, name: str,
                committed: int | None) -> Sighting | None:
    """The sighting in `record` if it carries `job_id`, else None. Tolerates bad headers
    (a DLQ holds records that failed to decode): a header that does not parse is left out."""
    found = headers_of(record)
    if found.get(HEADER_JOB_ID) != job_id.encode():
        return None
    return sighting_from(record, found, role=role, name=name, committed=committed)


def headers_of(record: Record) -> dict[str, bytes]:
    """The record's headers by name (the last of a name wins); malformed ones left out."""
    found: dict[str, bytes] = {}
    for item in record.headers or ():
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], bytes):
            found[item[0]] = item[1]
    return found


def sighting_from(record: Record, found: dict[str, bytes], *, role: TopicRole, name: str,
                  committed: int | None) -> Sighting:
    """The sighting `record` is, its headers already read by `headers_of`."""
    return Sighting(
        topic=record.topic, role=role, name=name, partition=record.partition,
        offset=record.offset, timestamp_ms=int(record.timestamp),
        attempt=number_of(found.get(HEADER_ATTEMPT)) or 1,
        requeues=number_of(found.get(HEADER_REQUEUES)) or 0,
        behind_commit=committed is not None and record.offset < committed,
        not_before_ms=number_of(found.get(HEADER_NOT_BEFORE)),
        failure=parse_failure(found.get(HEADER_ERROR)),
        workflow=_text(found.get(HEADER_WORKFLOW)),
        trace_id=trace_id_of(_text(found.get(HEADER_TRACEPARENT))),
        tenant=_tenant(found.get(HEADER_TENANT)),
        payload=record.value if isinstance(record.value, bytes) else None,
    )


def _tenant(raw: bytes | None) -> str | None:
    """The tenant an `sj-tenant` header names; None for one that names none (the job
    was dead-lettered as `bad-header` for it, and its letter says why)."""
    try:
        return None if raw is None else tenant_from_header(raw)
    except ValueError:
        return None


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode(errors="replace")


def number_of(raw: bytes | None) -> int | None:
    """A header's non-negative integer, or None when it is missing or not one."""
    return int(raw) if raw is not None and raw.isdigit() and len(raw) <= 18 else None


def judge(sightings: Iterable[Sighting]) -> tuple[Status, Sighting | None]:
    """The status the latest sighting gives (without a dedup row), and that sighting.

    Latest means: most requeues, then highest attempt, then newest timestamp, then
    tier < lane < overflow < DLQ (a retry record precedes its release to the lane, which
    precedes its move to the overflow lane and a dead letter of the same attempt).
    """
    ordered = sorted(sightings, key=lambda s: (s.requeues, s.attempt, s.timestamp_ms,
                                               _ROLE_ORDER[s.role]))
    if not ordered:
        return "not_seen", None
    last = ordered[-1]
    if last.role == "dlq":
        return "dead_lettered", last
    if last.role == "tier":
        if last.behind_commit:
            # Committed by the relay: released to its lane, where the scan may not reach yet.
            return "pending", last
        return tier_state(last), last
    return ("finished" if last.behind_commit else "pending"), last


def tier_state(waiting: Sighting) -> Literal["scheduled", "retrying"]:
    """What a tier record not yet released waits for: a retry carries its failure; a
    first attempt without one waits for the delay it was enqueued with."""
    delayed = waiting.failure is None and waiting.attempt == 1
    return "scheduled" if delayed else "retrying"


def cancelled_location(job_id: str, job_type: str, reason: str | None, when: datetime,
                       notes: Sequence[str] = ()) -> JobLocation:
    """Where a cancelled job is (from its row of the cancels)."""
    said = f" Reason: {reason}." if reason else ""
    return JobLocation(job_id, "cancelled", job_type or None, None, when, notes=tuple(notes),
                       detail=f"it was cancelled at {when.isoformat(timespec='seconds')}"
                       f" and does not run again.{said}")


def superseded_location(job_id: str, by: str, notes: Sequence[str] = ()) -> JobLocation:
    """Where a debounced job that job `by` superseded is."""
    return JobLocation(job_id, "superseded", notes=tuple(notes),
                       detail=f"job {by}, enqueued later in its debounce window, runs instead.")
