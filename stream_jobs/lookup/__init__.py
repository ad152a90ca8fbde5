"""`stream-jobs job JOB_ID`: what happened to one job.

In order: the cancels (a cancelled job, and a debounced job a newer one superseded, is
that whatever Kafka still holds), the dedup table (a row means the job's `ctx.once()`
transaction committed: done) and its row of `stream_jobs_results` if it keeps one (its
result, or how it ended without one: docs/results.md), then a bounded scan of the type's
lanes, delay tiers and DLQ for records carrying the job ID. The latest sighting tells
where the job is: dead-lettered, waiting in a tier (for a retry, or, never having failed,
for the delay it was enqueued with), waiting (or running) in a lane, or finished in its
lane without a dedup row. A waiting job that a live worker's report lists in a handler is
running (`JobLocation.running`): `stream_jobs.tools.job_status` asks the reports, which
this layer does not read.

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

from stream_jobs.lookup.answers import KEEP_HINT, keeps_result, not_in_time, result_error
from stream_jobs.lookup.locate import DEFAULT_MAX_RECORDS_PER_TOPIC, capped, locate_job, topics_of
from stream_jobs.lookup.location import (
    JobLocation,
    RunningOn,
    Sighting,
    Status,
    cancelled_location,
    headers_of,
    judge,
    number_of,
    sighting_from,
    sighting_of,
    superseded_location,
    tier_state,
)

__all__ = ["DEFAULT_MAX_RECORDS_PER_TOPIC", "KEEP_HINT", "JobLocation", "RunningOn", "Sighting",
           "Status", "cancelled_location", "capped", "headers_of", "judge", "keeps_result",
           "locate_job", "not_in_time", "number_of", "result_error", "sighting_from",
           "sighting_of", "superseded_location", "tier_state", "topics_of"]
