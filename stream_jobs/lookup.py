"""`stream-jobs job JOB_ID`: what happened to one job.

In order: the cancels (a cancelled job, and a debounced job a newer one superseded, is
that whatever Kafka still holds), the dedup table (a row means the job's `ctx.once()`
transaction committed: done) and its row of `stream_jobs_results` if it keeps one (its
result, or how it ended without one: docs/results.md), then a bounded scan of the type's
lanes, delay tiers and DLQ for records carrying the job ID. The latest sighting tells
where the job is: dead-lettered, waiting in a tier (for a retry, or, never having failed,
for the delay it was enqueued with), waiting (or running) in a lane, or finished in its
lane without a dedup row.

`client.result` reads the same evidence when a job has no row of kept results
(`result_error`, `not_in_time`): how the job ended, or that no result of it will come.

Cost: the scan reads every record (payloads included) written to those topics since the
job ID's creation time less a minute of clock slack (UUIDv7 IDs carry it), and at most
`max_records_per_topic` records per topic; an ID without a time (one given by the
producer) is looked for from the beginning of each topic within the same cap. Without
`--type` every declared type is scanned. When the cap cuts a scan short the result says
so (`complete` is False).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from stream_jobs.cancels.store import CancelStore
from stream_jobs.dedup.store import DedupStore
from stream_jobs.errors import (
    ConfigError,
    DatabaseUnavailable,
    JobCancelled,
    JobFailed,
    ResultNotKept,
    ResultTimeout,
    StreamJobsError,
)
from stream_jobs.failures import FailureInfo, parse_failure
from stream_jobs.job_ids import job_id_time_ms
from stream_jobs.job_types import JobTypePolicy, get_job_type
from stream_jobs.kafka import TopicPartition, scan
from stream_jobs.kafka.admin import open_admin
from stream_jobs.kafka.consumer import open_reader
from stream_jobs.naming import TopicRole, relay_group, worker_group
from stream_jobs.plurals import counted
from stream_jobs.postgres.pool import DRIVER_ERRORS, MISSING_TABLE
from stream_jobs.record import (
    HEADER_ATTEMPT,
    HEADER_ERROR,
    HEADER_JOB_ID,
    HEADER_NOT_BEFORE,
    HEADER_REQUEUES,
    HEADER_WORKFLOW,
    Record,
)
from stream_jobs.results.rules import StoredResult
from stream_jobs.results.store import ResultReader
from stream_jobs.settings import Settings
from stream_jobs.unique.release import KeyStore

Status = Literal["done", "dead_lettered", "retrying", "scheduled", "pending", "finished",
                 "not_seen", "cancelled", "superseded"]

DEFAULT_MAX_RECORDS_PER_TOPIC = 100_000
# Producers', workers' and brokers' clocks disagree a little; look this much earlier.
SCAN_SLACK_MS = 60_000
# Of two sightings with the same requeue count, attempt and timestamp, the later role.
_ROLE_ORDER: dict[TopicRole, int] = {"tier": 0, "lane": 1, "dlq": 2}


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

    def summary(self) -> str:
        """One sentence for a person (two when a result is kept)."""
        return self._where() + _result_sentence(self.result)

    def _where(self) -> str:
        job, last = f"Job {self.job_id}", self.last
        if self.status in ("cancelled", "superseded"):
            kind = f" ({self.job_type})" if self.job_type else ""
            return f"{job}{kind} is {self.status}: {self.detail}"
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
            out["failure"] = None if s.failure is None else asdict(s.failure)
            return out

        return {
            "job_id": self.job_id, "status": self.status, "summary": self.summary(),
            "job_type": self.job_type, "attempt": self.attempt,
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "last": None if self.last is None else sighting(self.last),
            "sightings": [sighting(s) for s in self.sightings],
            "scanned_records": self.scanned_records, "complete": self.complete,
            "notes": list(self.notes),
            "result": None if self.result is None else self.result.to_dict(),
        }


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


# ---------------------------------------------------------------------------------------
# Pure parts.


def sighting_of(record: Record, job_id: str, *, role: TopicRole, name: str,
                committed: int | None) -> Sighting | None:
    """The sighting in `record` if it carries `job_id`, else None. Tolerates bad headers
    (a DLQ holds records that failed to decode): a header that does not parse is left out."""
    wanted = job_id.encode()
    found: dict[str, bytes] = {}
    for item in record.headers or ():
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], bytes):
            found[item[0]] = item[1]
    if found.get(HEADER_JOB_ID) != wanted:
        return None
    return Sighting(
        topic=record.topic, role=role, name=name, partition=record.partition,
        offset=record.offset, timestamp_ms=int(record.timestamp),
        attempt=_number(found.get(HEADER_ATTEMPT)) or 1,
        requeues=_number(found.get(HEADER_REQUEUES)) or 0,
        behind_commit=committed is not None and record.offset < committed,
        not_before_ms=_number(found.get(HEADER_NOT_BEFORE)),
        failure=parse_failure(found.get(HEADER_ERROR)),
        workflow=_text(found.get(HEADER_WORKFLOW)),
    )


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode(errors="replace")


def _number(raw: bytes | None) -> int | None:
    return int(raw) if raw is not None and raw.isdigit() and len(raw) <= 18 else None


def judge(sightings: Iterable[Sighting]) -> tuple[Status, Sighting | None]:
    """The status the latest sighting gives (without a dedup row), and that sighting.

    Latest means: most requeues, then highest attempt, then newest timestamp, then
    tier < lane < DLQ (a retry record precedes its release to the lane, which precedes
    a dead letter of the same attempt).
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
        # A retry carries its failure; a first attempt without one waits for its delay.
        delayed = last.failure is None and last.attempt == 1
        return ("scheduled" if delayed else "retrying"), last
    return ("finished" if last.behind_commit else "pending"), last


def capped(ranges: Sequence[scan.PartitionRange], max_records: int
           ) -> tuple[list[scan.PartitionRange], bool]:
    """The ranges cut to share `max_records` between partitions (from each range's
    start), and whether anything was cut."""
    if not ranges:
        return [], False
    each = max(1, max_records // len(ranges))
    cut = [scan.PartitionRange(r.partition, r.start, min(r.end, r.start + each))
           for r in ranges]
    return cut, any(c.end < r.end for c, r in zip(cut, ranges, strict=True))


# ---------------------------------------------------------------------------------------
# What `client.result` hears of a job that has no row of kept results.

KEEP_HINT = "declare it with @app.job(..., keep_result='1d')"


def keeps_result(location: JobLocation, kept: Mapping[str, float | None]) -> bool | None:
    """Whether a row of kept results is written when the job ends: True for a batch
    member or chain step, or a type whose handler in this app keeps results; False for a
    type whose handler here keeps none; None when this app has no handler of the job's
    type, or the type is not known. `kept`: seconds each type this app handles keeps its
    results (None: it keeps none)."""
    if location.last is not None and location.last.workflow is not None:
        return True
    if location.job_type is None or location.job_type not in kept:
        return None
    return kept[location.job_type] is not None


def result_error(location: JobLocation, kept: Mapping[str, float | None]
                 ) -> StreamJobsError | None:
    """What `client.result` raises for a job that has no row of kept results, from where
    the job is: how it ended (dead-lettered, cancelled, superseded); that it finished and
    no result of it is kept; or, not finished, that none will be (its type's handler in
    this app keeps none, and it is in no batch or chain). None while a result may still
    come, or while the job is not seen."""
    job_id, status, last = location.job_id, location.status, location.last
    job = f"Job {job_id}" + (f" ({location.job_type})" if location.job_type else "")
    if status == "dead_lettered":
        failure = last.failure if last is not None else None
        reason = (None if failure is None
                  else f"{failure.reason}: {failure.error_class}: {failure.message}")
        after = f" after attempt {location.attempt}" if location.attempt else ""
        because = f": {reason}" if reason else ""
        return JobFailed(f"{job} was dead-lettered{after}{because}.", job_id=job_id,
                         state="failed", reason=reason)
    if status in ("cancelled", "superseded"):
        return JobCancelled(location.summary(), job_id=job_id, state=status,
                            reason=location.detail or None)
    if status in ("done", "finished"):
        return ResultNotKept(f"{location.summary()} No result of it is kept: "
                             f"{_why_none(keeps_result(location, kept))}.")
    if status == "not_seen" or keeps_result(location, kept) is not False:
        return None
    return ResultNotKept(f"No result of job {job_id} will be kept: its type "
                         f"keeps no results ({KEEP_HINT}). {location.summary()}")


def _why_none(keeps: bool | None) -> str:
    if keeps is None:
        return f"its type keeps no results ({KEEP_HINT}), or its result was pruned"
    return "its result was pruned" if keeps else f"its type keeps no results ({KEEP_HINT})"


def not_in_time(job_id: str, waited_s: float, location: JobLocation | None,
                problem: str = "") -> ResultTimeout:
    """`client.result`'s `ResultTimeout` after `waited_s`, saying where the job is (from
    `location`; None when it could not be looked up, because of `problem`)."""
    head = f"Job {job_id} has no result after {round(waited_s, 1):g} s"
    if location is None:
        return ResultTimeout(f"{head}, and where it is could not be looked up ({problem}); "
                             f"`stream-jobs job {job_id}` tells.")
    if location.status == "not_seen":
        return ResultTimeout(f"{head}, and no record of it was found. {location.summary()}")
    return ResultTimeout(f"{head}: it has not finished yet. {location.summary()}")


# ---------------------------------------------------------------------------------------
# Looking.


async def locate_job(settings: Settings, types: Mapping[str, JobTypePolicy], job_id: str, *,
                     job_type: str | None = None,
                     max_records_per_topic: int = DEFAULT_MAX_RECORDS_PER_TOPIC) -> JobLocation:
    """Where `job_id` is: done, dead-lettered, retrying, scheduled, pending, finished,
    cancelled, superseded or not seen.

    `job_type` narrows the scan to one type (UnknownJobType if undeclared). Postgres
    being unreachable is a note, not an error: the topics still tell most of the story.
    """
    chosen = ([get_job_type(types, job_type)] if job_type is not None
              else [types[name] for name in sorted(types)])
    notes: list[str] = []
    stopped = await _stopped(settings, job_id, notes)
    if stopped is not None:
        return stopped
    row = await _dedup_row(settings, job_id, notes)
    result = await _result_row(settings, job_id, notes)
    if row is not None:
        row_type, attempt, finished_at = row
        return JobLocation(job_id, "done", row_type, attempt, finished_at, notes=tuple(notes),
                           result=result)

    created_ms = job_id_time_ms(job_id)
    since_ms = None if created_ms is None else created_ms - SCAN_SLACK_MS
    if since_ms is None:
        notes.append("The ID carries no time (not a UUIDv7), so topics were scanned from "
                     "their beginning.")
    sightings: list[Sighting] = []
    type_of: dict[str, str] = {}  # topic -> job type
    scanned, complete = 0, True
    async with open_reader(settings) as consumer, open_admin(settings) as admin:
        # Plan every scan before the first read: reading assigns partitions, after which
        # the consumer's metadata covers only the assigned topics.
        await consumer.refresh_metadata()
        plans = []
        for policy in chosen:
            for topic, role, name, group in topics_of(settings.topic_prefix, policy):
                if not consumer.partitions_for_topic(topic):
                    continue  # never applied: nothing to find there
                type_of[topic] = policy.job_type
                ranges, cut = capped(await scan.ranges(consumer, topic, from_time_ms=since_ms),
                                     max_records_per_topic)
                complete = complete and not cut
                committed = (await admin.committed_offsets(
                    group, [TopicPartition(topic, r.partition) for r in ranges])
                    if group is not None else {})
                plans.append((topic, role, name, ranges, committed))
        for topic, role, name, ranges, committed in plans:
            async for record in scan.scan(consumer, topic, ranges):
                scanned += 1
                seen = sighting_of(
                    record, job_id, role=role, name=name,
                    committed=committed.get(TopicPartition(topic, record.partition)))
                if seen is not None:
                    sightings.append(seen)
    status, last = judge(sightings)
    if status == "finished":
        # The rows were read before the scan, and a job whose worker committed since then
        # has left its lane with them. A worker commits a job's rows before its offset,
        # so rows read after the offsets show every job they count as finished.
        row = await _dedup_row(settings, job_id, notes)
        result = await _result_row(settings, job_id, notes)
        if row is not None:
            row_type, attempt, finished_at = row
            return JobLocation(job_id, "done", row_type, attempt, finished_at,
                               notes=tuple(notes), result=result)
    return JobLocation(job_id, status, type_of[last.topic] if last else None,
                       last.attempt if last else None, None, last, tuple(sightings), scanned,
                       complete, tuple(notes), result=result)


def topics_of(prefix: str, policy: JobTypePolicy
            ) -> list[tuple[str, TopicRole, str, str | None]]:
    """(topic, role, lane/tier/"dlq", the group whose commits mark progress there)."""
    work, relay = worker_group(prefix, policy.job_type), relay_group(prefix, policy.job_type)
    return [*((t, "lane", lane, work) for lane, t in policy.lane_topics(prefix).items()),
            *((t, "tier", tier, relay) for tier, t in policy.tier_topics(prefix).items()),
            (policy.dlq_topic(prefix), "dlq", "dlq", None)]


async def _result_row(settings: Settings, job_id: str, notes: list[str]
                      ) -> StoredResult | None:
    reader = ResultReader(settings, pool_size=1)
    try:
        return await asyncio.wait_for(reader.fetch(job_id), 15)
    except ConfigError:
        return None  # not migrated for results: the dedup row's note says what to do
    except (DatabaseUnavailable, TimeoutError) as exc:
        notes.append(f"The results table was not checked ({exc}).")
    finally:
        await reader.close()
    return None


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


async def _stopped(settings: Settings, job_id: str, notes: list[str]) -> JobLocation | None:
    """The job's location if a cancel or a newer debounced job stopped it, else None."""
    cancels, keys = CancelStore(settings), KeyStore(settings)
    try:
        cancelled = await asyncio.wait_for(cancels.cancelled(job_id), 15)
        if cancelled is not None:
            return cancelled_location(job_id, *cancelled, notes)
        by = await asyncio.wait_for(keys.superseded_by(job_id), 15)
        if by is not None:
            return superseded_location(job_id, by, notes)
    except (StreamJobsError, TimeoutError) as exc:
        notes.append(f"Cancels were not checked ({exc}).")
    finally:
        await cancels.close()
        await keys.close()
    return None


# The dedup table could not be read: told in a note, the lookup goes on without it.
_NOT_CHECKED: tuple[type[BaseException], ...] = (DatabaseUnavailable, TimeoutError,
                                                 *DRIVER_ERRORS)


async def _dedup_row(settings: Settings, job_id: str, notes: list[str]
                     ) -> tuple[str, int, datetime] | None:
    store = DedupStore(settings)
    try:
        return await asyncio.wait_for(store.finished(job_id), 15)
    except MISSING_TABLE:
        notes.append(f"There is no dedup table in schema {settings.database_schema!r} "
                     "(`stream-jobs db migrate` creates it), so done jobs cannot be told.")
    except _NOT_CHECKED as exc:
        notes.append(f"The dedup table was not checked ({exc}); a done job shows as "
                     "finished or not seen.")
    finally:
        await store.close()
    return None


__all__ = ["JobLocation", "Sighting", "Status", "cancelled_location", "capped", "judge",
           "keeps_result", "locate_job", "not_in_time", "result_error", "sighting_of",
           "superseded_location", "topics_of"]
