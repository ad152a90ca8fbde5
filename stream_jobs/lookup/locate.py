"""The lookup itself: the cancels, the dedup row and the kept result in Postgres, then
a bounded scan of the type's lanes, delay tiers and DLQ (see `stream_jobs.lookup`)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import datetime

from stream_jobs.cancels.store import CancelStore
from stream_jobs.dedup.store import DedupStore
from stream_jobs.errors import ConfigError, DatabaseUnavailable, StreamJobsError
from stream_jobs.job_ids import job_id_time_ms
from stream_jobs.job_types import JobTypePolicy, get_job_type
from stream_jobs.kafka import TopicPartition, scan
from stream_jobs.kafka.admin import open_admin
from stream_jobs.kafka.consumer import open_reader
from stream_jobs.lookup import location as locations
from stream_jobs.lookup.location import JobLocation, Sighting, judge, sighting_of
from stream_jobs.naming import TopicRole, overflow_topic, relay_group, worker_group
from stream_jobs.postgres.pool import DRIVER_ERRORS, MISSING_TABLE
from stream_jobs.results.rules import StoredResult
from stream_jobs.results.store import ResultReader
from stream_jobs.settings import Settings
from stream_jobs.unique.release import KeyStore

DEFAULT_MAX_RECORDS_PER_TOPIC = 100_000
# Producers', workers' and brokers' clocks disagree a little; look this much earlier.
SCAN_SLACK_MS = 60_000

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


async def locate_job(settings: Settings, types: Mapping[str, JobTypePolicy], job_id: str, *,
                     job_type: str | None = None,
                     max_records_per_topic: int = DEFAULT_MAX_RECORDS_PER_TOPIC,
                     records_of_done: bool = False) -> JobLocation:
    """Where `job_id` is: done, dead-lettered, retrying, scheduled, pending, finished,
    cancelled, superseded or not seen.

    `job_type` narrows the scan to one type (UnknownJobType if undeclared). Postgres
    being unreachable is a note, not an error: the topics still tell most of the story.
    A done job's dedup row says enough, so its topics are read only with
    `records_of_done` (what a person looks at: its records and its trace ID).
    """
    chosen = ([get_job_type(types, job_type)] if job_type is not None
              else [types[name] for name in sorted(types)])
    notes: list[str] = []
    stopped = await _stopped(settings, job_id, notes)
    if stopped is not None:
        return stopped
    unread: set[str] = set()  # the tables Postgres did not let us read
    row = await _dedup_row(settings, job_id, notes, unread)
    result = await _result_row(settings, job_id, notes, unread)
    if row is not None:
        row_type, attempt, finished_at = row
        if records_of_done and row_type in types:
            sightings, _, scanned, complete = await _scan(
                settings, [types[row_type]], job_id, _since_ms(job_id), max_records_per_topic)
            return JobLocation(job_id, "done", row_type, attempt, finished_at, None,
                               tuple(sightings), scanned, complete, tuple(notes),
                               result=result, rows_read=not unread)
        return JobLocation(job_id, "done", row_type, attempt, finished_at, notes=tuple(notes),
                           result=result, rows_read=not unread)

    since_ms = _since_ms(job_id)
    if since_ms is None:
        notes.append("The ID carries no time (not a UUIDv7), so topics were scanned from "
                     "their beginning.")
    found = await _scan(settings, chosen, job_id, since_ms, max_records_per_topic)
    sightings, type_of, scanned, complete = found
    status, last = judge(sightings)
    if status == "finished":
        # The rows were read before the scan, and a job whose worker committed since then
        # has left its lane with them. A worker commits a job's rows before its offset,
        # so rows read after the offsets show every job they count as finished.
        unread.clear()
        row = await _dedup_row(settings, job_id, notes, unread)
        result = await _result_row(settings, job_id, notes, unread)
        if row is not None:
            row_type, attempt, finished_at = row
            return JobLocation(job_id, "done", row_type, attempt, finished_at,
                               notes=tuple(notes), result=result, rows_read=not unread)
    return JobLocation(job_id, status, type_of[last.topic] if last else None,
                       last.attempt if last else None, None, last, tuple(sightings), scanned,
                       complete, tuple(notes), result=result, rows_read=not unread)


def _since_ms(job_id: str) -> int | None:
    """Where a scan for `job_id` starts: a little before its UUIDv7's time, if it has one."""
    created_ms = job_id_time_ms(job_id)
    return None if created_ms is None else created_ms - SCAN_SLACK_MS


async def _scan(settings: Settings, chosen: Sequence[JobTypePolicy], job_id: str,
                since_ms: int | None, max_records_per_topic: int
                ) -> tuple[list[Sighting], dict[str, str], int, bool]:
    """The records of `chosen` types' topics that carry `job_id`: the sightings, each
    topic's type, how many records were read, and whether no scan stopped at its cap."""
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
    return sightings, type_of, scanned, complete

def topics_of(prefix: str, policy: JobTypePolicy
            ) -> list[tuple[str, TopicRole, str, str | None]]:
    """(topic, role, lane/tier/"overflow"/"dlq", the group whose commits mark progress there)."""
    work, relay = worker_group(prefix, policy.job_type), relay_group(prefix, policy.job_type)
    # A noisy tenant's job moved on from its lane: read by the same group (docs/fairness.md).
    overflow: list[tuple[str, TopicRole, str, str | None]] = (
        [(overflow_topic(prefix, policy.job_type), "overflow", "overflow", work)]
        if policy.has_overflow else [])
    return [*((t, "lane", lane, work) for lane, t in policy.lane_topics(prefix).items()),
            *overflow,
            *((t, "tier", tier, relay) for tier, t in policy.tier_topics(prefix).items()),
            (policy.dlq_topic(prefix), "dlq", "dlq", None)]


async def _result_row(settings: Settings, job_id: str, notes: list[str], unread: set[str]
                      ) -> StoredResult | None:
    reader = ResultReader(settings, pool_size=1)
    try:
        return await asyncio.wait_for(reader.fetch(job_id), 15)
    except ConfigError:
        return None  # not migrated for results: the dedup row's note says what to do
    except (DatabaseUnavailable, TimeoutError) as exc:
        notes.append(f"The results table was not checked ({exc}).")
        unread.add("results")
    finally:
        await reader.close()
    return None


async def _stopped(settings: Settings, job_id: str, notes: list[str]) -> JobLocation | None:
    """The job's location if a cancel or a newer debounced job stopped it, else None."""
    cancels, keys = CancelStore(settings), KeyStore(settings)
    try:
        cancelled = await asyncio.wait_for(cancels.cancelled(job_id), 15)
        if cancelled is not None:
            return locations.cancelled_location(job_id, *cancelled, notes)
        by = await asyncio.wait_for(keys.superseded_by(job_id), 15)
        if by is not None:
            return locations.superseded_location(job_id, by, notes)
    except (StreamJobsError, TimeoutError) as exc:
        notes.append(f"Cancels were not checked ({exc}).")
    finally:
        await cancels.close()
        await keys.close()
    return None


# The dedup table could not be read: told in a note, the lookup goes on without it.
_NOT_CHECKED: tuple[type[BaseException], ...] = (DatabaseUnavailable, TimeoutError,
                                                 *DRIVER_ERRORS)


async def _dedup_row(settings: Settings, job_id: str, notes: list[str], unread: set[str]
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
        unread.add("dedup")
    finally:
        await store.close()
    return None
