"""`stream-jobs cancel TYPE JOB_ID` and `POST /jobs/{id}/cancel`: cancel as an operator does.

Unlike `JobClient.cancel` (which trusts the caller with the ID), this looks the job up
first (`stream_jobs.lookup`): an ID that is in none of the type's topics and has no
dedup row is refused (`JobNotFound`); a job that reached its outcome, including one that
finished without `ctx.once()` (the dedup table cannot know it ran), is left alone and the
answer says so; only a job still waiting or running gets the cancel, which then decides
in one transaction (`stream_jobs.cancels.store`).
"""

from __future__ import annotations

from collections.abc import Mapping

from stream_jobs.cancels.rules import Cancellation, verdict_of
from stream_jobs.cancels.store import CancelStore
from stream_jobs.errors import ConfigError, JobNotFound
from stream_jobs.job_ids import MAX_JOB_ID_CHARS, key_problem
from stream_jobs.job_types import JobTypePolicy
from stream_jobs.lookup import DEFAULT_MAX_RECORDS_PER_TOPIC, locate_job
from stream_jobs.plurals import counted
from stream_jobs.settings import Settings


async def cancel_job(settings: Settings, types: Mapping[str, JobTypePolicy], job_id: str, *,
                     job_type: str | None = None, reason: str | None = None,
                     max_records_per_topic: int = DEFAULT_MAX_RECORDS_PER_TOPIC
                     ) -> Cancellation:
    """Cancel `job_id` unless it is unknown (`JobNotFound`) or finished (said so); an ID no
    job can have is refused first (`ConfigError`), without a scan or a query."""
    _check_id(job_id)
    found = await locate_job(settings, types, job_id, job_type=job_type,
                             max_records_per_topic=max_records_per_topic)
    if found.status == "not_seen":
        where = f"the topics of {job_type}" if job_type else "the declared types' topics"
        cap = "" if found.complete else "; the scan stopped at its cap, so it may be further on"
        topics = f"is in none of {where} ({counted(found.scanned_records, 'record')} read{cap})"
        if found.notes:  # what the lookup could not check (Postgres away): said, not guessed
            raise JobNotFound(f"No job {job_id} was found: it {topics}. " + " ".join(found.notes))
        raise JobNotFound(f"No job {job_id} was found: it has no dedup row and {topics}.")
    verdict = verdict_of(found.status)
    # Done and cancelled come from Postgres: the cancel's transaction answers those itself,
    # with the details. Finished, dead-lettered and superseded only Kafka could tell.
    if verdict is not None and found.status not in ("done", "cancelled"):
        return Cancellation(job_id, verdict, found.job_type,
                            detail=f"(Lookup: {found.summary()})")
    store = CancelStore(settings)
    try:
        return await store.cancel(job_id, job_type=found.job_type or job_type, reason=reason)
    finally:
        await store.close()


def _check_id(job_id: str) -> None:
    """Refuse an ID the decoder would dead-letter (so no job waits under it): empty, too
    long, not UTF-8 (non-UTF-8 bytes on a command line), or with a control character. It
    is not quoted back: it could forge a terminal's lines, or be a megabyte long. A '/' is
    let through: another producer's job may have one."""
    if not job_id or len(job_id) > MAX_JOB_ID_CHARS:
        problem: str | None = f"A job ID is 1 to {MAX_JOB_ID_CHARS} characters."
    else:
        problem = key_problem(job_id, "job ID")
    if problem is not None:
        raise ConfigError(f"No job can have the ID given, so nothing was cancelled: {problem}")


__all__ = ["cancel_job"]
