"""Gather a run's evidence once it has drained: effect rows from Postgres, delivery logs
from the workers' folder, and from Kafka the lane, tier and DLQ records and the groups'
committed and end offsets."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import asyncpg

from ops.chaos.app import EFFECTS_TABLE
from ops.chaos.evidence import Delivery, Effect, Forwarded, LaneRecord
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.admin import admin_client
from stream_jobs.kafka.consumer import open_reader
from stream_jobs.record import HEADER_ATTEMPT, HEADER_JOB_ID, Record
from stream_jobs.settings import Settings

SCHEMA_SQL = (
    f"CREATE TABLE {EFFECTS_TABLE} (job_id text NOT NULL, pid int NOT NULL, part int NOT NULL, "
    "pos bigint NOT NULL, attempt int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())"
)


async def effects(settings: Settings) -> list[Effect]:
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": settings.database_schema})
    try:
        rows = await conn.fetch(f"SELECT job_id, pid, part, pos, attempt, "
                                f"extract(epoch FROM at)::float8 AS at FROM {EFFECTS_TABLE}")
    finally:
        await conn.close()
    return [Effect(r["job_id"], r["pid"], r["part"], r["pos"], r["attempt"], r["at"])
            for r in rows]


def deliveries(folder: Path) -> list[Delivery]:
    """Every line of every worker's delivery log. A process killed mid-write can leave a
    torn last line; it is skipped (that handler call had not reached its effect)."""
    found: list[Delivery] = []
    for path in sorted(folder.glob("*.log")):
        pid = int(path.stem)
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split()
            if len(parts) != 5:
                continue
            job_id, attempt, partition, offset, at = parts
            found.append(Delivery(job_id, int(attempt), int(partition), int(offset), pid,
                                  float(at)))
    return found


def _header(headers: Sequence[tuple[str, bytes]], name: str) -> bytes | None:
    value: bytes | None = None
    for key, raw in headers or ():
        if key == name:
            value = raw
    return value


async def read_topic(settings: Settings, topic: str) -> list[Record]:
    """Every record of `topic` up to its end offsets now."""
    records: list[Record] = []
    async with open_reader(settings, max_partition_fetch_bytes=1024 * 1024) as consumer:
        parts = sorted(await consumer.cluster_partitions(topic) or [])
        tps = [TopicPartition(topic, p) for p in parts]
        if not tps:
            return records
        ends = await consumer.end_offsets(tps)
        todo = {tp for tp in tps if ends[tp] > 0}
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        while todo:
            batches = await consumer.getmany(*todo, timeout_ms=2_000, max_records=5_000)
            for tp, batch in batches.items():
                for record in batch:
                    if record.offset < ends[tp]:
                        records.append(record)
                if await consumer.position(tp) >= ends[tp]:
                    todo.discard(tp)
    return records


async def _jobs_of(settings: Settings, topic: str) -> list[tuple[Record, str, int]]:
    """(record, job ID, attempt) for each record of `topic` that carries a job ID."""
    found = []
    for r in await read_topic(settings, topic):
        job_id = _header(r.headers, HEADER_JOB_ID)
        attempt = _header(r.headers, HEADER_ATTEMPT)
        if job_id is not None:
            found.append((r, job_id.decode(), int(attempt) if attempt else 1))
    return found


async def lane_records(settings: Settings, topic: str) -> list[LaneRecord]:
    return [LaneRecord(r.partition, r.offset, job_id, attempt)
            for r, job_id, attempt in await _jobs_of(settings, topic)]


async def forwarded(settings: Settings, topic: str, *, dead_letter: bool) -> list[Forwarded]:
    return [Forwarded(job_id, attempt, r.timestamp / 1000, dead_letter)
            for r, job_id, attempt in await _jobs_of(settings, topic)]


async def offsets(settings: Settings, group: str | None, topics: list[str]
                  ) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
    """(committed, end) offsets of `group` on every partition of `topics` (no committed
    ones without a group)."""
    committed: dict[tuple[str, int], int] = {}
    if group is not None:
        async with admin_client(settings) as admin:
            listed = await admin.list_consumer_group_offsets(group)
        committed = {(tp.topic, tp.partition): meta.offset for tp, meta in listed.items()
                     if tp.topic in topics and meta.offset >= 0}
    ends: dict[tuple[str, int], int] = {}
    async with open_reader(settings) as consumer:
        tps = [TopicPartition(t, p) for t in topics
               for p in sorted(await consumer.cluster_partitions(t) or [])]
        for tp, end in (await consumer.end_offsets(tps)).items():
            ends[(tp.topic, tp.partition)] = end
    return committed, ends
