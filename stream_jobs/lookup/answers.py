"""What `client.result` hears of a job that has no row of kept results, from where
the job is (`stream_jobs.lookup.location`): how it ended, that no result of it will come,
or, after its timeout, where it is. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from stream_jobs.errors import (
    JobCancelled,
    JobFailed,
    ResultNotKept,
    ResultTimeout,
    StreamJobsError,
)
from stream_jobs.lookup.location import JobLocation

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
    come, while the job is not seen, or while Postgres did not answer for its rows (a job
    that looks finished without them may have both)."""
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
        if not location.rows_read:
            return None
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
    if not location.rows_read:
        return ResultTimeout(f"{head}, and Postgres did not answer for its dedup row and "
                             f"result ({' '.join(location.notes)}). {location.summary()}")
    return ResultTimeout(f"{head}: it has not finished yet. {location.summary()}")
