"""`stream-jobs retry-now ID`, `POST /jobs/{id}/retry-now` and the job page's button: a job
waiting in a delay tier runs now, once (stream_jobs/retry_now/ says how).

The job is looked up (`stream_jobs.lookup`); only one whose latest record waits in a delay
tier, not yet passed by the relay, is released (`NotInDelayTier` else, `JobNotFound` for
an unknown ID). That tier record is read back whole, and a copy of it (same job ID,
attempt and headers, its due time cleared, marked `sj-released-early`) is written to the
job's lane inside the transaction that records the attempt as released early: the copy
acknowledged, the row commits; the produce failing, the row rolls back and the job waits
as before.
"""

from __future__ import annotations

from collections.abc import Mapping

from stream_jobs.errors import JobNotFound, NotInDelayTier
from stream_jobs.job_types import JobTypePolicy, get_job_type
from stream_jobs.kafka import scan
from stream_jobs.kafka.consumer import open_reader
from stream_jobs.kafka.producer import JobProducer
from stream_jobs.lookup import DEFAULT_MAX_RECORDS_PER_TOPIC, Sighting, locate_job
from stream_jobs.naming import lane_topic
from stream_jobs.plurals import counted
from stream_jobs.record import JobRecord, decode_record
from stream_jobs.retry_now.rules import EARLY_MARK, EarlyRelease, refusal
from stream_jobs.retry_now.store import ReleaseStore
from stream_jobs.settings import Settings


async def retry_now(settings: Settings, types: Mapping[str, JobTypePolicy], job_id: str, *,
                    job_type: str | None = None,
                    max_records_per_topic: int = DEFAULT_MAX_RECORDS_PER_TOPIC
                    ) -> EarlyRelease:
    """Release `job_id` from its delay tier now; see the module's docstring."""
    found = await locate_job(settings, types, job_id, job_type=job_type,
                             max_records_per_topic=max_records_per_topic)
    if found.status == "not_seen":
        where = f"the topics of {job_type}" if job_type else "the declared types' topics"
        cap = "" if found.complete else "; the scan stopped at its cap"
        raise JobNotFound(f"No job {job_id} was found: it has no dedup row and is in none "
                          f"of {where} ({counted(found.scanned_records, 'record')} read{cap}).")
    why = refusal(job_id, found.status)
    last = found.last
    if why is not None or last is None or found.job_type is None:
        raise NotInDelayTier(why or f"Job {job_id} is not waiting in a delay tier.")
    policy = get_job_type(types, found.job_type)
    job = await _tier_record(settings, policy, last)
    lane = job.lane if job.lane in policy.priorities else "default"
    topic = lane_topic(settings.topic_prefix, policy.job_type, lane)
    copy = job.with_(not_before_ms=None)
    store = ReleaseStore(settings)
    try:
        # The producer connected before the transaction starts: the row is held open for
        # the write and its acknowledgement only.
        async with JobProducer(settings) as producer, \
                store.releasing(policy.job_type, (job.job_id, job.requeues, job.attempt)):
            written = await producer.send_raw(topic, copy.key, copy.payload,
                                              [*copy.headers(), EARLY_MARK])
    finally:
        await store.close()
    return EarlyRelease(job.job_id, policy.job_type, job.attempt, last.name, job.not_before_ms,
                        topic, written.partition, written.offset)


async def _tier_record(settings: Settings, policy: JobTypePolicy, seen: Sighting) -> JobRecord:
    """The job in the tier record the lookup saw, read back whole."""
    async with open_reader(settings) as consumer:
        await consumer.refresh_metadata()
        wanted = [scan.PartitionRange(seen.partition, seen.offset, seen.offset + 1)]
        async for record in scan.scan(consumer, seen.topic, wanted):
            return decode_record(key=record.key, value=record.value, headers=record.headers,
                                 expected_type=policy.job_type,
                                 max_payload_bytes=policy.payload_limit(settings))
    raise NotInDelayTier(f"The tier record {seen.topic} partition {seen.partition} offset "
                         f"{seen.offset} could not be read back (removed by retention?).")


__all__ = ["retry_now"]
