"""`stream-jobs stats`: one read of Kafka, turned into every chosen type's stats.

Everything about the types comes from Kafka, so they need no database and join no
consumer group; the outbox's depth is one question to Postgres beside it (shown as
unknown, with the reason, when Postgres does not answer).
`read` asks every offset first, at once (one metadata request, then the beginning and
end offsets of all topics, `P._stats` and `P._control` included, the report window's
start, and one committed-offsets request per group, concurrently), and only then reads:
one record per lagging lane partition for its timestamp, the `P._stats` reports of the
window and the throttle's overrides. The arithmetic from that reading to a type's stats
is `stream_jobs.tools.type_stats`, pure.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from stream_jobs import clock
from stream_jobs.dlq.census import DlqCensus
from stream_jobs.dlq.tally import DlqCounts
from stream_jobs.errors import StreamJobsError
from stream_jobs.job_types import JobTypePolicy, get_job_type
from stream_jobs.kafka import TopicPartition, scan
from stream_jobs.kafka.admin import Admin, open_admin
from stream_jobs.kafka.consumer import Consumer, open_reader
from stream_jobs.naming import (
    control_topic,
    relay_group,
    shadow_group,
    stats_topic,
    worker_group,
)
from stream_jobs.outbox.depth import OutboxDepth, read_depth
from stream_jobs.runtime.throttle import RateOverride, apply_record
from stream_jobs.settings import Settings
from stream_jobs.tools.type_stats import (
    ALIVE_INTERVALS,
    DEFAULT_REPORT_INTERVAL_S,
    DEFAULT_WINDOW_S,
    StatsReading,
    StatsSnapshot,
    backlog,
    type_stats,
    unfinished_from,
)
from stream_jobs.tools.worker_reports import scan_reports

# Reading one record for its timestamp must not fetch megabytes of backlog behind it.
_PEEK_FETCH_BYTES = 64 * 1024


async def collect(settings: Settings, types: Mapping[str, JobTypePolicy], *,
                  job_type: str | None = None, per_partition: bool = False,
                  window_s: float = DEFAULT_WINDOW_S, since_ms: int | None = None,
                  report_interval_s: float = DEFAULT_REPORT_INTERVAL_S,
                  census: DlqCensus | None = None) -> StatsSnapshot:
    """Stats of every declared type, or of `job_type` (UnknownJobType if undeclared).

    The rates cover the last `window_s` seconds before the reading or, given `since_ms`,
    everything from that moment to the reading, however long the reading itself takes.
    Topics that do not exist are reported as missing (run `stream-jobs topics apply`),
    not as an error. Cost: see `read`; a `census` kept across calls reads only the
    letters dead-lettered since the last call.
    """
    chosen = ([get_job_type(types, job_type)] if job_type is not None
              else [types[name] for name in sorted(types)])
    if since_ms is not None:
        window_s = max(0.0, (clock.now_ms() - since_ms) / 1000)
    reading, (outbox, problem) = await asyncio.gather(
        read(settings, chosen, lookback_s=window_s + (ALIVE_INTERVALS + 1) * report_interval_s,
             census=census),
        _outbox(settings))
    if since_ms is not None:
        window_s = max(window_s, (reading.at_ms - since_ms) / 1000)
    prefix = settings.topic_prefix
    return StatsSnapshot(reading.at_ms, prefix, window_s, tuple(
        type_stats(policy, reading, prefix=prefix, window_s=window_s,
                   report_interval_s=report_interval_s, per_partition=per_partition)
        for policy in chosen), outbox=outbox, outbox_problem=problem)


async def _outbox(settings: Settings) -> tuple[OutboxDepth | None, str | None]:
    """The outbox's depth, or why it is unknown: Kafka's stats still show without it."""
    try:
        return await read_depth(settings), None
    except StreamJobsError as exc:
        return None, str(exc)


async def read(settings: Settings, chosen: Sequence[JobTypePolicy], *,
               lookback_s: float, census: DlqCensus | None = None) -> StatsReading:
    """Offsets of the chosen types' topics and their groups' commits, the timestamps of
    the lagging lane partitions' oldest records, the reports of the last `lookback_s`,
    the throttle's overrides and the DLQs' counts."""
    async with _peeker(settings) as consumer, open_admin(settings) as admin:
        return await read_with(consumer, admin, settings.topic_prefix, chosen,
                               lookback_s=lookback_s,
                               timeout_ms=settings.kafka_request_timeout_ms, census=census)


async def read_with(consumer: Consumer, admin: Admin, prefix: str,
                    chosen: Sequence[JobTypePolicy], *, lookback_s: float,
                    timeout_ms: int, census: DlqCensus | None = None) -> StatsReading:
    """`read` with a group-less `consumer` and an `admin` of the caller's.

    Every offset question comes before the first read, asked for all topics at once:
    reading assigns partitions, after which the consumer's metadata covers only those,
    and each question about another topic waited for a metadata round (half a second to
    a second each, most of what `stream-jobs stats` took on a near-empty stack). The
    groups' commits are asked concurrently, beside the offsets.
    """
    lanes = {p.job_type: list(p.worker_topics(prefix).values()) for p in chosen}
    tiers = {p.job_type: list(p.tier_topics(prefix).values()) for p in chosen}
    names = [t for p in chosen for t in (*lanes[p.job_type], *tiers[p.job_type],
                                         p.dlq_topic(prefix))]
    reports_topic, controls_topic = stats_topic(prefix), control_topic(prefix)
    found = await _partitions(consumer, [*names, reports_topic, controls_topic])
    # Written by workers and operators, not by `topics apply`: either may be missing.
    report_tps = found.pop(reports_topic, [])
    control_tps = found.pop(controls_topic, [])
    tps = found
    flat = [tp for parts in tps.values() for tp in parts]
    asked = [*flat, *report_tps, *control_tps]
    since_ms = clock.now_ms() - int(lookback_s * 1000)
    beginnings, ends, since, (committed, shadowed) = await asyncio.gather(
        consumer.beginning_offsets(asked) if asked else _nothing(),
        consumer.end_offsets(asked) if asked else _nothing(),
        consumer.offsets_for_times({tp: since_ms for tp in report_tps}) if report_tps
        else _nothing(),
        _commits(admin, prefix, chosen, lanes, tiers, tps))
    report_ranges = [scan.PartitionRange(tp.partition, at if (at := since.get(tp)) is not None
                                         else ends[tp], ends[tp]) for tp in report_tps]
    control_ranges = [scan.PartitionRange(tp.partition, beginnings[tp], ends[tp])
                      for tp in control_tps]
    # Reading from here on: no offset question below this line.
    lane_tps = [tp for p in chosen for t in lanes[p.job_type] for tp in tps.get(t, [])]
    heads = {tp: unfinished_from(beginnings[tp], committed.get(tp)) for tp in lane_tps
             if backlog(beginnings[tp], ends[tp], committed.get(tp)) > 0}
    stamps = await _timestamps_at(consumer, heads, timeout_ms)
    at_ms = clock.now_ms()
    reports, shadow_reports = await scan_reports(consumer, reports_topic, report_ranges)
    overrides: dict[str, RateOverride] = {}
    async for record in scan.scan(consumer, controls_topic, control_ranges):
        apply_record(overrides, record.key, record.value)
    dlqs = await _count_dlqs(consumer, prefix, chosen, tps, beginnings, ends,
                             census if census is not None else DlqCensus())
    return StatsReading(at_ms, tps, beginnings, ends, committed, shadowed, stamps, reports,
                        shadow_reports, overrides, dlqs)


async def _count_dlqs(consumer: Consumer, prefix: str, chosen: Sequence[JobTypePolicy],
                      tps: Mapping[str, list[TopicPartition]],
                      beginnings: Mapping[TopicPartition, int],
                      ends: Mapping[TopicPartition, int],
                      census: DlqCensus) -> dict[str, DlqCounts]:
    """Jobs and letters of every chosen type's DLQ that exists, up to the ends asked."""
    counts = {}
    for policy in chosen:
        topic = policy.dlq_topic(prefix)
        if topic in tps:
            spans = [scan.PartitionRange(tp.partition, beginnings[tp], ends[tp])
                     for tp in tps[topic]]
            counts[topic] = await census.count(consumer, topic, policy.job_type, spans)
    return counts


async def _nothing() -> dict[TopicPartition, Any]:
    return {}


async def _commits(admin: Admin, prefix: str, chosen: Sequence[JobTypePolicy],
                   lanes: Mapping[str, list[str]], tiers: Mapping[str, list[str]],
                   tps: Mapping[str, list[TopicPartition]]
                   ) -> tuple[dict[TopicPartition, int | None], dict[TopicPartition, int | None]]:
    """(worker group on the lanes and relay group on the tiers, shadow group on the
    lanes), every group asked at once."""
    questions = []
    for policy in chosen:
        name = policy.job_type
        lane_parts = [tp for t in lanes[name] for tp in tps.get(t, [])]
        tier_parts = [tp for t in tiers[name] for tp in tps.get(t, [])]
        questions += [(False, worker_group(prefix, name), lane_parts),
                      (True, shadow_group(prefix, name), lane_parts),
                      (False, relay_group(prefix, name), tier_parts)]
    answers = await asyncio.gather(*(admin.committed_offsets(group, parts)
                                     for _, group, parts in questions))
    committed: dict[TopicPartition, int | None] = {}
    shadowed: dict[TopicPartition, int | None] = {}
    for (shadow, _, _), answer in zip(questions, answers, strict=True):
        (shadowed if shadow else committed).update(answer)
    return committed, shadowed


def _peeker(settings: Settings) -> AbstractAsyncContextManager[Consumer]:
    """A group-less consumer with small fetches: reads single records, commits nothing."""
    return open_reader(settings, client_id="stream-jobs-stats",
                       max_partition_fetch_bytes=_PEEK_FETCH_BYTES,
                       fetch_max_bytes=16 * _PEEK_FETCH_BYTES)


async def _partitions(consumer: Consumer, topics: Sequence[str]
                      ) -> dict[str, list[TopicPartition]]:
    """Partitions of the topics that exist."""
    if any(not consumer.partitions_for_topic(t) for t in topics):
        await consumer.refresh_metadata()  # new topics are learnt lazily
    found: dict[str, list[TopicPartition]] = {}
    for topic in topics:
        parts = consumer.partitions_for_topic(topic)
        if parts:
            found[topic] = [TopicPartition(topic, p) for p in sorted(parts)]
    return found


async def _timestamps_at(consumer: Consumer, heads: Mapping[TopicPartition, int],
                         timeout_ms: int) -> dict[TopicPartition, int]:
    """The timestamp of the record at each given offset (or the first one after it).

    Partitions not answered within `timeout_ms` are left out (their age is unknown).
    """
    if not heads:
        return {}
    consumer.assign(list(heads))
    for tp, offset in heads.items():
        consumer.seek(tp, offset)
    found: dict[TopicPartition, int] = {}
    deadline = time.monotonic() + timeout_ms / 1000
    while len(found) < len(heads) and time.monotonic() < deadline:
        waiting = [tp for tp in heads if tp not in found]
        batches = await consumer.getmany(*waiting, timeout_ms=200)
        for tp, records in batches.items():
            if records and tp not in found:
                found[tp] = int(records[0].timestamp)
                consumer.pause(tp)  # one record is all we wanted: stop prefetching
    return found


__all__ = ["collect", "read", "read_with"]
